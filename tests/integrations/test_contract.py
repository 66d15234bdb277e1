"""attach keeps Hugging Face's contract: every RoPE variant, static and sliding-window caches, full-graph
compilation, set_attn_implementation / from_pretrained(attn_implementation=...), deepcopy, output_attentions,
fully masked rows, the model's dtype."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, StaticCache

import dietpe
from dietpe.errors import ConfigError
from tests.integrations.test_attach import (LLAMA_LIKE, V, assert_cached_equals_full, build, cache_keyword, ids,
                                           method_params)

# every rope_type transformers defines besides "default", with its factors (head size 8: 4 frequencies)
ROPE = {
    "default": {},
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 16},
    "longrope": {"short_factor": [1.0, 1.1, 1.3, 1.6], "long_factor": [1.0, 2.0, 4.0, 8.0],
                 "original_max_position_embeddings": 16},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}


def llama_with_rope(rope_type: str, impl: str = "sdpa"):
    torch.manual_seed(0)
    rope = {"rope_type": rope_type, "rope_theta": 5000.0, **ROPE[rope_type]}
    config = LlamaConfig(**{**LLAMA_LIKE, "max_position_embeddings": 64}, rope_parameters=rope)
    config._attn_implementation = impl
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("rope_type", list(ROPE))
def test_rotary_is_the_models_own_rope_variant(rope_type):
    """Attached `rotary` = the model with its RoPE variant (factors, attention scaling, dynamic updates past
    the original length), to 1e-5, at 12 tokens and at 48 (past yarn's, longrope's and llama3's original 16)."""
    for length in (12, 48):
        model = llama_with_rope(rope_type)
        x = ids(2, length)
        ref = model(x).logits
        attached = dietpe.attach(model, "rotary")
        torch.testing.assert_close(attached(x).logits, ref, atol=1e-5, rtol=0)


def test_rotary_with_another_base_rebuilds_the_models_rope():
    """`rotary:rotary_base=...` keeps the model's variant (llama3 here) with the spec's base."""
    model = dietpe.attach(llama_with_rope("llama3"), "rotary:rotary_base=20000")
    assert model.model.rotary_emb.config.rope_parameters["rope_theta"] == 20000.0
    assert model.model.rotary_emb.rope_type == "llama3"
    x = ids(1, 20)
    other = llama_with_rope("llama3")
    other.config.rope_parameters["rope_theta"] = 20000.0
    reference = LlamaForCausalLM(other.config).eval()
    reference.load_state_dict(other.state_dict())
    torch.testing.assert_close(model(x).logits, reference(x).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("spec", ["diet-rel", "t5", "alibi", "diet-abs", "rotary", "none"])
def test_static_cache_generation_equals_dynamic(spec):
    """A static cache hands attention its whole preallocated buffer: the method still sees each key's position."""
    model = dietpe.attach(build("llama"), spec).eval()
    x = ids(2, 5)
    dynamic = model.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0)
    static = model.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
    assert torch.equal(static, dynamic)
    mask = torch.ones_like(x)
    mask[0, :2] = 0  # left padding: positions from the mask, recorded on the static cache
    dynamic = model.generate(x, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    static = model.generate(x, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                            cache_implementation="static")
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("spec", ["diet-rel", "alibi", "t5"])
def test_sliding_window_cache_decoding_equals_uncached(spec):
    """Mistral with a sliding window of 4: the cache keeps the last keys only; cached decoding = the full
    forward (whose mask applies the same window)."""
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**LLAMA_LIKE, sliding_window=4)).eval()
    dietpe.attach(model, spec)
    x = ids(2, 10)
    assert_cached_equals_full(model, x)


