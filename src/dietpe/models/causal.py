"""Decoder-only language models (GPT-style causal LM) with any position method that makes sense causally.

Most position-encoding research today is on causal LMs and what happens beyond the training length (ALiBi,
Press et al. 2022; KERPLE, Chi et al. 2022; NoPE, Kazemnejad et al. 2023). The same BERT block layout as the
encoder (post-LN, `DietLayer`'s parameters), with causal self-attention:

    h_0 = LN(token + input position)                                 (input terms, if the method has them)
    a   = LN(h + Drop(W_O · Attention(h; causal mask, LayerTerms_l)))
    h'  = LN(a + Drop(W_2 · GELU(W_1 a)))
    p(x_{t+1} | x_≤t) = softmax(LMHead(h_L,t))                       (BERT's MLM head, tied to the embeddings)

`position="none"` is NoPE: no position term at all; the causal mask alone lets a layer count how many tokens
precede it (Kazemnejad et al. 2023, Theorem 1), so the model is not permutation-invariant as an encoder is.
T5's buckets are the unidirectional ones of T5's decoder (`dietpe.positions.functional.t5_causal_bucket`): a
causal query sees only keys j <= i, and the bidirectional buckets would leave it half of them. Methods whose
registry entry says they are not causal are refused when the config is built, as are TUPE's [CLS] reset
(position 0 is an ordinary token in a causal LM: `tupe_reset=False` is the default here), Linformer (its
length projection mixes future keys into every slot) and segments (a generated text has none).

Incremental decoding (`generate(use_cache=True)`) keeps the keys and values of every layer in a
`DynamicCache`; a step builds the position terms of its new queries only, `Context(q_pos=new, k_pos=all)`
with `starts=(past, 0)` for the default positions: one row of each bias, one rotary angle per new query,
one input position id. `position_ids`, when given, cover the cached and the new tokens, like
`attention_mask` (as `decoder_position_ids` of the translation model); `generate()` derives them from the
attention mask when a prompt is left-padded. Causality follows sequence order, not position values.
Shapes as in `dietpe.positions.terms`.
"""

from __future__ import annotations

from torch import Tensor, nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
)

from dietpe.attention.masks import attention_dtype
from dietpe.config import DietConfig
from dietpe.errors import ConfigError, InputError
from dietpe.models.modeling import (
    DietEmbeddings,
    DietLayer,
    DietLMHead,
    DietModel,
    DietPreTrainedModel,
    cache_argument,
    cache_of,
    check_labels,
    check_kwargs,
    run_layers,
    with_cache,
)
from dietpe.models.seq2seq import check_dynamic, ensure_layers, step_mask, step_positions
from dietpe.positions.encoding import PositionEncoding
from dietpe.positions.registry import REGISTRY, names

#: the methods a causal LM accepts (TUPE only with tupe_reset=False)
CAUSAL_POSITIONS = names(causal_ok=True)


def check_cache_batch(cache: Cache, batch: int) -> None:
    """A cache filled for one batch size cannot take another's tokens."""
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, Tensor) and keys.dim() == 4 and keys.shape[-2] > 0:
            if keys.shape[0] != batch:
                raise InputError(f"past_key_values holds {keys.shape[0]} sequences, but the input has {batch}; "
                                 f"pass the cache its own batch returned, or none")
            return


