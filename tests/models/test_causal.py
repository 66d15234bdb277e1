"""The decoder-only LM: every causal method generates identically with and without the cache, cached steps give
the full forward's logits, left-padded prompts, causality, refusals at build time, save and load, and T5's
unidirectional buckets in causal attention (also in the translation decoder). The paper-equation references
under a causal mask are in tests/positions/test_references.py."""

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.models.t5.modeling_t5 import T5Attention

from dietpe import ConfigError, DietCausalConfig, DietForCausalLM, InputError
from dietpe.models.causal import CAUSAL_POSITIONS
from dietpe.models.seq2seq import DietForConditionalGeneration
from tests.conftest import method_fields
from tests.models.test_seq2seq import tiny_s2s

V = 40


def tiny_lm(position: str, **overrides) -> DietCausalConfig:
    base = dict(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                **method_fields(position), position=position, initializer_range=0.5)
    return DietCausalConfig(**{**base, **overrides})


@pytest.mark.parametrize("position", CAUSAL_POSITIONS)
def test_cached_steps_give_the_full_forward_logits(position):
    model = DietForCausalLM(tiny_lm(position)).eval()
    ids = torch.randint(3, V, (2, 9))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :4], use_cache=True)  # a prompt of 4, then one token per step
        steps = [out.logits]
        for t in range(4, 9):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
    assert out.past_key_values.get_seq_length() == 9
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", CAUSAL_POSITIONS)
def test_generate_with_and_without_cache_is_identical(position):
    model = DietForCausalLM(tiny_lm(position)).eval()
    prompt = torch.randint(3, V, (3, 4))
    # beam search reorders the cache: once, for T5's causal buckets (each method greedy)
    for beams in (1, 3) if position == "t5" else (1,):
        kwargs = dict(num_beams=beams, max_new_tokens=6, min_new_tokens=6, no_repeat_ngram_size=1, pad_token_id=0)
        cached = model.generate(prompt, use_cache=True, **kwargs)
        uncached = model.generate(prompt, use_cache=False, **kwargs)
        assert cached.shape == (3, 10) and len(set(cached[0, 4:].tolist())) == 6
        assert torch.equal(cached, uncached)


@pytest.mark.parametrize("beams", [1, 3])
def test_cached_generation_feeds_one_token_per_step(beams):
    """The cache reaches the model under the name `generate()` uses (`cache` from transformers 5.24 on,
    `past_key_values` before): after the prompt, one new token per step, never the whole sequence again."""
    model = DietForCausalLM(tiny_lm("diet-rel")).eval()
    lengths = []
    model.diet.register_forward_hook(lambda mod, args, kwargs, out: lengths.append(
        (args[0] if args else kwargs["input_ids"]).shape[1]), with_kwargs=True)
    prompt = torch.randint(3, V, (3, 4))
    kwargs = dict(num_beams=beams, max_new_tokens=5, min_new_tokens=5, pad_token_id=0)
    model.generate(prompt, use_cache=True, **kwargs)
    assert lengths == [4, 1, 1, 1, 1]
    lengths.clear()
    model.generate(prompt, use_cache=False, **kwargs)
    assert lengths == [4, 5, 6, 7, 8]


@pytest.mark.parametrize("position", ["absolute", "kerple"])
def test_left_padded_prompts_generate_as_if_alone(position):
    """Positions come from the attention mask: a left-padded row starts at position 0, as it would alone."""
    model = DietForCausalLM(tiny_lm(position)).eval()
    prompt = torch.randint(3, V, (2, 5))
    mask = torch.ones_like(prompt)
    prompt[1, :2], mask[1, :2] = 0, 0
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, pad_token_id=0, do_sample=False)
    batch = model.generate(prompt, attention_mask=mask, use_cache=True, **kwargs)
    assert torch.equal(batch, model.generate(prompt, attention_mask=mask, use_cache=False, **kwargs))
    alone = model.generate(prompt[1:, 2:], use_cache=True, **kwargs)
    assert torch.equal(batch[1, 2:], alone[0])


@pytest.mark.parametrize("position", CAUSAL_POSITIONS)
def test_model_is_causal_and_the_loss_predicts_the_next_token(position):
    model = DietForCausalLM(tiny_lm(position)).eval()
    ids = torch.randint(3, V, (2, 8))
    changed = ids.clone()
    changed[:, 5:] = torch.randint(3, V, (2, 3))
    with torch.no_grad():
        a, b = model(ids, labels=ids), model(changed).logits
    torch.testing.assert_close(a.logits[:, :5], b[:, :5])
    expected = torch.nn.functional.cross_entropy(a.logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(a.loss, expected)


def test_nope_still_sees_order_through_the_mask():
    """NoPE: no position term, yet a causal model's output depends on order (a bidirectional one's does not)."""
    model = DietForCausalLM(tiny_lm("none")).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        last = model(ids).logits[0, -1]
        swapped = model(ids[:, [1, 0, 2, 3]]).logits[0, -1]
    assert (last - swapped).abs().max() > 1e-4


def test_config_refuses_what_cannot_be_causal():
    with pytest.raises(ConfigError, match="tupe_reset=False"):
        tiny_lm("tupe-a", tupe_reset=True)
    with pytest.raises(ConfigError, match="attention='full'"):
        tiny_lm("absolute", attention="linformer", linformer_k=6)
    with pytest.raises(ConfigError, match="segment='none'"):
        tiny_lm("diet-rel", segment="per-head")
    assert "tupe-r" in CAUSAL_POSITIONS and tiny_lm("tupe-r").tupe_reset is False


def test_learned_tables_refuse_lengths_beyond_them_while_generating():
    model = DietForCausalLM(tiny_lm("absolute")).eval()
    with pytest.raises(InputError, match="max_position_embeddings=24"):
        model.generate(torch.randint(3, V, (1, 20)), max_new_tokens=8, min_new_tokens=8, pad_token_id=0)
    with pytest.raises(InputError, match=r"attention_mask has shape"):
        model(torch.randint(3, V, (1, 3)), attention_mask=torch.ones(1, 4, dtype=torch.long),
              past_key_values=DynamicCache(), use_cache=True)


def test_save_and_load_through_the_auto_class(tmp_path):
    model = DietForCausalLM(tiny_lm("kerple")).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, DietForCausalLM) and loaded.config.causal
    ids = torch.randint(3, V, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)
    assert loaded.lm_head.decoder.weight.data_ptr() == loaded.diet.embeddings.word_embeddings.weight.data_ptr()


