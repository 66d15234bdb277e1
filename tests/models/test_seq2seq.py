"""The encoder-decoder: every position method causal in the decoder, cached decoding identical to uncached,
no position terms in cross-attention, learned tables refusing long decodes, presets, save and load."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from dietpe import ConfigError, DietConfig, InputError
from dietpe.config import POSITIONS
from dietpe.models.seq2seq import DietForConditionalGeneration, DietSeq2SeqConfig, shift_right
from tests.conftest import method_fields


def tiny_s2s(position: str, **overrides) -> DietSeq2SeqConfig:
    # decoder deeper than the encoder: catches any layer count taken from the wrong side
    base = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_decoder_layers=3, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=24, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, **method_fields(position),
                position=position, initializer_range=0.5)
    return DietSeq2SeqConfig(**{**base, **overrides})


def source(batch=3, length=7, vocab=40):
    ids = torch.randint(3, vocab, (batch, length))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    return ids, mask


@pytest.mark.parametrize("position", POSITIONS)
def test_cached_steps_give_the_full_forward_logits(position):
    model = DietForConditionalGeneration(tiny_s2s(position)).eval()
    src, mask = source()
    target = torch.randint(3, 40, (3, 9))
    with torch.no_grad():
        full = model(src, mask, decoder_input_ids=target).logits  # (B, T, V), one causal pass
        out = model(src, mask, decoder_input_ids=target[:, :1], use_cache=True)
        steps = [out.logits]
        for t in range(1, target.shape[1]):
            out = model(src, mask, decoder_input_ids=target[:, t:t + 1], past_key_values=out.past_key_values,
                        encoder_outputs=(out.encoder_last_hidden_state,), use_cache=True)
            steps.append(out.logits)
    assert out.past_key_values.get_seq_length() == target.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_with_and_without_cache_is_identical(position, num_beams):
    model = DietForConditionalGeneration(tiny_s2s(position)).eval()
    src, mask = source()
    # no_repeat_ngram_size=1 keeps a random model from repeating one token, so the ids say something
    kwargs = dict(attention_mask=mask, num_beams=num_beams, max_new_tokens=10, min_new_tokens=10,
                  no_repeat_ngram_size=1, length_penalty=0.6)
    cached = model.generate(src, use_cache=True, **kwargs)
    uncached = model.generate(src, use_cache=False, **kwargs)
    assert cached.shape == (3, 11)
    assert len(set(cached[0, 1:].tolist())) == 10
    assert torch.equal(cached, uncached)


def test_cached_generation_feeds_one_token_per_step():
    model = DietForConditionalGeneration(tiny_s2s("diet-rel")).eval()
    lengths = []
    model.decoder.register_forward_hook(lambda mod, args, out: lengths.append(args[0].shape[1]))
    src, mask = source()
    model.generate(src, attention_mask=mask, num_beams=3, max_new_tokens=6, min_new_tokens=6, use_cache=True)
    assert lengths == [1] * 6
    lengths.clear()
    model.generate(src, attention_mask=mask, num_beams=3, max_new_tokens=6, min_new_tokens=6, use_cache=False)
    assert lengths == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("position", POSITIONS)
def test_decoder_is_causal(position):
    model = DietForConditionalGeneration(tiny_s2s(position)).eval()
    src, mask = source()
    target = torch.randint(3, 40, (3, 8))
    changed = target.clone()
    changed[:, 5:] = torch.randint(3, 40, (3, 3))
    with torch.no_grad():
        a = model(src, mask, decoder_input_ids=target).logits
        b = model(src, mask, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("position", ["sinusoidal", "shaw", "diet-rel", "diet-abs", "rotary", "t5"])
def test_cross_attention_has_no_position_terms(position):
    """Permuting the encoder states (and their mask) leaves the decoder unchanged: cross-attention sees the
    source as a set; source order reaches it only through what the encoder put into the states."""
    model = DietForConditionalGeneration(tiny_s2s(position)).eval()
    src, mask = source()
    target = torch.randint(3, 40, (3, 6))
    perm = torch.randperm(src.shape[1])
    with torch.no_grad():
        memory = model.encoder(src, mask).last_hidden_state
        a = model(attention_mask=mask, encoder_outputs=(memory,), decoder_input_ids=target).logits
        b = model(attention_mask=mask[:, perm], encoder_outputs=(memory[:, perm],), decoder_input_ids=target).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_decoder_self_attention_sees_positions():
    """The opposite check for the decoder's own terms: with diet-rel and no input positions, the decoder's
    output depends on where the tokens are."""
    model = DietForConditionalGeneration(tiny_s2s("diet-rel")).eval()
    src, mask = source()
    target = torch.tensor([[5, 6, 7, 8]] * 3)
    swapped = torch.tensor([[6, 5, 7, 8]] * 3)  # the same set of earlier tokens before the last one
    with torch.no_grad():
        a = model(src, mask, decoder_input_ids=target).logits[:, -1]
        b = model(src, mask, decoder_input_ids=swapped).logits[:, -1]
    assert not torch.allclose(a, b, atol=1e-4)


def test_encoder_and_decoder_position_parameters_are_separate():
    model = DietForConditionalGeneration(tiny_s2s("diet-rel"))
    enc, dec = model.encoder.positions.method.r, model.decoder.positions.method.r
    assert enc.shape[0] == 2 and dec.shape[0] == 3  # per layer: 2 encoder, 3 decoder layers
    assert enc.data_ptr() != dec.data_ptr()
    shaw = DietForConditionalGeneration(tiny_s2s("shaw"))
    assert shaw.decoder.positions.method.key.shape[0] == 3


def test_the_decoder_takes_the_encoders_method_fields():
    """Not a causal LM's defaults: DIET-REL unclipped as in the paper's translation runs (lengths stay within
    the table), TUPE's reset on the decoder's start token, which stands where [CLS] does."""
    rel = DietForConditionalGeneration(tiny_s2s("diet-rel"))
    assert rel.decoder.positions.method.span == rel.encoder.positions.method.span == 23
    tupe = DietForConditionalGeneration(tiny_s2s("tupe-a"))
    assert tupe.config.decoder_view().tupe_reset is True and tupe.decoder.positions.method.reset
    off = DietForConditionalGeneration(tiny_s2s("tupe-a", tupe_reset=False))
    assert not off.decoder.positions.method.reset


def test_mismatched_batches_labels_and_flags_are_refused():
    model = DietForConditionalGeneration(tiny_s2s("t5")).eval()
    src, mask = source()  # 3 sources
    target = torch.randint(3, 40, (3, 4))
    for kwargs, message in ((dict(decoder_input_ids=target[:1]), "hold 1 sequences, the source 3"),
                            (dict(decoder_input_ids=target, labels=target[:, :3]), "labels have shape \\(3, 3\\)"),
                            (dict(decoder_input_ids=target, labels=target.float()), "dtype torch.float32"),
                            (dict(labels=torch.full((3, 4), 40)), "label 40 is outside the vocabulary")):
        with pytest.raises(InputError, match=message):
            model(src, mask, **kwargs)
    assert torch.isfinite(model(src, mask, labels=target).loss)
    for name in ("scale_embedding", "use_cache"):
        with pytest.raises(ConfigError, match=f"{name}='no' must be true or false"):
            tiny_s2s("t5", **{name: "no"})


def test_learned_table_refuses_long_decodes():
    model = DietForConditionalGeneration(tiny_s2s("absolute", max_position_embeddings=8)).eval()
    assert model.max_decode_length == 8
    src, mask = source(length=6)
    # N new tokens need N decoder positions (the last token is predicted, never fed back)
    model.generate(src, attention_mask=mask, max_new_tokens=8, min_new_tokens=8)
    with pytest.raises(InputError, match="max_position_embeddings=8"):
        model.generate(src, attention_mask=mask, max_new_tokens=9, min_new_tokens=9)
    with pytest.raises(InputError, match="max_position_embeddings=8"):
        model(torch.randint(3, 40, (1, 9)), decoder_input_ids=torch.ones(1, 2, dtype=torch.long))
    relative = DietForConditionalGeneration(tiny_s2s("diet-rel", max_position_embeddings=8)).eval()
    assert relative.max_decode_length is None
    assert relative.generate(src, attention_mask=mask, max_new_tokens=12, min_new_tokens=12).shape[1] == 13


def test_labels_are_shifted_and_give_a_loss():
    model = DietForConditionalGeneration(tiny_s2s("t5"))
    src, mask = source()
    labels = torch.randint(3, 40, (3, 5))
    labels[0, 3:] = -100
    dec = shift_right(labels, 1, 0)
    assert dec[:, 0].tolist() == [1, 1, 1] and dec[0, 4].item() == 0 and torch.equal(dec[1, 1:], labels[1, :-1])
    out = model(src, mask, labels=labels)
    ref = model(src, mask, decoder_input_ids=dec).logits
    expected = torch.nn.functional.cross_entropy(ref.reshape(-1, 40), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    enc, dec = model.encoder.positions.method.bias, model.decoder.positions.method.bias
    assert enc is not dec and enc.grad.abs().sum() > 0 and dec.grad.abs().sum() > 0  # both sides learn


def test_config_validation_and_presets():
    base = DietSeq2SeqConfig.from_preset("transformer-base", vocab_size=100)
    assert (base.hidden_size, base.num_hidden_layers, base.num_decoder_layers, base.num_attention_heads,
            base.intermediate_size) == (512, 6, 6, 8, 2048)
    assert base.is_encoder_decoder and base.decoder_start_token_id == base.bos_token_id
    assert DietSeq2SeqConfig.from_preset("transformer-tiny", vocab_size=100).num_decoder_layers == 2
    assert DietConfig.from_preset("bert-tiny").num_hidden_layers == 2  # BERT presets untouched
    with pytest.raises(ConfigError, match="segment"):
        DietSeq2SeqConfig(vocab_size=10, hidden_size=16, num_attention_heads=2, segment="input")
    with pytest.raises(ConfigError, match="attention='full'"):
        DietSeq2SeqConfig(vocab_size=10, hidden_size=16, num_attention_heads=2, position="diet-abs",
                          attention="linformer", linformer_k=4)
    with pytest.raises(ConfigError, match="eos_token_id"):
        DietSeq2SeqConfig(vocab_size=10, hidden_size=16, num_attention_heads=2, eos_token_id=10)
    with pytest.raises(ConfigError, match="preset"):
        DietSeq2SeqConfig.from_preset("transformer-huge")


def test_save_and_load_round_trip(tmp_path):
    model = DietForConditionalGeneration(tiny_s2s("shaw")).eval()
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, DietForConditionalGeneration)
    assert loaded.lm_head.weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    src, mask = source()
    kwargs = dict(attention_mask=mask, num_beams=3, max_new_tokens=6, no_repeat_ngram_size=1)
    assert torch.equal(model.generate(src, **kwargs), loaded.generate(src, **kwargs))


def test_encoder_deeper_than_decoder_decodes_with_cache():
    model = DietForConditionalGeneration(tiny_s2s("t5", num_hidden_layers=3, num_decoder_layers=1)).eval()
    src, mask = source()
    kwargs = dict(attention_mask=mask, num_beams=3, max_new_tokens=6, min_new_tokens=6, no_repeat_ngram_size=1)
    assert torch.equal(model.generate(src, use_cache=True, **kwargs), model.generate(src, use_cache=False, **kwargs))


def test_token_embeddings_are_scaled_at_the_input_only():
    """Vaswani et al. §3.4: E·√d enters the stacks, E (unscaled, tied) makes the logits; init std 1/√d."""
    config = DietSeq2SeqConfig.from_preset("transformer-tiny", vocab_size=300)
    assert config.initializer_range == pytest.approx(128 ** -0.5)
    model = DietForConditionalGeneration(config)
    embedding = model.get_input_embeddings()
    ids = torch.tensor([[5, 6, 0]])
    torch.testing.assert_close(embedding(ids), embedding.weight[ids] * 128 ** 0.5)
    assert embedding.weight[0].abs().sum() == 0  # padding row
    assert embedding.weight.std().item() == pytest.approx(128 ** -0.5, rel=0.05)
    assert model.lm_head.weight is embedding.weight
    plain = DietForConditionalGeneration(DietSeq2SeqConfig.from_preset("transformer-tiny", vocab_size=300,
                                                                        scale_embedding=False))
    assert type(plain.get_input_embeddings()) is torch.nn.Embedding


# per-example target positions (e.g. two packed targets restarting at 0) and shared stretched ones
DECODER_POSITIONS = {"per-example": torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4], [0, 2, 4, 6, 8, 10, 12, 14, 16],
                                                  [5, 6, 7, 8, 9, 10, 11, 12, 13]]),
                     "shared": (2 * torch.arange(9))[None]}


@pytest.mark.parametrize("kind", list(DECODER_POSITIONS))
@pytest.mark.parametrize("position", POSITIONS)
def test_decoder_position_ids_are_honoured_and_cached_steps_agree(position, kind):
    model = DietForConditionalGeneration(tiny_s2s(position)).eval()
    src, mask = source()
    target = torch.randint(3, 40, (3, 9))
    positions = DECODER_POSITIONS[kind]
    with torch.no_grad():
        default = model(src, mask, decoder_input_ids=target).logits
        full = model(src, mask, decoder_input_ids=target, decoder_position_ids=positions).logits
        out = model(src, mask, decoder_input_ids=target[:, :1], decoder_position_ids=positions[:, :1], use_cache=True)
        steps = [out.logits]
        for t in range(1, target.shape[1]):  # positions cover the cached tokens and the new one
            out = model(src, mask, decoder_input_ids=target[:, t:t + 1], decoder_position_ids=positions[:, :t + 1],
                        past_key_values=out.past_key_values, encoder_outputs=(out.encoder_last_hidden_state,),
                        use_cache=True)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    if position != "none":
        assert (full - default).abs().max() > 1e-4, "the decoder must read its position ids"
    # causality is by sequence order, not by position value: the first token never sees later ones
    with torch.no_grad():
        first = model(src, mask, decoder_input_ids=target[:, :1], decoder_position_ids=positions[:, :1]).logits
    torch.testing.assert_close(first[:, 0], full[:, 0], atol=1e-5, rtol=1e-5)


def test_encoder_position_ids_are_honoured():
    model = DietForConditionalGeneration(tiny_s2s("diet-rel")).eval()
    src, mask = source()
    target = torch.randint(3, 40, (3, 4))
    with torch.no_grad():
        default = model(src, mask, decoder_input_ids=target).logits
        stretched = model(src, mask, decoder_input_ids=target, position_ids=3 * torch.arange(7)).logits
    assert (stretched - default).abs().max() > 1e-4


def test_decoder_position_ids_of_the_wrong_length_are_refused():
    model = DietForConditionalGeneration(tiny_s2s("t5")).eval()
    src, mask = source()
    with pytest.raises(InputError, match=r"position_ids has shape \(1, 3\)"):
        model(src, mask, decoder_input_ids=torch.randint(3, 40, (3, 4)), decoder_position_ids=torch.arange(3)[None])


def test_unknown_keyword_arguments_are_refused():
    model = DietForConditionalGeneration(tiny_s2s("t5")).eval()
    src, mask = source()
    with pytest.raises(InputError, match="unexpected keyword argument.*'decoder_head_mask'"):
        model(src, mask, decoder_input_ids=src, decoder_head_mask=None)


def test_generate_leaves_out_the_labels_seq2seq_trainer_passes():
    """Seq2SeqTrainer(predict_with_generate=True) calls generate() with the batch's labels: they are not read,
    where the encoder refused them."""
    model = DietForConditionalGeneration(tiny_s2s("sinusoidal")).eval()
    ids, mask = source()
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=4)
    assert torch.equal(model.generate(ids, attention_mask=mask, labels=ids[:, :5], max_new_tokens=4), plain)


@pytest.mark.parametrize("position", ["diet-rel", "t5", "sinusoidal"])
def test_assisted_decoding_gives_the_models_own_greedy_output(position):
    """generate(assistant_model=...): a smaller draft model proposes, the model verifies; greedy, the tokens are
    the model's own. transformers hands the encoder `logits_to_keep`, which an encoder has no logits to apply to."""
    torch.manual_seed(0)
    model = DietForConditionalGeneration(tiny_s2s(position)).eval()
    torch.manual_seed(1)
    draft = DietForConditionalGeneration(tiny_s2s(position, num_hidden_layers=1, num_decoder_layers=1)).eval()
    src = torch.randint(3, 40, (1, 7), generator=torch.Generator().manual_seed(2))
    kwargs = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, num_beams=1, no_repeat_ngram_size=1)
    plain = model.generate(src, **kwargs)
    assisted = model.generate(src, assistant_model=draft, **kwargs)
    assert len(set(plain[0, 1:].tolist())) == 10 and torch.equal(assisted, plain)
