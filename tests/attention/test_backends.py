"""Every backend computes the reference equation: outputs and gradients, over the tiny-config matrix."""

import itertools

import pytest
import torch

from dietpe import DietConfig, DietForMaskedLM
from dietpe.config import POSITIONS, SEGMENTS
from dietpe.errors import ConfigError
from tests.conftest import batch, tiny

def _valid(position, segment, sharing, attention):
    try:
        tiny(position=position, segment=segment, sharing=sharing, attention=attention)
        return True
    except ConfigError:  # the combinations test_config.py shows are refused
        return False


MATRIX = [
    combo for combo in itertools.product(POSITIONS, SEGMENTS, ("none", "head", "layer"), ("full", "linformer"))
    if combo[0] != "shaw" and _valid(*combo)  # Shaw's value term needs the probabilities: eager (below)
]


def _pair(cfg_kwargs, backend, device="cpu"):
    ref = DietForMaskedLM(tiny(**cfg_kwargs, attn_backend="eager"))
    other = DietForMaskedLM(tiny(**cfg_kwargs, attn_backend=backend))
    other.load_state_dict(ref.state_dict())
    return ref.to(device), other.to(device)


def _run(model, ids, mask, seg):
    out = model(ids, attention_mask=mask, token_type_ids=seg, labels=ids)
    out.loss.backward()
    return out.logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("position,segment,sharing,attention", MATRIX)
def test_sdpa_matches_eager_with_gradients(position, segment, sharing, attention, device):
    ref, fast = _pair(dict(position=position, segment=segment, sharing=sharing, attention=attention), "sdpa",
                      device)
    ids, mask, seg = batch(9, device=device)
    (lr, gr), (lf, gf) = _run(ref, ids, mask, seg), _run(fast, ids, mask, seg)
    torch.testing.assert_close(lf, lr, atol=2e-5, rtol=1e-4)
    assert gr.keys() == gf.keys()
    learned = [n for n, _ in ref.named_parameters() if n.startswith("diet.positions")]
    assert all(n in gr for n in learned), "every position parameter gets a gradient"
    for name in gr:
        torch.testing.assert_close(gf[name], gr[name], atol=2e-5, rtol=1e-3, msg=name)


@pytest.mark.parametrize("position,segment,rank", [("diet-abs", "per-head", None), ("diet-rel", "per-head", None),
                                                   ("none", "per-head", None), ("diet-abs", "input", 4),
                                                   ("diet-abs", "per-head", 4), ("tupe-r", "per-head", None)])
@pytest.mark.parametrize("add_keys", [0, 256])
def test_sdpa_inference_adds_or_folds_low_rank_terms_as_eager(monkeypatch, position, segment, rank, add_keys):
    """At inference on CPU, low-rank terms (segments, DIET-ABS of rank <= 8) go into the bias up to
    ADD_LOW_RANK_KEYS keys and into q/k channels above: both equal the reference, with and without padding
    (the mask then broadcasts over heads, a position-only product over the batch)."""
    from dietpe.attention import backends

    monkeypatch.setattr(backends, "ADD_LOW_RANK_KEYS", add_keys)
    cfg = dict(position=position, segment=segment) | ({"position_rank": rank} if rank else {})
    ref, fast = _pair(cfg, "sdpa")
    for pad in (0, 3):
        ids, mask, seg = batch(9, pad_last=pad)
        with torch.inference_mode():
            want = ref.eval()(ids, attention_mask=mask, token_type_ids=seg).logits
            got = fast.eval()(ids, attention_mask=mask, token_type_ids=seg).logits
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_shaw_trains_on_eager_and_is_refused_by_fused_backends():
    model = DietForMaskedLM(tiny(position="shaw"))  # auto -> eager
    ids, mask, seg = batch(9)
    _, grads = _run(model, ids, mask, seg)
    assert grads["diet.positions.method.value"].abs().sum() > 0
    for backend in ("sdpa", "flex"):
        with pytest.raises(ConfigError, match=f"attn_backend='{backend}' cannot serve position='shaw': the "
                                              f"method's value term needs the attention probabilities"):
            tiny(position="shaw", attn_backend=backend)


def test_flex_refuses_attention_dropout_at_build_time():
    with pytest.raises(ConfigError, match="attn_backend='flex' cannot serve .*no attention dropout, but "
                                          "attention_probs_dropout_prob=0.1"):
        DietConfig(attn_backend="flex", attention_probs_dropout_prob=0.1)


def test_padding_does_not_change_real_tokens():
    model = DietForMaskedLM(tiny(position="diet-rel", segment="per-head")).eval()
    ids, _, seg = batch(8, batch_size=1, pad_last=0)
    padded = torch.cat([ids, torch.ones(1, 3, dtype=ids.dtype)], 1)
    mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 3, dtype=ids.dtype)], 1)
    seg_p = torch.cat([seg, torch.ones(1, 3, dtype=seg.dtype)], 1)
    with torch.no_grad():
        a = model(ids, token_type_ids=seg).logits
        b = model(padded, attention_mask=mask, token_type_ids=seg_p).logits[:, :8]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("position,sums_at_inference,sums_in_training",
                         [("t5", 1, 3), ("alibi", 1, 3), ("diet-rel", 3, 3), ("tupe-r", 1, 1)])
def test_layers_sharing_a_position_term_sum_it_with_the_mask_once_at_inference(position, sums_at_inference,
                                                                               sums_in_training, monkeypatch):
    """T5's and ALiBi's one term serves every layer: at inference its cast and its sum with the mask are made
    once a forward on sdpa; DIET-REL's per-layer tables are summed per layer; with gradients, per layer, except
    TUPE-R's two shared terms (its correlation and buckets), summed once in training too."""
    from dietpe.attention import backends

    sums = []
    real = backends._sum
    monkeypatch.setattr(backends, "_sum", lambda *a: sums.append(1) or real(*a))
    model = DietForMaskedLM(tiny(position=position, attn_backend="sdpa", num_hidden_layers=3))
    ids, mask, seg = batch(10)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        shared = model.eval()(ids, attention_mask=mask, token_type_ids=seg).logits
    assert len(sums) == sums_at_inference
    sums.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, attention_mask=mask, token_type_ids=seg, labels=ids).loss.backward()
    assert len(sums) == sums_in_training
    from dietpe.positions.terms.logit import LogitTerm

    monkeypatch.setattr(LogitTerm, "per_forward", lambda self, name, build: build())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # each layer its own sum: the same bits
        torch.testing.assert_close(model(ids, attention_mask=mask, token_type_ids=seg).logits, shared, rtol=0,
                                   atol=0)


def test_a_terms_kept_sum_is_one_entry_that_a_new_mask_replaces():
    """A context reused across forwards (each with its own mask) keeps one sum per term, not one per mask."""
    import gc
    import weakref

    from dietpe.attention import backends
    from dietpe.positions.terms.logit import LogitTerm

    class Fixed(LogitTerm):
        def build(self, q, rows):
            return torch.ones(1, 2, 3, 3)

    term, q = Fixed((3, 3), 1, 2), torch.zeros(1, 2, 3, 4)
    with torch.no_grad():
        masks = [torch.zeros(1, 1, 1, 3), torch.full((1, 1, 1, 3), -1.0)]
        first = backends._summed_bias([term], masks[0], q, torch.float32)
        assert backends._summed_bias([term], masks[0], q, torch.float32) is first  # the next layer's
        gone = weakref.ref(masks.pop(0))
        second = backends._summed_bias([term], masks[0], q, torch.float32)
    gc.collect()
    assert second is not first and torch.equal(second, torch.zeros(1, 2, 3, 3)) and gone() is None