def test_t5_buckets_are_unidirectional_in_causal_attention():
    """A causal query at distance n = i - j >= 0 gets T5's decoder bucket; all buckets are reachable."""
    lm = DietForCausalLM(tiny_lm("t5")).eval()
    s2s = DietForConditionalGeneration(tiny_s2s("t5")).eval()
    assert lm.diet.positions.method.causal and s2s.decoder.positions.method.causal
    assert not s2s.encoder.positions.method.causal
    from dietpe.positions.t5 import t5_offset_bucket
    offsets = torch.arange(0, 40)  # i - j for keys at or before the query
    ours = t5_offset_bucket(8, 16, causal=True)(offsets)
    assert torch.equal(ours, T5Attention._relative_position_bucket(-offsets, False, 8, 16))
    assert set(ours.tolist()) == set(range(8))  # the bidirectional buckets would leave 4 of 8
    assert len(set(t5_offset_bucket(8, 16)(offsets).tolist())) == 4


def test_cache_under_both_names_is_refused_in_one_line():
    model = DietForCausalLM(tiny_lm("diet-rel")).eval()
    with pytest.raises(InputError, match="both `cache` and `past_key_values`"):
        model(torch.randint(3, V, (1, 4)), past_key_values=DynamicCache(), cache=DynamicCache())


def test_our_forwards_read_the_cache_without_deprecated_names(monkeypatch):
    """The model reads its cache under the name its output class has: a forward (with and without a cache),
    generate() and the translation model never touch the name transformers deprecates (which would warn)."""
    from transformers.utils import generic

    touched = []
    monkeypatch.setattr(generic.logger, "warning_once", lambda msg, *a, **k: touched.append(msg))
    model = DietForCausalLM(tiny_lm("diet-rel")).eval()
    ids = torch.randint(3, V, (2, 5))
    with torch.no_grad():
        model(ids, use_cache=False)
        model(ids, use_cache=True)
        model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
        s2s = DietForConditionalGeneration(tiny_s2s("t5")).eval()
        s2s(input_ids=ids, decoder_input_ids=ids, use_cache=False)
        s2s.generate(ids, max_new_tokens=3, do_sample=False)
    assert touched == []


def test_generate_takes_an_explicit_cache_and_a_prompt_of_embeddings():
    """As Llama's generate() does: a DynamicCache passed in (transformers 5.24 hands it on as `cache`), and a
    prompt given as embeddings, both give the tokens of the plain call."""
    model = DietForCausalLM(tiny_lm("rotary")).eval()
    prompt = torch.randint(3, V, (2, 5))
    kwargs = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
    plain = model.generate(prompt, **kwargs)
    given = model.generate(prompt, past_key_values=DynamicCache(config=model.config), **kwargs)
    assert torch.equal(given, plain)
    embedded = model.generate(inputs_embeds=model.get_input_embeddings()(prompt), **kwargs)
    assert torch.equal(embedded, plain[:, 5:])  # generate() returns the new tokens only for an embedded prompt


def test_bad_labels_and_a_cache_of_another_batch_are_refused():
    model = DietForCausalLM(tiny_lm("alibi")).eval()
    ids = torch.randint(3, V, (2, 5))
    for labels, message in ((torch.full((2, 5), V), f"label {V} is outside the vocabulary \\[0, {V - 1}\\]"),
                            (torch.full((2, 5), -5), "label -5 is outside"),
                            (ids.float(), "labels have dtype torch.float32; they are token ids")):
        with pytest.raises(InputError, match=message):
            model(ids, labels=labels)
    assert torch.isfinite(model(ids, labels=ids.masked_fill(ids > 20, -100)).loss)
    cache = model(ids, use_cache=True).past_key_values
    with pytest.raises(InputError, match="past_key_values holds 2 sequences, but the input has 3"):
        model(torch.randint(3, V, (3, 1)), past_key_values=cache)


def test_a_cache_of_fixed_size_is_refused():
    """A static cache's empty slots would be attended as if they held tokens: refused, naming the fix."""
    model = DietForCausalLM(tiny_lm("none")).eval()
    with pytest.raises(InputError, match="fixed size.*DynamicCache"):
        model.generate(torch.randint(3, V, (2, 5)), max_new_tokens=3, cache_implementation="static", pad_token_id=0)
    s2s = DietForConditionalGeneration(tiny_s2s("sinusoidal")).eval()
    with pytest.raises(InputError, match="fixed size.*DynamicCache"):
        s2s.generate(torch.randint(3, V, (2, 5)), max_new_tokens=3, cache_implementation="static")
