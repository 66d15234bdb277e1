"""The fused kernel's piecewise term (FIRE's f_θ as its linear pieces) against the equation written out densely
from indices: term[h, i, j] = slope[p, h]·x + intercept[p, h], x = numerator[i - j + Lk - 1] / den[i], p the
number of kinks below x. Values and the gradients of q, k, v, the numerator, den, the slopes and the intercepts,
beside padding, packed documents, causality, segments and dropout; and two runs give the same bits."""

import dataclasses

import pytest
import torch

from tests.attention.kernels.conftest import NO_TRITON, sizes
from tests.attention.kernels.test_attention import _case, assert_same_reads, reference

pytest.importorskip("triton", reason=NO_TRITON)

L, M = sizes(13, 301), sizes(11, 157)
E = sizes(32, 256)


def piecewise_dense(numerator, den, kinks, slope, intercept, lq, lk):
    """(H, Lq, Lk) from the definition: the piece counted kink by kink."""
    i, j = torch.arange(lq, device=den.device)[:, None], torch.arange(lk, device=den.device)[None, :]
    x = numerator[0, i - j + lk - 1] / den[:, None]  # (Lq, Lk)
    p = (kinks[None, None, :] < x[..., None]).sum(-1)
    return (slope[p] * x[..., None] + intercept[p]).movedim(-1, 0)


def _pieces(device, lq, lk, heads, width, flat_unit, seed=3):
    """A numerator over offsets and a den per query such that x spans the kinks (so a tile meets several
    pieces, and some x lie beyond the last finite kink), `width` sorted kinks (with `flat_unit` the last one
    +inf: a unit with no slope), slopes and intercepts."""
    g = torch.Generator().manual_seed(seed)
    numerator = (torch.rand(1, lq + lk - 1, generator=g) * 3).to(device).requires_grad_()
    den = (torch.rand(lq, generator=g) + 0.5).to(device).requires_grad_()
    kinks = (torch.rand(width, generator=g) * 5).sort().values
    if flat_unit:
        kinks[-1] = torch.inf
    slope = torch.randn(width + 1, heads, generator=g).to(device).requires_grad_()
    intercept = torch.randn(width + 1, heads, generator=g).to(device).requires_grad_()
    return numerator, den, kinks.to(device), slope, intercept


def _both(device, dtype, b, h, lq, lk, dq, dv, width=32, flat_unit=False, nseg=0, mask=None, causal=False,
          dropout=0.0, reset=False):
    """(kernel, reference): each (out, gradients) for the loss (out · W).sum() with a fixed random W."""
    from dietpe.attention.kernels.attention import dropout_keep, fused_attention

    (q, k, v, _, segments), ex = _case(device, dtype, b, h, lq, lk, dq, dv, nseg=nseg, mask=mask, causal=causal,
                                       keep=reset)
    numerator, den, kinks, slope, intercept = _pieces(device, lq, lk, h, width, flat_unit)
    ex.dropout, ex.seed = dropout, 99
    keep = dropout_keep(ex.seed, dropout, b, h, lq, lk, device) if dropout else None
    leaves = [x for x in (q, k, v, segments, numerator, den, slope, intercept) if x is not None]
    w = torch.randn(b, h, lq, dv, generator=torch.Generator().manual_seed(1)).to(device)

    out = fused_attention(q, k, v, 0.3, numerator, segments, dataclasses.replace(ex),
                          (den, kinks, slope, intercept))
    got = out, torch.autograd.grad((out.float() * w).sum(), leaves)
    bias = piecewise_dense(numerator, den, kinks, slope, intercept, lq, lk)[None]
    if reset:  # a_i·c_j: the term's reset rows and columns (TUPE's keeps)
        bias = bias * ex.q_keep[:, None] * ex.k_keep[None, :]
    with_bias = dataclasses.replace(ex, mask=bias if ex.mask is None else ex.mask.float() + bias)
    want = reference(q, k, v, 0.3, None, segments, with_bias, keep)
    return got, (want, torch.autograd.grad((want.float() * w).sum(), leaves))


