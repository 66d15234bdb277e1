"""Launching a compiled Triton kernel again without Triton's per-call dispatch.

`kernel[grid](*args)` binds and specialises every argument at every call (each pointer's dtype and 16-byte
alignment, each integer's divisibility by 16 and range), builds a cache key from them, and its launcher asks
the driver about every pointer. For these kernels' 46-62 arguments that is 30-40 µs of host time per launch
before the launch itself on a development CPU, and 111 µs per call of `JITFunction.run` in a cProfile on an
H100's host (docs/kernels.md, "Where the time goes"): three or four launches per layer, in a bert-base
training step at 512 tokens that is bound by the host. So after Triton's first launch of a kernel for a
specialisation the compiled kernel is kept, under a key finer than Triton's specialisation (`fingerprint`),
and later calls with the same key call its launcher directly, pointers passed as addresses (7 µs of key and
lookup for 55 arguments on the development CPU). Any call whose key differs, any launch hook (a profiler's),
and Triton's interpreter go through `kernel[grid]` as before. `DIETPE_FUSED_LAUNCH=jit` turns the cache off.
A caller that keeps its launches' other arguments per signature (the attention kernels: `attention._specs`)
passes a token, and the key is then built from the tensors and the seed alone.
"""

from __future__ import annotations

import contextlib
import os

from torch import Tensor

from dietpe.attention.kernels import interpreting

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
MAX_KEPT = 4096
#: (kernel, device, fingerprint, constants) -> (compiled kernel, constexpr values in parameter order)
_compiled: dict[tuple, tuple] = {}
#: kernel -> (whether each parameter is `do_not_specialize`, the indices of those that are)
_loose: dict[object, tuple[tuple[bool, ...], tuple[int, ...]]] = {}
_state: list[bool] = []
_runtime: list = []  # triton.knobs.runtime, where launch hooks are set
_active: list = []  # Triton's active driver


def cached() -> bool:
    """Whether launches use the cache: not under the interpreter, not with DIETPE_FUSED_LAUNCH=jit, and only
    with a Triton whose launcher takes the arguments this module passes (3.3 and later: `triton.knobs`). Read
    once (Triton reads TRITON_INTERPRET once too, when the kernels are defined)."""
    if not _state:
        import triton

        _state.append(os.environ.get("DIETPE_FUSED_LAUNCH", "cached") != "jit" and hasattr(triton, "knobs")
                      and not interpreting())
    return _state[0]


def fingerprint(args, loose: tuple[bool, ...]) -> tuple[tuple, list]:
    """(a key that separates whatever Triton specialises `args` differently, the values its launcher takes:
    tensors as addresses). Finer than Triton's own: integers by value (Triton: divisibility by 16, range),
    pointers by dtype and address mod 16 (Triton: dtype, 16-byte alignment); loose[i]: argument i is
    `do_not_specialize`, where only its integer width counts."""
    key, values = [], []
    for x, dns in zip(args, loose):
        if type(x) is int:
            key.append(I32_MIN <= x <= I32_MAX if dns else x)
            values.append(x)
        elif isinstance(x, Tensor):
            p = x.data_ptr()
            key.append(x.dtype)
            key.append(p & 15)
            values.append(p)
        else:
            key.append(type(x))
            values.append(x)
    return tuple(key), values