@pytest.mark.parametrize("spec", ["diet-rel", "alibi", "rotary", "none"])
def test_full_graph_compile_of_the_forward_and_of_static_decoding(spec):
    """torch.compile(fullgraph=True) captures the attached forward (the pre-hook reads no tensor value) and
    a decoding step over a static cache (dynamo only: backend 'eager', no code generation)."""
    model = dietpe.attach(build("llama"), spec).eval()
    x = ids(2, 8)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x).logits, model(x).logits, atol=1e-5, rtol=0)
    torch._dynamo.reset()
    given = {cache_keyword(model): StaticCache(config=model.config, max_cache_len=16)}
    step = torch.compile(model.forward, fullgraph=True, backend="eager")
    logits = [model(x[:, :5], **given, use_cache=True).logits]
    for t in range(5, 8):
        pos = torch.tensor([[t]])
        logits.append(step(x[:, t:t + 1], **given, position_ids=pos, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(logits, 1), model(x).logits, atol=1e-5, rtol=1e-4)
    torch._dynamo.reset()


def test_set_attn_implementation_keeps_the_method(tmp_path):
    model = dietpe.attach(build("llama"), "diet-rel").eval()
    with torch.no_grad():
        model.model.diet_positions.encoding.method.r.normal_()
    x = ids()
    before = model(x).logits
    nope = dietpe.attach(build("llama"), "none").eval()(x).logits
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        assert model.config._attn_implementation == impl
        torch.testing.assert_close(model(x).logits, before, atol=1e-5, rtol=1e-4)
    assert (before - nope).abs().max() > 1e-3
    with pytest.raises(ConfigError, match="diet-rel.*stays.*flash_attention_2") as e:
        model.set_attn_implementation("flash_attention_2")
    assert "\n" not in str(e.value) and model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match='Specified `attn_implementation="foo"` is not supported'):
        model.set_attn_implementation("foo")  # a name transformers does not know: transformers' own error
    assert model.config._attn_implementation == "sdpa" and model.model.diet_positions.spec == "diet-rel"
    model.save_pretrained(tmp_path)
    for impl in ("eager", "sdpa"):
        loaded = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation=impl).eval()
        assert loaded.config._attn_implementation == impl and loaded.model.diet_positions.spec == "diet-rel"
        torch.testing.assert_close(loaded(x).logits, before, atol=1e-5, rtol=1e-4)


def test_deepcopy_gives_an_independent_model():
    model = dietpe.attach(build("llama"), "diet-rel").eval()
    twin = copy.deepcopy(model)
    x = ids(2, 20)
    torch.testing.assert_close(twin(x).logits, model(x).logits)
    with torch.no_grad():
        twin.model.diet_positions.encoding.method.r.normal_()  # a constant shift would cancel in the softmax
    assert twin.model.layers[0].self_attn.__dict__["_dietpe"] is twin.model.diet_positions
    assert (twin(x).logits - model(x).logits).abs().max() > 1e-3
    twin(ids(1, 7))  # a forward of the copy leaves the original's state alone
    assert model.model.diet_positions.state.q_ids.shape[-1] == 20


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_deepcopy_after_a_training_step(family):
    """The last forward's state (its autograd graph) is not copied: a copy taken after `backward` (an EMA, the
    best model so far) is an independent model with the same outputs."""
    model = dietpe.attach(build(family), "diet-rel")
    x = ids()
    model(x, labels=x).loss.backward()
    twin = copy.deepcopy(model).eval()
    assert twin.base_model.diet_positions.state is None
    model.eval()
    torch.testing.assert_close(twin(x).logits, model(x).logits)


def test_output_attentions_as_transformers_offers_them():
    """Under eager the probabilities come back (rows sum to 1, causal), from the call or from the config."""
    model = dietpe.attach(build("llama", "eager"), "diet-rel").eval()
    x = ids()
    out = model(x, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, x.shape[1], x.shape[1])
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(2, 4, x.shape[1]))
    assert out.attentions[1].triu(1).abs().max() == 0
    model.config.output_attentions = True
    assert len(model(x).attentions) == 2


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_fully_masked_rows_as_transformers(family, impl):
    """A row of the batch padded entirely: its queries see no key. Transformers' sdpa gives them zeros, its eager
    attention the average of the values; diet's backend computing a method (t5 with a zero table, beside the
    model's own positions) gives what the native model gives."""
    x = ids(2, 8)
    mask = torch.ones_like(x)
    mask[1] = 0
    native = build(family, impl).eval()
    t5 = dietpe.attach(build(family, impl), "t5:input_positions=true").eval()
    with torch.no_grad():
        for p in method_params(t5):
            p.zero_()
    torch.testing.assert_close(t5(x, attention_mask=mask).logits, native(x, attention_mask=mask).logits,
                               atol=1e-5, rtol=0)


