"""The fast paths `dietpe bench` motivated hold to the reference: Toeplitz relative terms (values and gradients
against the gather they replace) and the sdpa backend's query blocks for long inputs."""

import pytest
import torch

from dietpe import DietForMaskedLM
from dietpe.attention import backends
from dietpe.positions.functional import consecutive_offsets, relative_offsets, toeplitz
from tests.conftest import batch, tiny


@pytest.mark.parametrize("lq,lk,q0,k0", [(5, 7, 0, 0), (7, 5, 3, 1), (1, 9, 8, 0), (6, 6, 0, 0), (300, 290, 2, 0)])
def test_toeplitz_equals_gather_with_gradients(lq, lk, q0, k0):
    q_pos, k_pos = torch.arange(lq) + q0, torch.arange(lk) + k0
    values = torch.randn(3, 41, dtype=torch.float64, requires_grad=True)
    full = values[:, relative_offsets(q_pos, k_pos).clamp(-20, 20) + 20]
    fast = toeplitz(values[:, consecutive_offsets(q_pos, k_pos).clamp(-20, 20) + 20], lq, lk)
    assert torch.equal(fast, full)
    grad = torch.randn_like(full)
    (g_full,), (g_fast,) = torch.autograd.grad(full, values, grad), torch.autograd.grad(fast, values, grad)
    torch.testing.assert_close(g_fast, g_full)


def test_consecutive_offsets_refuses_gaps():
    assert consecutive_offsets(torch.tensor([0, 2, 3]), torch.arange(4)) is None
    assert consecutive_offsets(torch.arange(3), torch.arange(4)).tolist() == [-3, -2, -1, 0, 1, 2]


@pytest.mark.parametrize("position,segment", [("diet-rel", "per-head"), ("diet-abs", "per-head"), ("t5", "input"),
                                              ("tupe-r", "input"), ("alibi", "none"), ("xlnet", "input"),
                                              ("none", "input")])
def test_query_blocks_match_eager_with_gradients(monkeypatch, position, segment):
    monkeypatch.setattr(backends, "LONG_ELEMENTS", 40)  # every tiny input counts as long
    monkeypatch.setattr(backends, "BLOCK_ELEMENTS", 40)  # a few query rows per block at this size
    cfg = dict(position=position, segment=segment)
    ref = DietForMaskedLM(tiny(**cfg, attn_backend="eager"))
    fast = DietForMaskedLM(tiny(**cfg, attn_backend="sdpa"))
    fast.load_state_dict(ref.state_dict())
    ids, mask, seg = batch(11)
    outs = []
    for model in (ref, fast):
        out = model(ids, attention_mask=mask, token_type_ids=seg, labels=ids)
        out.loss.backward()
        outs.append((out.logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (lr, gr), (lf, gf) = outs
    torch.testing.assert_close(lf, lr, atol=2e-5, rtol=1e-4)
    assert gr.keys() == gf.keys()
    for name in gr:
        torch.testing.assert_close(gf[name], gr[name], atol=2e-5, rtol=1e-3, msg=name)
    with torch.inference_mode():  # the path without autograd writes blocks into one preallocated output
        torch.testing.assert_close(fast.eval()(ids, attention_mask=mask, token_type_ids=seg).logits,
                                   ref.eval()(ids, attention_mask=mask, token_type_ids=seg).logits,
                                   atol=2e-5, rtol=1e-4)


def _kernel_calls(model, ids, seg, grad=False):
    """(q head size, v head size, has a bias) of every fused-kernel call of one forward."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q.shape[-1], v.shape[-1], attn_mask is not None))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    with pytest.MonkeyPatch.context() as mp, torch.set_grad_enabled(grad):
        mp.setattr(backends.F, "scaled_dot_product_attention", spy)
        model(ids, token_type_ids=seg)
    return calls


@pytest.mark.parametrize("add_keys", [0, 256])
def test_wide_low_rank_terms_are_multiplied_out_and_narrow_ones_folded_or_added(monkeypatch, add_keys):
    """DIET-ABS (d_p = 16 > FOLD_MAX_RANK) goes into the dense bias; per-head segments (rank 2) into q/k channels,
    or, at inference on CPU with at most ADD_LOW_RANK_KEYS keys, into the bias as well."""
    monkeypatch.setattr(backends, "ADD_LOW_RANK_KEYS", add_keys)
    model = DietForMaskedLM(tiny(position="diet-abs", position_rank=16, segment="per-head",
                                 attn_backend="sdpa")).eval()
    ids, _, seg = batch(9, pad_last=0)
    head = model.config.head_size
    calls = _kernel_calls(model, ids, seg)
    want = (head, head, True) if add_keys >= 9 else (head + 2, head + 2, True)  # v padded for the CPU kernel
    assert calls and all(c == want for c in calls)
    calls = _kernel_calls(model.train(), ids, seg, grad=True)  # training keeps the fold (the table's gradient)
    assert calls and all(c[0] == head + 2 for c in calls)
