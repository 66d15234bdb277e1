"""The kept-kernel launcher (`dietpe.attention.kernels.launch`): its fingerprint separates whatever Triton's own
binder specialises differently, and a call with a kept fingerprint reaches the compiled kernel's launcher with
Triton's argument list, any other through `kernel[grid]`."""

import pytest
import torch

from tests.attention.kernels.conftest import NO_TRITON

triton = pytest.importorskip("triton", reason=NO_TRITON)

from dietpe.attention.kernels import launch as L  # noqa: E402
from dietpe.attention.kernels.attention import _forward_kernel  # noqa: E402


def _triton_binder(kernel):
    """Triton's own binder of `kernel` for a Hopper target (no GPU needed: it reads the arguments only)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(kernel.signature, kernel.params, make_backend(GPUTarget("cuda", 90, 32)))


def _values():
    base = torch.zeros(64, dtype=torch.float32)
    tensors = [base, base[1:], base[4:], base.to(torch.bfloat16), base.to(torch.bfloat16)[1:], base.to(torch.int32)]
    ints = [0, 1, 2, 15, 16, 17, 48, 2**31 - 1, 2**31, 2**40]
    return tensors, ints


def test_equal_fingerprints_mean_equal_triton_specialisations():
    """Over pointers (dtypes, alignments; the tensors first, the dropout seed's among the sizes), integers (0, 1,
    multiples of 16 and not, past 32 bits), any two argument lists with one fingerprint get one specialisation
    from Triton."""
    from triton.runtime.jit import JITFunction

    # the kernel as a GPU sees it (under the interpreter the module holds an InterpretedFunction)
    kernel = JITFunction(getattr(_forward_kernel, "fn", _forward_kernel))
    binder = _triton_binder(kernel)
    loose = tuple(bool(p.do_not_specialize) for p in kernel.params)
    names = kernel.arg_names
    n_args = sum(not p.is_constexpr for p in kernel.params)
    tensors, ints = _values()
    pointers = {*range(names.index("sqb")), names.index("SEED")}  # Q, K, V, ..., then strides and sizes
    floats = {names.index(n) for n in ("qk_scale", "p_drop", "inv_keep")}
    template = [tensors[0] if i in pointers else 0.5 if i in floats else 16 for i in range(n_args)]
    constants = dict(BM=16, BN=16, D1=16, D2=0, DVP=16, EVEN_M=True, EVEN_N=True, EVEN_D=True, HAS_TAB=False,
                     HAS_KEEP=False, NSEG=0, MASK_KIND=0, PIECES=0, LOGKP=0, CAUSAL=False, DROPOUT=False,
                     PREC="tf32", debug=False)
    seen: dict[tuple, tuple] = {}
    probes = 0
    for slot, choices in [(0, tensors), (names.index("sqb") - 1, tensors), (names.index("sqh"), ints),
                          (names.index("LK"), ints), (names.index("SEED"), tensors)]:
        for value in choices:
            args = list(template)
            args[slot] = value
            key, _ = L.fingerprint(args, loose)
            _, spec, _ = binder(*args, **constants)
            spec = tuple(map(str, spec))
            assert seen.setdefault(key, spec) == spec, f"one fingerprint, two specialisations at {names[slot]}"
            probes += 1
    assert probes == 3 * len(tensors) + 2 * len(ints) and len(seen) > 10  # and reached many


class _Compiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, calls):
        self.calls = calls

    def run(self, *args):
        self.calls.append(("direct", args))


class _Param:
    def __init__(self, name, dns=False, default=None):
        self.name, self.do_not_specialize, self.default = name, dns, default


class _Kernel:
    """A jit function's surface: parameters, and `kernel[grid](*args, **constants)` returning the compiled one."""

    def __init__(self):
        self.params = [_Param("X"), _Param("n"), _Param("seed", dns=True), _Param("BM"), _Param("FLAG", default=7)]
        self.arg_names = [p.name for p in self.params]
        self.calls = []

    def __getitem__(self, grid):
        def run(*args, **constants):
            self.calls.append(("jit", grid, args, constants))
            return _Compiled(self.calls)
        return run


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(L, "_driver", _Driver)
    monkeypatch.setattr(L, "interpreting", lambda: False)
    monkeypatch.delenv("DIETPE_FUSED_LAUNCH", raising=False)
    L.clear()
    yield _Kernel()
    L.clear()


