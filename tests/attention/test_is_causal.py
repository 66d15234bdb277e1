"""Causality alone reaches SDPA as `is_causal=True` with no mask (flash's causal mode on a GPU); padding, cached
keys or a dense term keep the additive mask. Outputs and gradients stay the eager reference's for every causal
method, in the causal LM and in the translation decoder."""

import pytest
import torch
import torch.nn.functional as F

from dietpe import DietForCausalLM
from dietpe.attention.masks import CausalMask, dense_mask
from dietpe.models.causal import CAUSAL_POSITIONS
from dietpe.models.seq2seq import DietForConditionalGeneration, step_mask
from tests.models.test_causal import V, tiny_lm
from tests.models.test_seq2seq import source, tiny_s2s


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Every call of torch's SDPA as (is_causal, has a mask, q width, v width)."""
    calls = []
    real = F.scaled_dot_product_attention

    def record(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((is_causal, attn_mask is not None, q.shape[-1], v.shape[-1]))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    return calls


def _pair(make, config_of, position, **overrides):
    """The model with the default backend and the same weights under the eager reference."""
    fast = make(config_of(position, **overrides))
    ref = make(config_of(position, attn_backend="eager", **overrides))
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def _assert_same_grads(fast, ref):
    grads = dict(ref.named_parameters())
    for name, p in fast.named_parameters():
        if p.grad is not None or grads[name].grad is not None:
            torch.testing.assert_close(p.grad, grads[name].grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("position", CAUSAL_POSITIONS)
def test_causal_lm_equals_the_reference_with_gradients(position):
    fast, ref = _pair(DietForCausalLM, tiny_lm, position)
    ids = torch.randint(3, V, (2, 9))
    outs = []
    for model in (fast, ref):
        out = model.train()(ids, labels=ids)
        out.loss.backward()
        outs.append(out.logits)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    _assert_same_grads(fast, ref)
    with torch.no_grad():  # inference: Shaw's banded paths, kept position terms
        torch.testing.assert_close(fast.eval()(ids).logits, ref.eval()(ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("position", ["none", "shaw", "t5", "diet-rel", "rotary", "alibi"])
def test_decoder_equals_the_reference_with_gradients(position):
    fast, ref = _pair(DietForConditionalGeneration, tiny_s2s, position)
    src, mask = source()
    target = torch.randint(3, 40, (3, 8))
    outs = []
    for model in (fast, ref):
        out = model.train()(src, attention_mask=mask, labels=target)
        out.loss.backward()
        outs.append(out.logits)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    _assert_same_grads(fast, ref)


@pytest.mark.parametrize("position,plain", [("none", True), ("rotary", True), ("sinusoidal", True),
                                            ("diet-abs", True), ("alibi", False), ("t5", False)])
def test_sdpa_gets_is_causal_without_a_mask_when_nothing_else_is_added(position, plain, sdpa_calls):
    """DIET-ABS at rank 4 is folded into q/k channels (no bias); ALiBi and T5 leave a bias, so the causal mask
    is added to it."""
    extra = dict(position_rank=4) if position == "diet-abs" else {}
    model = DietForCausalLM(tiny_lm(position, **extra)).train()
    ids = torch.randint(3, V, (2, 9))
    model(ids, labels=ids).loss.backward()
    assert len(sdpa_calls) == 2
    assert all(c[:2] == ((True, False) if plain else (False, True)) for c in sdpa_calls), sdpa_calls


def test_padding_and_cached_keys_keep_the_mask(sdpa_calls):
    model = DietForCausalLM(tiny_lm("rotary")).eval()
    ids = torch.randint(3, V, (2, 9))
    pad = torch.ones_like(ids)
    pad[0, :2] = 0  # left padding
    with torch.no_grad():
        model(ids, attention_mask=pad)
        assert sdpa_calls == [(False, True, 8, 8)] * 2
        sdpa_calls.clear()
        model(ids, attention_mask=torch.ones_like(ids))  # nothing padded: causality alone
        assert [c[:2] for c in sdpa_calls] == [(True, False)] * 2
        sdpa_calls.clear()
        out = model(ids[:, :4], use_cache=True)  # the prompt: nothing cached yet
        out = model(ids[:, 4:6], past_key_values=out.past_key_values, use_cache=True)  # two new tokens after 4
        out = model(ids[:, 6:7], past_key_values=out.past_key_values, use_cache=True)  # one token sees every key
    assert [c[:2] for c in sdpa_calls] == [(True, False)] * 2 + [(False, True)] * 2 + [(False, False)] * 2


def test_decoder_self_attention_gets_is_causal(sdpa_calls):
    model = DietForConditionalGeneration(tiny_s2s("rotary")).eval()
    src, mask = source()
    target = torch.randint(3, 40, (3, 8))
    with torch.no_grad():
        model(src, attention_mask=mask, labels=target)
    causal = [c for c in sdpa_calls if c[0]]
    assert len(causal) == 3 and not any(c[1] for c in causal)  # one per decoder layer, no mask beside it
    sdpa_calls.clear()
    dec_pad = torch.ones_like(target)
    dec_pad[0, 6:] = 0
    with torch.no_grad():
        model(src, attention_mask=mask, labels=target, decoder_attention_mask=dec_pad)
    assert not any(c[0] for c in sdpa_calls)


def test_the_marker_builds_out_as_the_additive_causal_mask():
    mask = step_mask(2, 0, 5, None, torch.float32, torch.device("cpu"))
    assert isinstance(mask, CausalMask)
    dense = dense_mask(mask)
    assert dense is mask.dense() and dense.shape == (1, 1, 5, 5)  # built once: one tensor for every layer
    assert torch.equal(dense[0, 0] == 0, torch.ones(5, 5, dtype=torch.bool).tril())
    assert (dense[0, 0].triu(1) == torch.finfo(torch.float32).min).sum() == 10
    cached = step_mask(2, 3, 5, None, torch.float32, torch.device("cpu"))
    assert isinstance(cached, torch.Tensor) and cached.shape == (1, 1, 5, 8)  # is_causal's diagonal would be wrong


def test_folded_widths_with_is_causal_off_the_cpu(probe_device, sdpa_calls):
    """Off the CPU every low-rank term is folded; with no bias left, v takes q's width, so flash can serve it."""
    model = DietForCausalLM(tiny_lm("diet-abs", position_rank=16, hidden_size=128)).to(probe_device).train()
    ids = torch.randint(3, V, (2, 9), device=probe_device)
    model(ids, labels=ids).loss.backward()
    assert sdpa_calls and all(c[0] and not c[1] and c[2] == c[3] == 64 + 16 for c in sdpa_calls), sdpa_calls
