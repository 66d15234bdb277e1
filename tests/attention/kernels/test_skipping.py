"""Block skipping in the fused kernel: a tile the additive mask wholly blocks (a padded tail, another packed
document) is not computed, in the forward and in both backward kernels, where every query of the tile sees some
open key; a query that sees none gets the equation's value (the softmax over its blocked scores) all the same.
Against the equation written out densely, values and gradients, and by keys that are never read."""

import dataclasses

import pytest
import torch

from tests.attention.kernels.conftest import NO_TRITON, sizes
from tests.attention.kernels.test_attention import _case, _reference_run, _run
from tests.attention.kernels.test_piecewise import _both

pytest.importorskip("triton", reason=NO_TRITON)

N = sizes(64, 512)  # a multiple of every tile
TAIL = sizes(32, 256)  # whole key blocks of every tile
BLOCKED = torch.finfo(torch.float32).min


def _documents(n, cuts):
    """(1, 1, n, n) additive block-diagonal mask of documents starting at `cuts`."""
    doc = torch.zeros(n, dtype=torch.long)
    for c in cuts:
        doc[c:] += 1
    return torch.where(doc[:, None] == doc[None, :], 0.0, BLOCKED)[None, None]


def _padding(b, n, tail, every_key_of_row=None, left=False):
    """(B, 1, 1, n): the last row's last (or first) `tail` keys padded; optionally one row with every key padded."""
    mask = torch.zeros(b, 1, 1, n)
    if left:
        mask[-1, ..., :tail] = BLOCKED
    else:
        mask[-1, ..., n - tail:] = BLOCKED
    if every_key_of_row is not None:
        mask[every_key_of_row] = BLOCKED
    return mask


def _weights(ex, shape, device):
    """A fixed random projection of the output, 0 on the queries that see no open key (padding: no loss reads
    them, and their gradient is not the kernel's to match)."""
    b, h, lq, dv = shape
    w = torch.randn(b, h, lq, dv, generator=torch.Generator().manual_seed(1))
    is_open = ex.mask.cpu().expand(b, 1, lq, ex.mask.shape[-1]) > -1e4
    if ex.causal:
        is_open = is_open & torch.ones(lq, lq, dtype=torch.bool).tril()
    return (w * is_open.any(-1, keepdim=True)).to(device)


def _both_runs(inputs, ex):
    from dietpe.attention.kernels.attention import fused_attention

    from tests.attention.kernels.test_attention import reference

    leaves = [x for x in inputs if x is not None]
    out = fused_attention(*inputs[:3], 0.3, *inputs[3:], ex)
    want = reference(*inputs[:3], 0.3, *inputs[3:], ex)
    w = _weights(ex, out.shape, out.device)
    return ((out, torch.autograd.grad((out * w).sum(), leaves)),
            (want, torch.autograd.grad((want * w).sum(), leaves)))


def _assert_close(got, want):
    (out, grads), (ref, ref_grads) = got, want
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, r, atol=1e-5 * max(r.abs().max().item(), 1), rtol=1e-4)


@pytest.mark.parametrize("mask_kind", ["documents", "documents-causal", "padding", "padding-fp16-style",
                                       "left-padding", "left-padding-causal", "a-row-all-padded"])
