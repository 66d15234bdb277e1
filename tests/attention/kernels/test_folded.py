"""Low-rank factors read as a second head part from their own tensors (`fused_attention(folded=...)`, DIET-ABS's
P_Q P_Kᵀ, DIET eq. 1): the scores gain q2·k2ᵀ·s with no copy of q and k, and the factors' gradients are summed
over the batch (and heads) they are shared by. Against the equation with the factors concatenated to q and k,
values and gradients, and two runs the same bits."""

import pytest
import torch

from tests.attention.kernels.conftest import NO_TRITON, sizes
from tests.attention.kernels.test_attention import _case, reference
from tests.conftest import TEST_DEVICE

pytest.importorskip("triton", reason=NO_TRITON)

L = sizes(13, 301)


def _factors(device, dtype, b, h, lq, lk, r):
    g = torch.Generator().manual_seed(5)
    leaf = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype).requires_grad_()  # noqa: E731
    return leaf(b, h, lq, r), leaf(b, h, lk, r)


def _loss(out):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    return (out.float() * w).sum()


# (dtype, batch, heads, head size, value size, rank, factor batch, factor heads, terms)
CASES = {
    "fp32 shared by the batch, rank 16, table, padding": (torch.float32, 2, 2, 16, 16, 16, 1, 2,
                                                          dict(table_heads=2, mask="padding")),
    "fp32 per example, rank 12 (masked channels), causal": (torch.float32, 2, 2, 32, 16, 12, 2, 2,
                                                            dict(causal=True)),
    "fp32 shared by batch and heads, head 8, segments": (torch.float32, 2, 3, 8, 8, 24, 1, 1, dict(nseg=2)),
    "bf16 shared by the batch, rank 64, table, documents": (torch.bfloat16, 2, 2, 64, 64, 64, 1, 2,
                                                            dict(table_heads=2, mask="documents")),
}


@pytest.mark.parametrize("name", CASES)
def test_folded_factors_match_the_equation_with_gradients(name, device):
    from dietpe.attention.kernels.attention import fused_attention

    dtype, b, h, dq, dv, r, fb, fh, terms = CASES[name]
    (q, k, v, table, segments), ex = _case(device, dtype, b, h, L, L + 2, dq, dv, **terms)
    q2, k2 = _factors(device, dtype, fb, fh, L, L + 2, r)
    scale = 0.3
    out = fused_attention(q, k, v, scale, table, segments, ex, folded=(q2, k2))
    leaves = [x for x in (q, k, v, table, segments, q2, k2) if x is not None]
    grads = torch.autograd.grad(_loss(out), leaves)
    wide_q = torch.cat([q, q2.expand(b, h, -1, -1)], -1)  # the equation: the factors as extra channels
    wide_k = torch.cat([k, k2.expand(b, h, -1, -1)], -1)
    want = reference(wide_q, wide_k, v, scale, table, segments, ex)
    want_grads = torch.autograd.grad(_loss(want), leaves)
    bf16 = dtype == torch.bfloat16
    tol = dict(atol=2e-2, rtol=2e-2) if bf16 else dict(atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out, want, **tol)
    for got, ref in zip(grads, want_grads):
        size = max(ref.abs().max().item(), 1)
        assert got.shape == ref.shape
        torch.testing.assert_close(got.float(), ref.float(), atol=(3e-2 if bf16 else 1e-5) * size,
                                   rtol=3e-2 if bf16 else 1e-4)
    again = fused_attention(q, k, v, scale, table, segments, ex, folded=(q2, k2))
    assert torch.equal(out, again)
    assert all(torch.equal(a, c) for a, c in zip(grads, torch.autograd.grad(_loss(again), leaves)))


def test_a_head_loaded_in_two_parts_cannot_take_folded_factors():
    from dietpe.attention.kernels.attention import fused_attention

    (q, k, v, *_), ex = _case(TEST_DEVICE, torch.float32, 1, 2, 8, 8, 24, 16)
    q2, k2 = _factors(TEST_DEVICE, torch.float32, 1, 2, 8, 8, 16)
    with pytest.raises(ValueError, match="head size must be a power of two or at most 16, got 24"):
        fused_attention(q, k, v, 0.3, None, None, ex, folded=(q2, k2))
