"""Shaw's inference paths (dietpe.attention.banded) compute the reference equation: the banded path over every
block layout, masks, per-head segments folded in, causal attention and cached decoding, and the dense path for
short inputs; `auto` takes them at inference only."""

import pytest
import torch

from dietpe import DietCausalConfig, DietForCausalLM, DietForMaskedLM
from dietpe.attention import backends, banded
from dietpe.positions.terms import Band, LayerTerms, QueryRelativeBias, ValueTerm
from dietpe.positions.functional import clipped_offset_index, relative_offsets
from tests.conftest import batch, tiny


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 queries and no minimum length: tiny inputs span many blocks, edges included."""
    monkeypatch.setattr(banded, "BLOCK", 4)
    monkeypatch.setattr(banded, "MIN_KEYS", 0)
    calls = []
    real = banded.banded

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, block=4, **{k: v for k, v in kwargs.items() if k != "block"})

    monkeypatch.setattr(banded, "banded", counted)
    return calls


def _terms(lq, lk, delta, k, dh=8, heads=3, b=2):
    """Shaw's key and value terms for queries at delta, delta+1, ... and keys at 0, 1, ..., as Shaw builds them."""
    q_pos, k_pos = torch.arange(lq) + delta, torch.arange(lk)
    index = clipped_offset_index(relative_offsets(q_pos, k_pos), k)
    band = Band(delta, k)
    r = torch.randn(2 * k + 1, 1, dh)
    key = QueryRelativeBias(r, q_pos, k_pos, lambda o: clipped_offset_index(o, k), dh ** -0.5, index=index,
                            band=band)
    value = ValueTerm(torch.randn(2 * k + 1, dh), index, band)
    q, kk, v = torch.randn(b, heads, lq, dh), torch.randn(b, heads, lk, dh), torch.randn(b, heads, lk, dh)
    return q, kk, v, LayerTerms(logits=[key], values=[value]), key, value


@pytest.mark.parametrize("lq,lk,delta,k,block", [
    (13, 13, 0, 3, 4),    # a last block that is not full
    (16, 16, 0, 2, 4),    # blocks that divide the length
    (9, 9, 0, 5, 16),     # one block, the window wider than the input
    (3, 11, 8, 2, 4),     # the last queries of a cache (decoding several tokens at once)
    (1, 12, 11, 3, 4),    # one decoding step
    (20, 20, 0, 1, 8),    # Shaw's smallest band
])
def test_banded_equals_the_reference(lq, lk, delta, k, block):
    q, kk, v, terms, key, value = _terms(lq, lk, delta, k)
    with torch.no_grad():
        ref, _ = backends.eager(q, kk, v, terms, None, 8 ** -0.5, 0.0)
        out = banded.banded(q, kk, v, terms, None, 8 ** -0.5, key, value, [], block=block)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_kind", ["padding", "causal", "-inf padding"])
def test_banded_equals_the_reference_under_masks(mask_kind):
    lq = lk = 14
    q, kk, v, terms, key, value = _terms(lq, lk, 0, 2)
    neg = torch.finfo(torch.float32).min
    if mask_kind == "causal":
        mask = torch.triu(torch.full((lq, lk), neg), 1)[None, None]
    else:  # the second example's first 9 keys masked: whole far-left parts see no key
        mask = torch.zeros(2, 1, 1, lk)
        mask[1, ..., :9] = float("-inf") if mask_kind == "-inf padding" else neg
    with torch.no_grad():
        ref, _ = backends.eager(q, kk, v, terms, mask, 8 ** -0.5, 0.0)
        out = banded.banded(q, kk, v, terms, mask, 8 ** -0.5, key, value, [], block=4)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("segment", ["input", "per-head", "none"])
def test_auto_takes_the_banded_path_at_inference_and_matches_eager(small_blocks, segment):
    ref = DietForMaskedLM(tiny(position="shaw", segment=segment, attn_backend="eager")).eval()
    fast = DietForMaskedLM(tiny(position="shaw", segment=segment)).eval()  # auto
    fast.load_state_dict(ref.state_dict())
    ids, mask, seg = batch(15)
    with torch.no_grad():
        a = ref(ids, attention_mask=mask, token_type_ids=seg).logits
        b = fast(ids, attention_mask=mask, token_type_ids=seg).logits
    assert len(small_blocks) == fast.config.num_hidden_layers  # every layer took the banded path
    torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)


def test_training_and_probabilities_take_the_reference(small_blocks):
    ref = DietForMaskedLM(tiny(position="shaw", attn_backend="eager"))
    fast = DietForMaskedLM(tiny(position="shaw"))
    fast.load_state_dict(ref.state_dict())
    ids, mask, seg = batch(12)
    grads = []
    for model in (ref, fast):
        model(ids, attention_mask=mask, token_type_ids=seg, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert not small_blocks  # a gradient to track: the reference, which keeps the probabilities
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5, msg=name)
    with torch.no_grad():
        out = fast.eval()(ids, attention_mask=mask, token_type_ids=seg, output_attentions=True)
    assert not small_blocks and out.attentions[0].shape[-1] == 12