class DietCausalConfig(DietConfig):
    """A `DietConfig` for a decoder-only LM. `position` takes any method whose registry entry is `causal_ok`;
    `position="none"` is NoPE. Segments (`segment='none'`), full attention, and TUPE without its [CLS] reset
    (`tupe_reset=False`, the default here). `use_cache`: `generate()` keeps keys and values."""

    model_type = "diet-causal"
    causal = True  # the methods' causal defaults and builders: T5's causal buckets, tupe_reset=False, ...

    def __init__(self, segment: str = "none", use_cache: bool = True,
                 bos_token_id: int | None = None, eos_token_id: int | None = None, **kwargs):
        self.use_cache = use_cache
        super().__init__(segment=segment, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, **kwargs)

    def validate(self) -> None:
        super().validate()
        info = REGISTRY[self.position]
        if not info.causal_ok:
            raise ConfigError(f"position={self.position!r} cannot attend causally; a causal LM takes one of "
                              f"{', '.join(map(repr, CAUSAL_POSITIONS))}")
        if info.cls_reset and self.tupe_reset:
            raise ConfigError(f"position={self.position!r} with tupe_reset=True resets position 0 as [CLS], which a "
                              f"causal LM does not have (its first token is an ordinary token); use tupe_reset=False")
        if self.attention != "full":
            raise ConfigError(f"attention={self.attention!r}: Linformer's length projection mixes later keys into "
                              f"every slot, so it cannot be causal; use attention='full'")
        if self.segment != "none":
            raise ConfigError(f"segment={self.segment!r}: a causal LM generates text without segments; use "
                              f"segment='none'")


class DietCausalLayer(DietLayer):
    """`DietLayer` (same parameters) whose self-attention appends its new keys and values to the cache."""

    def forward(self, hidden, terms, mask, cache: Cache | None, index: int, need_probs: bool):
        kv = self.attention.keys_values(hidden)  # (B, H, Lnew, Dh) each
        if cache is not None:
            kv = cache.update(*kv, index)  # (B, H, Lpast + Lnew, Dh)
        attn, probs, _ = self.attention(hidden, terms, mask, kv=kv, need_probs=need_probs)
        hidden = self.attention_norm(hidden + self.dropout(self.attention_output(attn)))
        ffn = self.output(self.act(self.intermediate(hidden)))
        return self.output_norm(hidden + self.dropout(ffn)), probs


# what generate() and Trainer may pass that carries nothing here
CAUSAL_HARMLESS_KWARGS = frozenset({"cache_position"})


class DietCausalModel(DietPreTrainedModel):
    """The decoder stack: embeddings, position encoding (built causal), causal layers; no pooler."""

    config_class = DietCausalConfig
    config: DietCausalConfig
    _no_split_modules = ["DietCausalLayer"]

    def __init__(self, config: DietCausalConfig):
        super().__init__(config)
        self.embeddings = DietEmbeddings(config)
        self.positions = PositionEncoding(config)
        self.layers = nn.ModuleList(DietCausalLayer(config) for _ in range(config.num_hidden_layers))
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        inputs_embeds: Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """input_ids (B, L) new tokens (or inputs_embeds (B, L, D)); with `past_key_values` the cache holds the
        earlier ones. attention_mask and position_ids cover cached and new tokens: (B, Lpast + L) and
        (Lpast + L,), (1, Lpast + L) or (B, Lpast + L); default positions 0 .. Lpast + L - 1. A 4-D
        attention_mask (B|1, 1|H, L, Lpast + L) (`dietpe.attention.masks`) is combined with causality."""
        past_key_values = cache_argument(past_key_values, kwargs)
        check_kwargs(kwargs, f"{type(self).__name__}.forward", CAUSAL_HARMLESS_KWARGS)
        output_attentions, output_hidden_states = self._outputs_asked(output_attentions, output_hidden_states)
        b, length = DietModel._check_inputs(self, input_ids, inputs_embeds, None, None)
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        cache = past_key_values if use_cache or past_key_values is not None else None
        if cache is not None:
            check_dynamic(cache)
            ensure_layers(cache, self.config.num_hidden_layers)
            check_cache_batch(cache, b)
        past = cache.get_seq_length() if cache is not None else 0
        ctx, q_ids = step_positions(self.positions, position_ids, b, past, length, device)
        hidden = self.embeddings(input_ids, self.positions.embed(q_ids, None), inputs_embeds)
        mask = step_mask(b, past, length, attention_mask, attention_dtype(hidden), device,
                         heads=self.config.num_attention_heads)
        need_probs = bool(output_attentions)
        hidden, all_hidden, probs = run_layers(
            self, ctx, hidden, lambda layer, i, h, terms: layer(h, terms, mask, cache, i, need_probs),
            output_hidden_states)
        all_probs = [p for p, in probs] if need_probs else None
        return self._returned(with_cache(BaseModelOutputWithPast, cache, last_hidden_state=hidden,
                                         hidden_states=tuple(all_hidden) if all_hidden is not None else None,
                                         attentions=tuple(all_probs) if all_probs is not None else None),
                              return_dict)