def test_a_kept_fingerprint_calls_the_launcher_directly(fake):
    x = torch.zeros(32)
    L.launch(fake, (3, 2), (x, 64, 2**40 + 1), dict(BM=16, num_warps=4))
    L.launch(fake, (3, 2), (x, 64, 12345678901), dict(BM=16, num_warps=4))  # another seed: the same kernel
    assert [c[0] for c in fake.calls] == ["jit", "direct"]
    assert fake.calls[1][1] == (3, 2, 1, 1234, "fn", "meta", None, None, None, x.data_ptr(), 64, 12345678901, 16, 7)


@pytest.mark.parametrize("change", ["misaligned", "dtype", "stride", "one", "constant", "wide seed"])
def test_another_specialisation_goes_through_triton(fake, change):
    x = torch.zeros(32)
    args, constants = (x, 64, 99), dict(BM=16, num_warps=4)
    L.launch(fake, (1,), args, constants)
    other = {"misaligned": ((x[1:], 64, 99), constants), "dtype": ((x.double(), 64, 99), constants),
             "stride": ((x, 65, 99), constants), "one": ((x, 1, 99), constants),
             "constant": (args, dict(BM=32, num_warps=4)), "wide seed": ((x, 64, 2**40), constants)}[change]
    L.launch(fake, (1,), *other)
    L.launch(fake, (1,), *other)
    assert [c[0] for c in fake.calls] == ["jit", "jit", "direct"]


def test_switched_off_or_hooked_every_launch_goes_through_triton(fake, monkeypatch):
    x = torch.zeros(32)
    monkeypatch.setenv("DIETPE_FUSED_LAUNCH", "jit")
    L.clear()
    for _ in range(2):
        L.launch(fake, (1,), (x, 64, 1), dict(BM=16))
    monkeypatch.delenv("DIETPE_FUSED_LAUNCH")
    L.clear()
    hook = lambda metadata: None  # noqa: E731 (a profiler's launch hook)
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        for _ in range(2):
            L.launch(fake, (1,), (x, 64, 1), dict(BM=16))
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert [c[0] for c in fake.calls] == ["jit"] * 4


def test_the_interpreter_is_never_bypassed(monkeypatch):
    monkeypatch.setattr(L, "interpreting", lambda: True)
    L.clear()
    try:
        assert not L.cached()
    finally:
        L.clear()


def test_through_triton_and_the_bound_on_kept_kernels(fake, monkeypatch):
    x = torch.zeros(32)
    L.launch(fake, (1,), (x, 64, 1), dict(BM=16))
    with L.through_triton():
        L.launch(fake, (1,), (x, 64, 1), dict(BM=16))
    L.launch(fake, (1,), (x, 64, 1), dict(BM=16))
    assert [c[0] for c in fake.calls] == ["jit", "jit", "direct"]
    monkeypatch.setattr(L, "MAX_KEPT", 3)
    for n in range(16, 26):  # a length that changes at every call (decoding)
        L.launch(fake, (1,), (x, n, 1), dict(BM=16))
        assert len(L._compiled) <= 3


class _BareKernel(_Kernel):
    """A Triton whose `kernel[grid](...)` returns no launcher, function and metadata to keep."""

    def __getitem__(self, grid):
        def run(*args, **constants):
            self.calls.append(("jit", grid, args, constants))
            return object()
        return run


def test_a_compiled_kernel_without_its_launcher_is_not_kept(fake):
    bare, x = _BareKernel(), torch.zeros(32)
    for _ in range(3):
        L.launch(bare, (1,), (x, 64, 1), dict(BM=16))
    assert [c[0] for c in bare.calls] == ["jit"] * 3 and not L._compiled


def test_a_token_keys_on_the_tensors_and_the_seed_alone(fake):
    """With a token (the caller's promise that the rest of the arguments are fixed) the key is the tensors'
    dtypes and alignments and the unspecialised seed's width: another of those goes through Triton once."""
    x = torch.zeros(32)
    token = ("spec", 1)
    for args in [(x, 64, 5), (x, 64, 6), (x[1:], 64, 7), (x[1:], 64, 8), (x.double(), 64, 9), (x, 64, 2**40)]:
        L.launch(fake, (2,), args, dict(BM=16), token=token)
    assert [c[0] for c in fake.calls] == ["jit", "direct", "jit", "direct", "jit", "jit"]
    assert fake.calls[3][1][-4:] == (64, 8, 16, 7)  # the values passed, then the constexprs in order
    L.launch(fake, (2,), (x, 64, 5), dict(BM=16), token=("another spec", 1))
    assert fake.calls[-1][0] == "jit"