def test_custom_positions_take_the_reference(small_blocks):
    model = DietForMaskedLM(tiny(position="shaw")).eval()
    ids, mask, seg = batch(10)
    gaps = torch.tensor([0, 1, 2, 5, 6, 7, 9, 10, 11, 12])  # not consecutive: no band
    ref = DietForMaskedLM(tiny(position="shaw", attn_backend="eager")).eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        a = model(ids, attention_mask=mask, token_type_ids=seg, position_ids=gaps).logits
        b = ref(ids, attention_mask=mask, token_type_ids=seg, position_ids=gaps).logits
        assert not small_blocks
        model(ids, attention_mask=mask, token_type_ids=seg, position_ids=torch.arange(10) + 3)  # shifted: a band
    assert len(small_blocks) == 2
    torch.testing.assert_close(a, b)


def _shaw_lms():
    """A causal Shaw LM on `auto` and the same weights on the eager reference."""
    cfg = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
               max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               shaw_max_distance=3, position="shaw", initializer_range=0.5)
    fast = DietForCausalLM(DietCausalConfig(**cfg)).eval()
    ref = DietForCausalLM(DietCausalConfig(**cfg, attn_backend="eager")).eval()
    ref.load_state_dict(fast.state_dict())
    return fast, ref


def test_causal_lm_generates_the_same_on_the_banded_path(small_blocks):
    fast, ref = _shaw_lms()
    ids = torch.randint(3, 40, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(fast(ids).logits, ref(ids).logits, atol=2e-5, rtol=1e-4)
        n = len(small_blocks)
        out = fast(ids[:, :6], use_cache=True)
        steps = [out.logits]
        for t in range(6, 11):  # one query against the cache: delta = its position
            out = fast(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    assert len(small_blocks) > n
    torch.testing.assert_close(torch.cat(steps, 1), ref(ids).logits, atol=2e-5, rtol=1e-4)


@pytest.fixture
def dense_only(monkeypatch):
    """Every input counts as short: the dense path."""
    monkeypatch.setattr(banded, "MIN_KEYS", 10 ** 9)
    calls = []
    real = banded.dense

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(banded, "dense", counted)
    return calls


@pytest.mark.parametrize("segment", ["input", "per-head"])
def test_dense_path_equals_eager(dense_only, segment):
    ref = DietForMaskedLM(tiny(position="shaw", segment=segment, attn_backend="eager")).eval()
    fast = DietForMaskedLM(tiny(position="shaw", segment=segment)).eval()
    fast.load_state_dict(ref.state_dict())
    ids, mask, seg = batch(13)
    with torch.no_grad():
        a = ref(ids, attention_mask=mask, token_type_ids=seg).logits
        b = fast(ids, attention_mask=mask, token_type_ids=seg).logits
    assert len(dense_only) == fast.config.num_hidden_layers
    torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)


def test_dense_path_serves_causal_lm_and_decoding(dense_only):
    fast, ref = _shaw_lms()
    ids = torch.randint(3, 40, (2, 9))
    with torch.no_grad():
        out = fast(ids[:, :5], use_cache=True)
        steps = [out.logits]
        for t in range(5, 9):
            out = fast(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
        torch.testing.assert_close(torch.cat(steps, 1), ref(ids).logits, atol=2e-5, rtol=1e-4)
    assert len(dense_only) == 2 * 5


def test_plan_names_what_it_cannot_serve(monkeypatch):
    monkeypatch.setattr(banded, "MIN_KEYS", 0)
    q, kk, v, terms, key, value = _terms(10, 10, 0, 2)
    with torch.no_grad():
        assert banded.plan(q, kk, terms, 0.0)[0] is banded.banded
        assert banded.plan(q, kk, terms, 0.1) is None  # attention dropout needs the probabilities
        assert banded.plan(q.double(), kk, terms, 0.0) is None
        assert banded.plan(q.bfloat16(), kk, terms, 0.0) is None  # the reference's softmax is float32
        monkeypatch.setattr(banded, "MIN_KEYS", 11)
        assert banded.plan(q, kk, terms, 0.0) is None  # short, and no one-hot offered: the reference
    monkeypatch.setattr(banded, "MIN_KEYS", 0)
    assert banded.plan(q.requires_grad_(), kk, terms, 0.0) is None  # a gradient to track
    unbanded = LayerTerms(logits=[key], values=[ValueTerm(value.a, value.index)])
    with torch.no_grad():
        assert banded.plan(q, kk, unbanded, 0.0) is None