class DietForCausalLM(DietPreTrainedModel, GenerationMixin):
    """Next-token prediction with BERT's LM head (tied to the word embeddings); works with `generate()`.
    `labels` are the input ids (as in Hugging Face causal LMs): the loss predicts token t+1 from tokens <= t;
    -100 is ignored."""

    config_class = DietCausalConfig
    config: DietCausalConfig
    _no_split_modules = ["DietCausalLayer"]
    _tied_weights_keys = {"lm_head.decoder.weight": "diet.embeddings.word_embeddings.weight"}

    def __init__(self, config: DietCausalConfig):
        super().__init__(config)
        self.diet = DietCausalModel(config)
        self.lm_head = DietLMHead(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.diet.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.diet.embeddings.word_embeddings = value

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, value):
        self.lm_head.decoder = value

    @property
    def max_length(self) -> int | None:
        """Longest sequence (prompt and generated tokens) the position method serves; None: any."""
        return self.diet.positions.max_length

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, logits_to_keep: int = 0, **kwargs) -> CausalLMOutputWithPast:
        """As `DietCausalModel.forward`; logits_to_keep > 0 projects only the last that many positions."""
        past_key_values = cache_argument(past_key_values, kwargs)
        check_kwargs(kwargs, f"{type(self).__name__}.forward", CAUSAL_HARMLESS_KWARGS)
        out = self.diet(input_ids, attention_mask, position_ids, past_key_values, use_cache, output_attentions,
                        output_hidden_states, return_dict=True, inputs_embeds=inputs_embeds)
        hidden = out.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)  # (B, L, V)
        loss = None
        if labels is not None:
            if labels.shape != hidden.shape[:2]:
                raise InputError(f"labels have shape {tuple(labels.shape)}, but the input is {tuple(hidden.shape[:2])}")
            check_labels(labels, self.config.vocab_size)
            shifted = logits[:, :-1] if not logits_to_keep else self.lm_head(hidden)[:, :-1]
            loss = nn.functional.cross_entropy(shifted.reshape(-1, shifted.shape[-1]).float(),
                                               labels[:, 1:].reshape(-1), ignore_index=-100)
        return self._returned(with_cache(CausalLMOutputWithPast, cache_of(out), loss=loss, logits=logits,
                                         hidden_states=out.hidden_states, attentions=out.attentions), return_dict)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, use_cache=None,
                                      position_ids=None, inputs_embeds=None, cache=None, **kwargs):
        """The tokens not yet in the cache; positions from the attention mask when the prompt is padded
        (left padding: each row's first real token is position 0), else the default 0, 1, ... (`cache` is named
        here so that `generate()` of transformers 5.24 accepts a cache it was given.)"""
        past_key_values = cache_argument(past_key_values, {"cache": cache})
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        inputs = dict(past_key_values=past_key_values, attention_mask=attention_mask, use_cache=use_cache)
        if inputs_embeds is not None and past == 0:
            inputs["inputs_embeds"] = inputs_embeds
        else:  # a prompt given as embeddings is not in input_ids, which then holds the generated tokens only
            seen = input_ids.shape[1] + (inputs_embeds.shape[1] if inputs_embeds is not None else 0)
            inputs["input_ids"] = input_ids[:, input_ids.shape[1] - (seen - past):]
        if (position_ids is None and attention_mask is not None and attention_mask.dim() == 2
                and not bool(attention_mask.all())):
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, Lpast + L)
        if position_ids is not None:
            inputs["position_ids"] = position_ids
        for key in ("output_attentions", "output_hidden_states"):
            if kwargs.get(key) is not None:
                inputs[key] = kwargs[key]
        return inputs
