"""Our own GPU kernels (Triton), each an autograd Function in its own file beside its reference test:

    attention   the one attention equation with the position-only logit terms read inside the tile
                (FlashAttention-2's tiling, Dao 2023), table gradients without atomics
    rotary      RoFormer's rotation of queries and keys, both in one kernel, forward and backward

Written here rather than taken from a library because no public kernel trains a learned relative bias at
flash speed with deterministic gradients (FlashAttention has no learned bias; FlexAttention's table
gradients are atomic adds). Triton is imported only when a kernel is first used, so `import dietpe` works
without it: torch's CUDA wheels ship it, and on the CPU it is a test dependency, whose interpreter
(`TRITON_INTERPRET=1`, set before the first kernel is used) runs the kernels on CPU tensors.
"""

from __future__ import annotations

import os


_PROBLEM: list[str | None] = []  # found once; a list, not functools.cache, which dynamo warns of when tracing


def triton_problem() -> str | None:
    """Why the kernels cannot run in this environment (Triton missing, or too old for `tl.gather`), or None."""
    if not _PROBLEM:
        _PROBLEM.append(_find_problem())
    return _PROBLEM[0]


def _find_problem() -> str | None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return "Triton is not installed (it comes with torch's CUDA wheels; on the CPU: pip install triton)"
    if not hasattr(tl, "gather"):
        return f"Triton {triton.__version__} has no tl.gather (Triton >= 3.2 has)"
    return None


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (on CPU tensors): TRITON_INTERPRET=1."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def device_problem(t) -> str | None:
    """Why the kernels cannot run on `t`'s device, or None: CUDA, or the CPU under Triton's interpreter."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and interpreting()):
        return triton_problem()
    return f"it runs on CUDA (or on the CPU under TRITON_INTERPRET=1), not on {t.device.type}"