def tensor_fingerprint(tensors, rest: tuple, loose_at: tuple[int, ...]) -> tuple[tuple, list]:
    """`fingerprint` of the arguments (*tensors, *rest) where a caller vouches that `rest` holds the same values
    at every call with its token (`launch`): the tensors' dtypes and alignments and the unspecialised integers'
    widths (loose_at: their indices in the arguments) are all that can change Triton's specialisation."""
    values = [x.data_ptr() for x in tensors]
    key = tuple([x.dtype for x in tensors])
    low = 0
    for p in values:
        low |= p
    if low & 15:  # some pointer not 16-byte aligned, which Triton specialises on
        key += tuple([p & 15 for p in values])
    if loose_at:
        args = (*tensors, *rest)
        key += tuple([I32_MIN <= args[i] <= I32_MAX for i in loose_at])
    values.extend(rest)
    return key, values


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for grids (not `triton.cdiv`: a jit function, several µs per call from Python)."""
    return -(-a // b)


def _hooked() -> bool:
    """Whether a launch hook is set (a profiler's): each launch then goes through Triton, which calls it."""
    if not _runtime:
        import triton

        _runtime.append(triton.knobs.runtime)
    enter, leave = _runtime[0].launch_enter_hook, _runtime[0].launch_exit_hook
    return bool(getattr(enter, "calls", enter is not None)) or bool(getattr(leave, "calls", leave is not None))


def _driver():
    if not _active:
        from triton.runtime import driver

        _active.append(driver.active)
    return _active[0]


def launch(kernel, grid: tuple[int, ...], args: tuple, constants: dict,
           token: tuple[object, int] | None = None) -> None:
    """`kernel[grid](*args, **constants)`, by the kept compiled kernel when Triton would run that one.

    token: (a hashable name, n): the caller promises that every call with this name passes the same grid,
    constants and arguments after the first n, which are tensors; the key is then built from those tensors
    and the unspecialised integers only (`tensor_fingerprint`), not from every argument. Nothing is launched
    for tensors on the meta device (shapes and memory only: `dietpe.bench.footprint`)."""
    if token is None:
        _launch(kernel, grid, args, (), constants, None)
    else:
        _launch(kernel, grid, args[:token[1]], args[token[1]:], constants, token[0])


def launch_kept(kernel, grid: tuple[int, ...], tensors: tuple, rest: tuple, constants: dict, token) -> None:
    """`launch(kernel, grid, (*tensors, *rest), constants, (token, len(tensors)))`, without building the
    argument list: the caller's promise is that of `launch`'s token."""
    _launch(kernel, grid, tensors, rest, constants, token)


def _launch(kernel, grid: tuple[int, ...], tensors: tuple, rest: tuple, constants: dict, token) -> None:
    if tensors[0].is_meta:
        return
    if not cached() or _hooked():
        kernel[grid](*tensors, *rest, **constants)
        return
    active = _driver()
    loose = _loose.get(kernel)
    if loose is None:
        flags = tuple(bool(p.do_not_specialize) for p in kernel.params)
        loose = _loose[kernel] = (flags, tuple(i for i, f in enumerate(flags) if f))
    device = active.get_current_device()
    if token is None:
        spec, values = fingerprint(tensors, loose[0])
        key = (kernel, device, spec, *constants.items())
    else:
        spec, values = tensor_fingerprint(tensors, rest, loose[1])
        key = (kernel, device, token, spec)
    hit = _compiled.get(key)
    if hit is None:
        args = (*tensors, *rest)
        compiled = kernel[grid](*args, **constants)
        if len(_compiled) >= MAX_KEPT:  # lengths that change every call (decoding) add a key each
            _compiled.clear()
        if all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):  # the launcher's inputs
            params = kernel.params[len(args):]  # constexprs by name (or their defaults), in parameter order
            _compiled[key] = (compiled, tuple(constants[p.name] if p.name in constants else p.default
                                              for p in params))
        return
    compiled, tail = hit
    g = (*grid, 1, 1)
    compiled.run(g[0], g[1], g[2], active.get_current_stream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *values, *tail)


@contextlib.contextmanager
def through_triton():
    """Within it every launch goes through `kernel[grid]`, as with DIETPE_FUSED_LAUNCH=jit (to time both)."""
    cached()
    saved, _state[0] = _state[0], False
    try:
        yield
    finally:
        _state[0] = saved


def clear() -> None:
    """Forget the kept kernels and what was read once (tests)."""
    _compiled.clear()
    _loose.clear()
    _state.clear()
    _runtime.clear()
    _active.clear()
