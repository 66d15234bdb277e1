"""attach: every method × family on tiny random configs (no hub): exactness against the model's own scheme,
relative methods unchanged under a shift of position_ids, gradients reaching the method's parameters,
cached = uncached decoding, save_pretrained / from_pretrained restoring the method."""

import copy
import functools
import inspect

import pytest
import torch
from transformers import (BertConfig, GemmaConfig, GemmaForCausalLM, GraniteConfig, GraniteForCausalLM,
                          Olmo2Config, Olmo2ForCausalLM, Starcoder2Config, Starcoder2ForCausalLM, BertForMaskedLM, DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, RobertaConfig, RobertaForMaskedLM, T5Config,
                          T5ForConditionalGeneration)

import dietpe
from dietpe.errors import ConfigError
from dietpe.positions.registry import REGISTRY

V, L = 40, 12
LLAMA_LIKE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3)
BERT_LIKE = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=64, initializer_range=0.3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
FAMILIES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**LLAMA_LIKE)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**LLAMA_LIKE)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**LLAMA_LIKE)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**LLAMA_LIKE, head_dim=8)),
    "gemma": lambda: GemmaForCausalLM(GemmaConfig(**LLAMA_LIKE, head_dim=8, pad_token_id=0)),
    "olmo2": lambda: Olmo2ForCausalLM(Olmo2Config(**LLAMA_LIKE, pad_token_id=0)),
    "granite": lambda: GraniteForCausalLM(GraniteConfig(**LLAMA_LIKE, pad_token_id=0)),
    "starcoder2": lambda: Starcoder2ForCausalLM(Starcoder2Config(**LLAMA_LIKE, bos_token_id=0, eos_token_id=0)),
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                               bos_token_id=0, eos_token_id=0, resid_pdrop=0, embd_pdrop=0,
                                               attn_pdrop=0, initializer_range=0.3)),
    "bert": lambda: BertForMaskedLM(BertConfig(**BERT_LIKE)),
    "roberta": lambda: RobertaForMaskedLM(RobertaConfig(**{**BERT_LIKE, "max_position_embeddings": 80},
                                                        pad_token_id=1)),
}
CAUSAL = {"llama", "mistral", "qwen2", "qwen3", "gemma", "olmo2", "granite", "starcoder2", "gpt2"}
# every registered method (TUPE's [CLS] reset is an encoder's: switched off in causal families), and variants
METHODS = [*REGISTRY, "diet-abs:position_rank=4", "diet-rel:sharing=layer"]
SEGMENTED = ["diet-rel:segment=per-head", "diet-abs:segment=per-head"]


@functools.lru_cache(maxsize=None)
def pristine(family: str):
    torch.manual_seed(0)
    return FAMILIES[family]()


def build(family: str, impl: str = "sdpa"):
    """A fresh copy of the family's tiny random model (built once: Hugging Face's init is the slow part)."""
    model = copy.deepcopy(pristine(family))
    model.config._attn_implementation = impl
    return model


