"""The launches a call's signature fixes (`attention.signature`, `_specs`): calls after the first with the same
signature run the kept launches (no tile choice, no argument list built) with the same bits as the first, and
any two calls with one signature get the same launch arguments when built from scratch, so keeping them is
exact."""

import pytest
import torch

from tests.attention.kernels.conftest import NO_TRITON
from tests.attention.kernels.test_attention import _case, _run
from tests.conftest import TEST_DEVICE

pytest.importorskip("triton", reason=NO_TRITON)


def test_later_calls_reuse_the_launches_with_the_same_bits(monkeypatch):
    from dietpe.attention.kernels import attention as A

    monkeypatch.setattr(A, "_specs", {})
    chosen, real = [], A._launch
    monkeypatch.setattr(A, "_launch", lambda key, *rest: chosen.append(key[0]) or real(key, *rest))
    inputs, ex = _case(TEST_DEVICE, torch.float32, 2, 2, 20, 20, 16, 16, table_heads=2, nseg=2, mask="padding")
    first = _run(inputs, ex)
    again = [_run(inputs, ex) for _ in range(2)]
    assert chosen == ["fwd", "dq", "dkdv", "band"]  # the first call only
    for out, grads in again:
        assert torch.equal(out, first[0]) and all(torch.equal(a, b) for a, b in zip(grads, first[1]))
    _run(*_case(TEST_DEVICE, torch.float32, 2, 2, 21, 20, 16, 16, table_heads=2, nseg=2, mask="padding"))
    assert chosen[4:] == ["fwd", "dq", "dkdv", "band"]  # another length: its own launches


def test_forcing_a_tile_keeps_nothing(monkeypatch):
    from dietpe.attention.kernels import attention as A

    monkeypatch.setattr(A, "_specs", {})
    inputs, ex = _case(TEST_DEVICE, torch.float32, 1, 2, 12, 12, 16, 16, table_heads=2)
    with A.forcing(1):
        _run(inputs, ex)
    assert all(call.forward is None and not call.backward for call in A._specs.values())
    _run(inputs, ex)
    (call,) = A._specs.values()
    assert call.forward is not None and len(call.backward) == 1


def _variants():
    """Calls differing in one thing a launch depends on each, and pairs differing only in values."""
    f32, bf16 = torch.float32, torch.bfloat16
    base = dict(table_heads=2, nseg=0)
    shapes = [(f32, 2, 2, 20, 20, 16, 16), (f32, 2, 2, 20, 24, 16, 16), (f32, 3, 2, 20, 20, 16, 16),
              (f32, 2, 2, 20, 20, 32, 16), (f32, 2, 2, 20, 20, 16, 24), (bf16, 2, 2, 20, 20, 16, 16)]
    terms = [dict(base), dict(table_heads=1), dict(table_heads=None), dict(base, nseg=2), dict(base, keep=True),
             dict(base, mask="padding"), dict(base, mask="documents"), dict(base, causal=True)]
    for shape in shapes:
        yield (shape, base, {})
    for t in terms[1:]:
        yield (shapes[0], t, {})
    for extra in (dict(dropout=0.1), dict(dropout=0.2), dict(scale=0.5), dict(transposed=True), dict(seed=3)):
        yield (shapes[0], base, extra)


def _built(shape, terms, extra, table_read, table_grad):
    """(signature, every launch argument but the tensors and the seed) of a call, built from scratch."""
    from dietpe.attention.kernels import attention as A

    (q, k, v, table, segments), ex = _case("cpu", *shape, **terms)
    g = torch.Generator().manual_seed(extra.get("seed", 0))
    if extra.get("seed"):  # other values, the same layout
        q, k, v = (torch.randn(x.shape, generator=g).to(x.dtype) for x in (q, k, v))
    if extra.get("transposed"):  # (B, L, H, D) storage, as a projection hands heads over
        q = q.detach().transpose(1, 2).contiguous().transpose(1, 2)
    ex.dropout = extra.get("dropout", 0.0)
    scale = extra.get("scale", 0.3)
    q, k, v, table, segments, _ = A.kernel_inputs(q, k, v, table, segments, None)
    out = torch.empty(q.shape[:3] + v.shape[3:], dtype=v.dtype)
    with A.table_read(table_read), A.table_gradient(table_grad):
        sig = A.signature(q, k, v, scale, table, segments, ex)
        flags = A._flags(table, segments, ex, q)
    bands = table is not None and table_grad == "bands"
    grads = dict(TAB_GRAD=table is not None and not bands, SEG_GRAD=segments is not None)
    fwd = A._forward_spec((16, 32, 4, 1), q, k, v, scale, table, segments, ex, flags)
    second = A._second_gradients(A._Call(q, k, v, ex).split, q, k, ex)
    specs = (fwd, *A._backward_specs(((16, 16, 4, 1), (16, 32, 4, 1)), q, k, v, out, out, second, scale, table,
                                      segments, ex, flags, grads))
    if bands:
        specs += (A._band_spec((16, 16, 4, 1), q, k, v, out, scale, table, segments, ex, flags),)
    return sig, tuple((s.grid, s.before, s.after, s.constants, s.sizes) for s in specs)


def test_one_signature_means_one_set_of_launch_arguments():
    seen, calls = {}, 0
    for shape, terms, extra in _variants():
        for table_read in ("window", "score"):
            for table_grad in ("bands", "rows"):
                sig, built = _built(shape, terms, extra, table_read, table_grad)
                assert seen.setdefault(sig, built) == built, f"one signature, two launches: {shape} {terms} {extra}"
                calls += 1
    # every variant but the one differing in values alone has its own signature
    assert calls == 4 * 18 and len(seen) == calls - 4