CASES = {
    "fp32-16-padding": dict(dtype=torch.float32, b=2, h=2, lq=L, lk=L, dq=16, dv=16, mask="padding"),
    "fp32-72in2parts-documents-lq-ne-lk": dict(dtype=torch.float32, b=1, h=2, lq=L + 10, lk=M, dq=72, dv=64,
                                               mask="documents"),
    "fp32-32-3segments-causal-flat-unit": dict(dtype=torch.float32, b=1, h=3, lq=L + 20, lk=L + 20, dq=32,
                                               dv=32, nseg=3, causal=True, flat_unit=True),
    "fp32-16-3kinks-flat-unit-even": dict(dtype=torch.float32, b=1, h=2, lq=E, lk=2 * E, dq=16, dv=16, width=3,
                                          flat_unit=True),
    "fp32-16-4kinks-padding": dict(dtype=torch.float32, b=2, h=2, lq=L, lk=L, dq=16, dv=16, width=4,
                                   mask="padding"),
    "fp32-16-causal-even-dropout": dict(dtype=torch.float32, b=1, h=2, lq=2 * E, lk=2 * E, dq=16, dv=16,
                                        causal=True, dropout=0.2),
    "fp32-16-reset-padding": dict(dtype=torch.float32, b=2, h=2, lq=L, lk=L + 3, dq=16, dv=16, reset=True,
                                 mask="padding"),
    "bf16-64-segments-padding": dict(dtype=torch.bfloat16, b=2, h=2, lq=L, lk=L, dq=64, dv=64, nseg=2,
                                     mask="padding"),
}
NAMES = ("q", "k", "v", "segments", "numerator", "den", "slope", "intercept")


@pytest.mark.parametrize("name", CASES)
def test_piecewise_term_matches_the_equation_with_gradients(name, device):
    case = CASES[name]
    (out, grads), (want, want_grads) = _both(device, **case)
    bf16 = case["dtype"] == torch.bfloat16
    torch.testing.assert_close(out, want, **(dict(atol=2e-2, rtol=2e-2) if bf16 else dict(atol=2e-5, rtol=1e-4)))
    names = [n for n in NAMES if n != "segments" or case.get("nseg")]
    assert len(names) == len(grads)
    for n, got, ref in zip(names, grads, want_grads):
        assert ref.abs().max() > 0, n  # every input has a real gradient
        scale = max(ref.abs().max().item(), 1)
        if bf16:
            torch.testing.assert_close(got.float(), ref.float(), atol=3e-2 * scale, rtol=3e-2, msg=n)
        else:
            torch.testing.assert_close(got, ref, atol=1e-5 * scale, rtol=1e-4, msg=n)


def test_pieces_are_packed_as_the_kernel_reads_them():
    from dietpe.attention.kernels.attention import pack_pieces

    kinks = torch.tensor([0.5, 1.5, torch.inf])
    slope, intercept = torch.arange(8.0).view(4, 2), -torch.arange(8.0).view(4, 2)
    buffer, slots = pack_pieces(kinks, slope, intercept)
    assert slots == 4 and buffer.shape == (4 + 2 * 2 * 8,)
    assert buffer[:4].tolist() == [0.5, 1.5, float("inf"), float("inf")]
    head1 = buffer[4 + 16:4 + 32]
    assert head1[:4].tolist() == [1.0, 3.0, 5.0, 7.0] and head1[8:12].tolist() == [-1.0, -3.0, -5.0, -7.0]


def test_two_runs_give_the_same_bits(device):
    first = _both(device, torch.float32, b=2, h=2, lq=L + 6, lk=L, dq=16, dv=16, nseg=2, mask="padding")[0]
    second = _both(device, torch.float32, b=2, h=2, lq=L + 6, lk=L, dq=16, dv=16, nseg=2, mask="padding")[0]
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(a, b) for a, b in zip(first[1], second[1]))


def test_both_table_reads_give_the_same_bits(device):
    """The piecewise term's numerator read by window and per score: the same output and gradients (forward and
    both backward kernels, den's and the pieces' sums included; `assert_same_reads`)."""
    from dietpe.attention.kernels.attention import table_read

    case = dict(device=device, dtype=torch.float32, b=2, h=2, lq=L + 6, lk=L, dq=16, dv=16, nseg=2, mask="padding")
    with table_read("score"):
        by_score = _both(**case)[0]
    with table_read("window"):
        by_window = _both(**case)[0]
    assert_same_reads(by_score, by_window)


def test_the_gpus_tiles_gather_the_pieces_too(device, monkeypatch):
    """FIRE's pieces gathered from the tile's vectors with the GPU's tile sizes, causal with dropout: what the
    loads per score give (`assert_same_reads`), and the equation's values and gradients."""
    from dietpe.attention.kernels import attention as A
    from tests.attention.kernels.test_attention import GPU_TILES

    for name, tiles in GPU_TILES.items():
        monkeypatch.setitem(A.INTERPRETER_CONFIGS, name, tiles)
    n = sizes(150, 300)
    case = dict(device=device, dtype=torch.float32, b=1, h=2, lq=n, lk=n, dq=32, dv=32, causal=True, dropout=0.2)
    with A.table_read("score"):
        by_score = _both(**case)[0]
    with A.table_read("window"):
        (out, grads), (want, want_grads) = _both(**case)
    assert_same_reads(by_score, (out, grads))
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    for got, ref in zip(grads, want_grads):
        torch.testing.assert_close(got, ref, atol=1e-5 * max(ref.abs().max().item(), 1), rtol=1e-4)