def test_skipping_keeps_the_equation(mask_kind, device):
    causal = mask_kind.endswith("causal")
    inputs, ex = _case(device, torch.float32, b=2, h=2, lq=N, lk=N, dq=16, dv=16, table_heads=2, nseg=2,
                       causal=causal)
    if mask_kind.startswith("documents"):
        ex.mask = _documents(N, (N // 4, N // 2 + 3)).expand(2, 1, N, N)
    else:
        ex.mask = _padding(2, N, TAIL, left=mask_kind.startswith("left"),
                           every_key_of_row=0 if mask_kind == "a-row-all-padded" else None)
        if mask_kind == "padding-fp16-style":
            ex.mask = ex.mask.clamp(min=-65504.0)
    ex.mask = ex.mask.to(device)
    _assert_close(*_both_runs(inputs, ex))


def test_skipping_with_a_piecewise_term_and_dropout(device):
    import tests.attention.kernels.test_attention as attention_tests

    original = attention_tests._case

    def with_documents(*args, **kwargs):  # the piecewise helper's case, with packed documents
        inputs, ex = original(*args, **kwargs)
        ex.mask = _documents(N, (N // 3,)).expand(1, 1, N, N).to(device)
        return inputs, ex

    attention_tests._case = with_documents
    import tests.attention.kernels.test_piecewise as piecewise_tests

    piecewise_tests._case = with_documents
    try:
        (out, grads), (want, want_grads) = _both(device, torch.float32, b=1, h=2, lq=N, lk=N, dq=16, dv=16,
                                                 dropout=0.2)
    finally:
        attention_tests._case = piecewise_tests._case = original
    _assert_close((out, grads), (want, want_grads))


def test_keys_in_wholly_padded_blocks_are_never_read(device):
    """NaN in the keys and values of a padded tail: a kernel that read them would give NaN everywhere in that
    row; skipping gives the equation's values with them zeroed, and finite gradients."""
    inputs, ex = _case(device, torch.float32, b=2, h=2, lq=N, lk=N, dq=16, dv=16, table_heads=2)
    ex.mask = _padding(2, N, TAIL).to(device)
    q, k, v, table, segments = inputs
    with torch.no_grad():
        clean_k, clean_v = k.detach().clone(), v.detach().clone()
        clean_k[-1, :, N - TAIL:] = 0
        clean_v[-1, :, N - TAIL:] = 0
        k[-1, :, N - TAIL:] = float("nan")
        v[-1, :, N - TAIL:] = float("nan")
    out, grads = _run(inputs, ex)
    clean = (q, clean_k.requires_grad_(), clean_v.requires_grad_(), table, segments)
    want, want_grads = _reference_run(clean, ex)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    for g, r in zip(grads, want_grads):
        # the padded keys' own gradients are 0 in both (no query sees them)
        torch.testing.assert_close(g, r, atol=1e-5 * max(r.abs().max().item(), 1), rtol=1e-4)


def test_a_query_that_sees_nothing_gets_the_equations_value(device):
    """Every key of the first row padded: its queries' softmax is over blocked scores (uniform: the terms are
    lost beside -1e30), as eager computes it, not zeros and not NaN; the other row is skipped as usual. No
    gradient flows back through the blocked queries here (their outputs are padding: a loss ignores them), and
    every gradient equals the equation's."""
    from dietpe.attention.kernels.attention import fused_attention

    from tests.attention.kernels.test_attention import reference

    inputs, ex = _case(device, torch.float32, b=2, h=2, lq=N, lk=N, dq=16, dv=16, table_heads=2, nseg=2)
    ex = dataclasses.replace(ex, mask=_padding(2, N, TAIL, every_key_of_row=0).to(device))
    leaves = [x for x in inputs if x is not None]
    w = torch.randn(2, 2, N, 16, generator=torch.Generator().manual_seed(1)).to(device)
    w[0] = 0  # the blocked row's outputs reach no loss
    out = fused_attention(*inputs[:3], 0.3, *inputs[3:], ex)
    want = reference(*inputs[:3], 0.3, *inputs[3:], ex)
    assert torch.isfinite(out).all() and out[0].abs().sum() > 0
    _assert_close((out, torch.autograd.grad((out * w).sum(), leaves)),
                  (want, torch.autograd.grad((want * w).sum(), leaves)))


@pytest.mark.parametrize("mask_kind", ["a-row-all-padded", "left-padding-causal"])
def test_a_query_that_sees_nothing_passes_no_gradient_even_where_a_loss_reads_it(mask_kind, device):
    """Its log-sum-exp (about -1.4e30) keeps no digits to recompute P from: the kernel passes no gradient through
    such a query, finite, where recomputing would overflow into gradients many times the others' (a loss that
    reads padding: pad tokens left unmasked in the labels, a mean over every position). The gradients equal the
    equation's with that query's output read by no loss."""
    from dietpe.attention.kernels.attention import fused_attention

    from tests.attention.kernels.test_attention import reference

    causal = mask_kind.endswith("causal")
    inputs, ex = _case(device, torch.float32, b=2, h=2, lq=N, lk=N, dq=16, dv=16, table_heads=2, nseg=2,
                       causal=causal)
    mask = _padding(2, N, TAIL, left=causal, every_key_of_row=None if causal else 0)
    ex = dataclasses.replace(ex, mask=mask.to(device))
    leaves = [x for x in inputs if x is not None]
    w = torch.randn(2, 2, N, 16, generator=torch.Generator().manual_seed(1)).to(device)  # reads every query
    out = fused_attention(*inputs[:3], 0.3, *inputs[3:], ex)
    want = reference(*inputs[:3], 0.3, *inputs[3:], ex)
    got = torch.autograd.grad((out * w).sum(), leaves)
    for g in got:
        assert torch.isfinite(g).all()
    reads = (_weights(ex, out.shape, device) != 0).to(w.dtype)  # 0 on the queries that see no open key
    _assert_close((out, got), (want, torch.autograd.grad((want * reads * w).sum(), leaves)))