def ids(batch=2, length=L, seed=1):
    return torch.randint(2, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def method_params(model):
    return [p for n, p in model.named_parameters() if "diet_positions" in n]


# every method in the three wirings (Llama-style, GPT-2, BERT); the common ones in the other families
MATRIX = ([(f, m) for f in ("llama", "gpt2", "bert") for m in METHODS + SEGMENTED]
          + [(f, m) for f in ("mistral", "qwen2", "qwen3", "roberta") for m in ("diet-rel", "t5", "alibi", "diet-abs")])


@pytest.mark.parametrize("family, spec", MATRIX)
def test_matrix(family, spec):
    """Each method in each family: a forward in eager and the default backend agree, the method changes the
    output (unless it has no parameters and no terms), and gradients reach its parameters."""
    info = REGISTRY[spec.split(":")[0]]
    if info.cls_reset and family in CAUSAL:
        spec += ":tupe_reset=false"
    if "per-head" in spec and family in CAUSAL:
        with pytest.raises(ConfigError, match="per-head"):
            dietpe.attach(build(family), spec)
        return
    x = ids()
    model = dietpe.attach(build(family), spec).train(False)
    with torch.no_grad():  # tables away from their small initial values, so that they show in the output
        for p in method_params(model):
            p.normal_(generator=torch.Generator().manual_seed(2)) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    extra = {"token_type_ids": (torch.arange(L) >= L // 2).long().expand(2, -1)} if "per-head" in spec else {}
    out = model(x, **extra).logits
    eager = dietpe.attach(build(family, "eager"), spec).train(False)
    eager.load_state_dict(model.state_dict())
    torch.testing.assert_close(eager(x, **extra).logits, out, atol=1e-5, rtol=1e-4)
    params = method_params(model)
    if params:
        model.train()
        model(x, **extra).logits.float().pow(2).mean().backward()
        # every parameter of the method, TUPE's without its reset too: DistributedDataParallel refuses one
        # that no loss reaches
        idle = [n for n, p in model.named_parameters() if "diet_positions" in n
                and (p.grad is None or not p.grad.any())]
        assert not idle
    if info.entry:  # the method contributes something: the output differs from no position at all
        nope = dietpe.attach(build(family), "none").train(False)
        assert (nope(x, **extra).logits - out).abs().max() > 1e-5


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma", "olmo2", "granite",
                                    "starcoder2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_rotary_reproduces_rope(family, impl):
    model = build(family, impl).eval()
    x = ids()
    ref = model(x).logits
    dietpe.attach(model, "rotary")
    torch.testing.assert_close(model(x).logits, ref, atol=1e-5, rtol=0)
    shifted = torch.arange(L)[None] + 7
    ref_model = build(family, impl).eval()
    torch.testing.assert_close(model(x, position_ids=shifted).logits,
                               ref_model(x, position_ids=shifted).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_absolute_reproduces_the_table(family):
    model = build(family).eval()
    x = ids()
    ref = model(x).logits
    dietpe.attach(model, "absolute")
    torch.testing.assert_close(model(x).logits, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("spec", [m for m in METHODS if REGISTRY[m.split(":")[0]].relative])
def test_relative_methods_ignore_a_shift(family, spec):
    model = dietpe.attach(build(family), spec).eval()
    x = ids()
    shift = torch.arange(L)[None] + 9
    torch.testing.assert_close(model(x, position_ids=shift).logits, model(x).logits, atol=2e-5, rtol=0)


def cache_keyword(model) -> str:
    """The name transformers' forward takes the decoding cache by: `cache` from 5.24 (where `past_key_values` is
    deprecated, to be removed in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def assert_cached_equals_full(model, x, prefix=6):
    """The prompt's first `prefix` tokens in one call, then one token a call through a DynamicCache: the logits of
    the full forward."""
    full = model(x).logits
    given = {cache_keyword(model): DynamicCache(config=model.config)}
    steps = [model(x[:, :prefix], **given, use_cache=True).logits]
    for t in range(prefix, x.shape[1]):
        steps.append(model(x[:, t:t + 1], **given, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("spec", ["diet-rel", "t5", "alibi", "diet-abs", "rotary", "absolute"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_cached_decoding_equals_uncached(family, spec):
    model = dietpe.attach(build(family), spec).eval()
    x = ids(batch=2, length=10)
    assert_cached_equals_full(model, x)
    generated = model.generate(x[:, :4], max_new_tokens=5, do_sample=False, pad_token_id=0)
    uncached = model.generate(x[:, :4], max_new_tokens=5, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(generated, uncached)


def test_save_and_load_restore_the_method(tmp_path):
    model = dietpe.attach(build("llama"), "diet-rel:sharing=layer").eval()
    with torch.no_grad():
        model.model.diet_positions.encoding.method.r.normal_()
    x = ids()
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.model.diet_positions.spec == "diet-rel:sharing=layer"
    torch.testing.assert_close(loaded(x).logits, model(x).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pinned", ["sdpa", "eager", None])
def test_a_pinned_backend_survives_save_and_load(tmp_path, pinned):
    dietpe.attach(build("llama"), "diet-rel", backend=pinned).save_pretrained(tmp_path)
    assert LlamaForCausalLM.from_pretrained(tmp_path).model.diet_positions.backend == pinned


def test_a_record_of_an_earlier_version_follows_the_implementation(tmp_path):
    import json

    dietpe.attach(build("llama"), "diet-rel").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["dietpe"] = {"method": "diet-rel", "backend": "sdpa"}  # what attach wrote by default before
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert LlamaForCausalLM.from_pretrained(tmp_path).model.diet_positions.backend is None


def enable_checkpointing(model, reentrant: bool):
    """Hugging Face's activation checkpointing under either of its names (transformers 5.17: gradient_...)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": reentrant})


@pytest.mark.parametrize("spec", ["diet-rel", "t5", "alibi", "diet-abs", "diet-rel:sharing=layer"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(spec, reentrant):
    """Reentrant and non-reentrant checkpointing: the terms are rebuilt inside each recomputed layer, so the
    learned tables get the gradients of a plain backward (reentrant used to fail: a graph shared by layers)."""
    x = ids()
    w = torch.randn(2, L, V, generator=torch.Generator().manual_seed(3))
    grads = []
    for checkpointing in (False, True):
        model = dietpe.attach(build("llama"), spec).train()
        with torch.no_grad():
            for i, p in enumerate(method_params(model)):
                p.normal_(generator=torch.Generator().manual_seed(i))
        if checkpointing:
            enable_checkpointing(model, reentrant)
        (model(x, use_cache=False).logits * w).sum().backward()
        grads.append([p.grad.clone() for p in method_params(model)] +
                     [model.model.layers[0].self_attn.q_proj.weight.grad.clone()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_input_positions_true_keeps_rope():
    model = build("llama").eval()
    x = ids()
    ref = model(x).logits
    dietpe.attach(model, "diet-rel:input_positions=true")
    with torch.no_grad():
        model.model.diet_positions.encoding.method.r.zero_()
    torch.testing.assert_close(model(x).logits, ref, atol=1e-5, rtol=0)


def test_refusals():
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=V, d_model=16, d_kv=4, d_ff=16, num_layers=1,
                                             num_heads=2))
    with pytest.raises(ConfigError, match=r"model_type 't5' is not supported; supported: .*bert.*llama"):
        dietpe.attach(t5, "diet-rel")
    with pytest.raises(ConfigError, match="unknown field"):
        dietpe.attach(build("llama"), "diet-rel:nonsense=1")
    with pytest.raises(ConfigError, match="already has a method"):
        dietpe.attach(dietpe.attach(build("llama"), "t5"), "alibi")
    with pytest.raises(ConfigError, match="a method spec is a string"):
        dietpe.attach(build("llama"), None)


@pytest.mark.parametrize("family", ["llama", "bert"])
@pytest.mark.parametrize("field, error", [
    ("hidden_size=64", "hidden_size is a field of the model.*takes the model's own.*may set .*position_rank"),
    ("num_hidden_layers=1", "num_hidden_layers is a field of the model"),
    ("attention_probs_dropout_prob=0.5", "attention_probs_dropout_prob is a field of the model"),
    ("attention=linformer", "Linformer"),  # a decoder's config refuses it first: it cannot be causal
    ("attn_backend=eager", "attn_backend is a field of the model.*pass backend= instead")])
def test_a_spec_may_not_describe_the_model(family, field, error):
    """attach takes the model's sizes, dropout and attention as they are: a spec setting them (accepted and
    ignored, or failing deep in the first forward, otherwise) is refused, naming what a spec may set."""
    with pytest.raises(ConfigError, match=error):
        dietpe.attach(build(family), f"diet-abs:{field}")
    model = dietpe.attach(build(family), "diet-abs:position_rank=4:logit_scale=2:max_position_embeddings=32")
    assert model.base_model.diet_positions.config.position_rank == 4


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("spec", ["diet-rel", "rotary", "absolute"])
def test_position_ids_of_one_dimension(family, spec):
    """position_ids (L,), as README allows, is (1, L) for every family (Llama's own RoPE module needs a batch)."""
    model = dietpe.attach(build(family), spec).eval()
    x = ids()
    pos = torch.arange(3, 3 + x.shape[1])
    torch.testing.assert_close(model(x, position_ids=pos).logits, model(x, position_ids=pos[None]).logits)


@pytest.mark.parametrize("spec", ["diet-rel", "t5", "diet-abs"])
def test_packed_documents_equal_each_alone(spec):
    """Positions restarting at 0 per document: Hugging Face's packed-sequence mask keeps the documents apart
    (no cache), and each document's logits equal its own forward."""
    model = dietpe.attach(build("llama"), spec).eval()
    a, b = ids(1, 5, seed=3), ids(1, 7, seed=4)
    pos = torch.cat([torch.arange(5), torch.arange(7)])[None]
    out = model(torch.cat([a, b], 1), position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(out[:, :5], model(a).logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out[:, 5:], model(b).logits, atol=1e-5, rtol=0)


def test_left_padded_generation_follows_the_mask():
    """A left-padded prompt with positions from the mask generates what the unpadded prompt does."""
    model = dietpe.attach(build("llama"), "diet-rel").eval()
    prompt = ids(1, 5, seed=5)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], 1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    alone = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    left = model.generate(padded, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(left[:, 3:], alone)


def test_the_config_the_model_was_built_from_is_left_as_it_was():
    """A sweep builds each model from one config object: attach records the method on the model's own copy,
    so the next model from that object is plain (its RoPE on) and takes another method."""
    config = LlamaConfig(**LLAMA_LIKE)
    first = dietpe.attach(LlamaForCausalLM(config), "diet-rel")
    assert not hasattr(config, "dietpe") and first.config.dietpe["method"] == "diet-rel"
    held = [m.config for m in first.modules() if isinstance(m.__dict__.get("config"), LlamaConfig)]
    assert len(held) > 3 and all(c is first.config for c in held)
    plain = LlamaForCausalLM(config)
    assert "diet_positions" not in plain.model._modules and type(plain.model.rotary_emb).__name__ != "NoRotary"
    assert dietpe.attach(LlamaForCausalLM(config), "t5").config.dietpe["method"] == "t5"


def test_flex_backend_equals_sdpa():
    model = dietpe.attach(build("llama"), "diet-rel").eval()
    flex = dietpe.attach(build("llama"), "diet-rel", backend="flex").eval()
    flex.load_state_dict(model.state_dict())
    x = ids()
    with torch.no_grad():  # FlexAttention's backward needs CUDA
        torch.testing.assert_close(flex(x).logits, model(x).logits, atol=2e-5, rtol=0)


@pytest.mark.parametrize("spec, backend", [("shaw", None), ("diet-rel", "sdpa"), ("diet-rel", "eager")])
def test_a_flex_models_block_mask_reaches_the_other_backends_as_the_mask_it_stands_for(spec, backend):
    """A model built with attn_implementation="flex_attention" hands attention a block mask; a layer another
    backend serves (Shaw's value term, a pinned backend) reads it as the dense mask it stands for."""
    ref = dietpe.attach(build("llama", "eager"), spec, backend="eager").eval()
    flex = dietpe.attach(build("llama", "flex_attention"), spec, backend=backend).eval()
    flex.load_state_dict(ref.state_dict())
    x, mask = ids(), torch.ones(2, L, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the block mask carries it
    with torch.no_grad():  # FlexAttention's backward needs CUDA
        got, want = flex(x, attention_mask=mask).logits, ref(x, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=2e-5, rtol=0)


def test_trainer_trains_the_method(tmp_path):
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments

    class Windows(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            x = ids(1, L, seed=10 + i)[0]
            return {"input_ids": x, "labels": x}

    model = dietpe.attach(build("llama"), "diet-rel")
    before = model.model.diet_positions.encoding.method.r.detach().clone()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                             learning_rate=1e-2, report_to=[], save_strategy="no", use_cpu=True)
    Trainer(model=model, args=args, train_dataset=Windows()).train()
    assert not torch.equal(model.model.diet_positions.encoding.method.r.detach(), before)


def test_a_model_with_its_own_rope_base_takes_every_method():
    """The model's RoPE base reaches `rotary` only; another method is not refused for it."""
    def config():
        return LlamaConfig(**{**LLAMA_LIKE, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})

    rotary = dietpe.attach(LlamaForCausalLM(config()), "rotary")
    assert rotary.model.diet_positions.config.rotary_base == 500000.0
    alibi = dietpe.attach(LlamaForCausalLM(config()), "alibi")
    assert alibi.model.diet_positions.config.position == "alibi"
