"""Peak memory of a step, modelled on the `meta` device: no GPU and no arithmetic, seconds at any length.

The issue a position method raises at long lengths is memory: a logit bias held as an (L, L) tensor is 3 GiB
per layer at 8,192 tokens for 12 heads in float32, where FlashAttention keeps O(L) (Dao 2023). Whether a
method's path holds one is a property of its shapes, not of its values, so it is modelled here where no GPU is:
the model is built on `meta`, one step runs as shapes only, and every tensor an op creates is counted while it
is alive. The step's peak is the largest sum of live bytes the step created, which is what the benchmark
measures on a GPU (`torch.cuda.max_memory_allocated` during the step less the memory before it: activations,
gradients, temporaries), without the caching allocator's rounding and fragmentation and without kernels'
private workspaces. Dropout's masks are counted at the activation's width, as meta (and the CPU) keep them,
where CUDA keeps one byte an element: every row is a little high (5% of `none` at bert-base 8 × 512, bf16).

    python -m dietpe.bench.footprint --shape lm-bert-base --length 8192 --batch 2 \
        --methods none,diet-rel,t5,alibi,kerple,fire,diet-abs,rotary

What runs: the fused kernel's whole host path (its buffers allocated, its launches skipped on meta) and the
eager reference. SDPA and FlexAttention are refused: on meta SDPA runs its math kernel, which builds the
(B, H, L, L) scores that CUDA's flash kernel never holds. `none` on the fused kernel stands for flash: both keep
q, k, v, the output and a float32 log-sum-exp per query for the backward. `bf16` puts parameters and
activations in bf16 (autocast does not run on meta); the GPU benchmark's bf16 is autocast over float32
parameters, whose float32 gradients and bf16 weight copies add the same bytes to every method.

The counter is our own (a dispatch mode and weak references to storages, as PyTorch's private
`torch.distributed._tools.mem_tracker` does it), so it runs wherever torch does.
"""

from __future__ import annotations

import argparse
import gc
import sys
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dietpe.bench import cost
from dietpe.errors import ConfigError

#: backends whose memory meta models as CUDA has it
MODELLED = ("fused", "eager")
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODES = ("train", "infer")


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages the ops run inside it create, while they are alive: `current`, `peak`,
    and the largest one (bytes, op, shape). A storage first met as an op's input existed before and is not
    counted (parameters, inputs, optimizer states); in-place ops return storages already known."""

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self.largest: tuple[int, str, tuple] = (0, "", ())
        self._known: dict[int, weakref.ref] = {}

    def _free(self, key: int, nbytes: int) -> None:
        self._known.pop(key, None)
        self.current -= nbytes

    def _see(self, t: torch.Tensor, new: bool, op: str) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self._known:
            return
        nbytes = st.nbytes() if new else 0
        self._known[key] = weakref.ref(st, lambda _, k=key, n=nbytes: self._free(k, n))
        if nbytes:
            self.current += nbytes
            self.peak = max(self.peak, self.current)
            if nbytes > self.largest[0]:
                self.largest = (nbytes, op, tuple(t.shape))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                self._see(t, False, "")
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._see(t, True, func.overloadpacket.__name__)
        return out


@dataclass
class Footprint:
    label: str
    step_mib: float
    largest_mib: float
    largest_op: str
    largest_shape: tuple


def variant(label: str) -> cost.Variant:
    """The label's method on the fused kernel unless another backend is named; ConfigError for a backend meta
    does not model."""
    v = cost.Variant.parse(label)  # a bad label refused as the user wrote it
    v = v if "@" in label else cost.Variant.parse(f"{label}@fused")
    if v.backend not in MODELLED:
        raise ConfigError(f"method {label!r}: backend {v.backend!r} is not modelled on the meta device (SDPA runs "
                          f"its math kernel there, which CUDA's flash kernel is not); use @fused or @eager")
    return v


def step_footprint(shape: str, label: str, length: int, batch: int, mode: str = "train",
                   precision: str = "bf16") -> Footprint:
    """One step of `label`'s model at `shape` on (batch, length) token ids, modelled on meta: the bytes it
    creates at their peak, and its largest tensor. A training step is forward, backward and AdamW's update,
    measured after one step (the optimizer's states exist, the gradients were set to None), as the benchmark
    measures it."""
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    v = variant(label)
    config = cost.model_config(shape, v, cost.max_length_for(length))
    with torch.device("meta"):
        model = cost.build_model(config).to(PRECISIONS[precision])
    inputs = {k: t.to("meta") for k, t in cost.make_inputs(batch, length, config.vocab_size).items()}
    if shape.startswith(cost.LM):
        inputs.pop("token_type_ids")
    step = (cost.training_step if mode == "train" else cost.inference_step)(model, inputs)
    step()  # the optimizer's states
    gc.collect()  # nothing of the warm-up's left for a collection to free inside the measured step
    with LiveBytes() as live:
        step()
    size, op, shape_ = live.largest
    return Footprint(v.label, live.peak / 2**20, size / 2**20, op, shape_)


def table(rows: list[Footprint], baseline: Footprint | None) -> str:
    lines = ["| method | step peak MiB | × none@fused | largest tensor MiB | its op and shape |",
             "|---|--:|--:|--:|---|"]
    for r in rows:
        ratio = f"{r.step_mib / baseline.step_mib:.3f}" if baseline and baseline.step_mib > 0 else "–"
        lines.append(f"| {r.label} | {r.step_mib:,.1f} | {ratio} | {r.largest_mib:,.1f} | "
                     f"{r.largest_op} {tuple(r.largest_shape)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dietpe.bench.footprint", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="lm-bert-base", help="a preset, or lm-<preset> for the causal LM "
                                                           "(default: lm-bert-base)")
    p.add_argument("--length", type=int, default=8192, help="tokens per row (default: 8192)")
    p.add_argument("--batch", type=int, default=2, help="rows (default: 2)")
    p.add_argument("--methods", default="none,diet-rel,t5,alibi,kerple,fire,diet-abs,tupe-a,tupe-r,rotary",
                   help="comma-separated methods, each on the fused kernel unless '@eager' is given; 'none' "
                        "(the ratios' baseline) is added first")
    p.add_argument("--mode", choices=MODES, default="train")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="bf16")
    args = p.parse_args(argv)
    try:
        if args.length < 1 or args.batch < 1:
            raise ConfigError(f"--length and --batch must be at least 1, got {args.length} and {args.batch}")
        labels = [m.strip() for m in args.methods.split(",") if m.strip()]
        for label in labels:  # every refusal before the first row
            cost.model_config(args.shape, variant(label), cost.max_length_for(args.length))
        labels = list(dict.fromkeys(["none", *labels]))
        rows = []
        for label in labels:
            rows.append(step_footprint(args.shape, label, args.length, args.batch, args.mode, args.precision))
            print(f"[footprint] {rows[-1].label}: {rows[-1].step_mib:,.1f} MiB", file=sys.stderr, flush=True)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Step peak memory modelled on the meta device: {args.shape}, {args.batch} × {args.length}, "
          f"{args.mode}, {args.precision}\n")
    print(table(rows, rows[0]))
    return 0


if __name__ == "__main__":
    from dietpe.errors import module_main

    sys.exit(module_main(main, "python -m dietpe.bench.footprint"))