def test_the_method_follows_the_models_dtype():
    model = dietpe.attach(build("llama"), "diet-rel").to(torch.bfloat16).eval()
    assert {p.dtype for p in method_params(model)} == {torch.bfloat16}
    assert model(ids()).logits.dtype == torch.bfloat16


@pytest.mark.parametrize("family", ["gpt2", "bert"])
@pytest.mark.parametrize("spec", ["none", "alibi", "sinusoidal", "diet-rel"])
def test_an_input_term_takes_the_dtype_of_the_table_it_replaces(tmp_path, family, spec):
    """Where a learned input table was (GPT-2, BERT), a method's input term (zeros or sinusoids for methods
    without parameters) comes in the model's dtype, however the model got it: cast before `attach`, after it,
    or loaded with `dtype=`; a float32 term would promote the embeddings and fail in the next bf16 layer."""
    x = ids()
    before = dietpe.attach(build(family).to(torch.bfloat16), spec).eval()
    after = dietpe.attach(build(family), spec).to(torch.bfloat16).eval()
    after.save_pretrained(tmp_path)
    loaded = type(after).from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    for model in (before, after, loaded):
        assert model(x).logits.dtype == torch.bfloat16
    torch.testing.assert_close(loaded(x).logits, after(x).logits)
    double = dietpe.attach(build(family), spec).to(torch.float64).eval()
    assert double(x).logits.dtype == torch.float64


def test_auto_takes_no_backend_that_declines_the_call():
    """"auto" under attach skips a backend that declines a call (the fused kernel off CUDA, which under Triton's
    interpreter would otherwise run, slowly, in every CPU test)."""
    from dietpe.attention.registry import ALL_BACKENDS
    from dietpe.integrations.dispatch import auto_backend

    name = auto_backend(torch.zeros(1, 1, 1, 8), value_terms=False, dropout=0.0)
    backend = ALL_BACKENDS[name]
    assert backend.skip is None or not backend.skip(torch.zeros(1, 1, 1, 8)), name


@pytest.mark.parametrize("way", ["from_pretrained", "meta"])
def test_weights_transformers_initialises_get_the_methods_init(tmp_path, way):
    """The method's tables get their own initialisation wherever transformers initialises weights: loading a
    checkpoint that lacks them (a plain model's folder, the method recorded in the config) and
    `initialize_weights` after building on the meta device, as `attach` draws them (not torch.empty's bits)."""
    plain = build("llama")
    config = copy.deepcopy(plain.config)
    config.dietpe = {"method": "diet-rel", "backend": None}
    if way == "from_pretrained":
        plain.save_pretrained(tmp_path)
        model = LlamaForCausalLM.from_pretrained(tmp_path, config=config)
        torch.testing.assert_close(model.model.embed_tokens.weight, plain.model.embed_tokens.weight)
    else:
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        model.to_empty(device="cpu")
        model.initialize_weights()
    got = model.model.diet_positions.encoding.method.r.detach()
    drawn = dietpe.attach(build("llama"), "diet-rel").model.diet_positions.encoding.method.r.detach()
    assert torch.isfinite(got).all()
    # the same distribution as attach's draw: the std within 15 % (1,032 values), the mean within 4 errors
    assert abs(got.std().item() / drawn.std().item() - 1) < 0.15
    assert abs(got.mean().item()) < 4 * drawn.std().item() / got.numel() ** 0.5


def test_other_models_are_initialised_as_before(monkeypatch):
    """The initialisation wrapper acts on attached methods only: diet's own models (which initialise their
    tables themselves) and plain transformers models draw the same weights as without it."""
    from transformers import PreTrainedModel

    from dietpe.integrations import core
    from dietpe.models.causal import DietCausalConfig, DietForCausalLM

    def weights():
        torch.manual_seed(0)
        diet = DietForCausalLM(DietCausalConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=48, position="diet-rel"))
        return [*diet.state_dict().values(), *LlamaForCausalLM(LlamaConfig(**LLAMA_LIKE)).state_dict().values()]

    wrapped = weights()
    monkeypatch.setattr(PreTrainedModel, "_initialize_weights", core._original_initialize_weights)
    for a, b in zip(wrapped, weights(), strict=True):
        assert torch.equal(a, b)
