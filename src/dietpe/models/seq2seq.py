"""Encoder-decoder Transformer for translation (Vaswani et al. 2017, §3.1), with a diet position method in every
self-attention layer of encoder and decoder, as in the translation experiment of Chen et al. (2021) (§5.3,
WMT en-de/de-en/en-cs/cs-en, 6+6 layers, beam 10, length penalty 0.6).

    encoder      h = DietModel(x)                                   (BERT block layout, post-LN; its own terms)
    decoder, l:  s  = LN(y + Drop(W_O · SelfAttn(y; causal mask, LayerTerms_l of the decoder's encoding)))
                 c  = LN(s + Drop(W_O · CrossAttn(s, h; no position terms)))
                 y' = LN(c + Drop(W_2 · act(W_1 c)))
    logits = y_L · Eᵀ                                               (E: the shared source/target embedding)

Post-LN throughout, as in Vaswani et al., which the paper follows. Also theirs (§3.4, and fairseq's init):
token embeddings N(0, 1/d) multiplied by √d at the input (`scale_embedding`), so an input position term of
unit scale (sinusoids) does not drown the tokens, while the tied output projection gives unit-scale logits.
The decoder owns a second `PositionEncoding` built from the same config (its parameters are separate from
the encoder's): every method of `dietpe.positions` works causally. The decoder's view of the config is marked
causal, so T5's buckets there (also TUPE-R's) are T5's decoder's unidirectional ones (`t5_causal_bucket`).
Cross-attention gets *no* position terms: its queries (target positions) and keys (source positions) index
different sequences, so an offset i - j means nothing; position reaches cross-attention through the states,
as in Vaswani et al. and T5.
Entry points used: all four, in encoder and decoder self-attention; none in cross-attention.

Incremental decoding (`generate(use_cache=True)`): the cache (transformers' `EncoderDecoderCache`) holds the
decoder's self-attention keys and values and the cross-attention keys and values, projected once from the
encoder states. A step of t builds position terms for its one query only, `Context(q_pos=[t],
k_pos=0..t)`: one row of the bias, one rotary angle for the query, one input position id; the rows of earlier
queries were built at their own steps and are never rebuilt. Shapes as in `dietpe.positions.terms`.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn
from transformers import GenerationMixin
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from dietpe.attention.layer import MultiHeadAttention
from dietpe.attention.masks import CausalMask, additive, attention_dtype, check_4d, is_4d, refuse_empty_rows
from dietpe.config import PRESETS, DietConfig, _check
from dietpe.errors import ConfigError, InputError, may_read, value_range
from dietpe.models.beam import GnmtBeamSearch
from dietpe.models.modeling import (
    DietModel, DietPreTrainedModel, cache_argument, check_kwargs, check_labels, padding_mask, run_layers,
    with_cache,
)
from dietpe.positions.context import Context
from dietpe.positions.fields import boolean
from dietpe.positions.encoding import PositionEncoding
from dietpe.positions.terms import EMPTY

SEQ2SEQ_PRESETS: dict[str, dict] = {
    # Vaswani et al.'s base model, the paper's translation setting (6 + 6 layers, 512 wide, 8 heads).
    "transformer-base": dict(hidden_size=512, num_hidden_layers=6, num_decoder_layers=6, num_attention_heads=8,
                             intermediate_size=2048),
    # Smaller sizes for Multi30k-scale data and CPU runs.
    "transformer-small": dict(hidden_size=256, num_hidden_layers=3, num_decoder_layers=3, num_attention_heads=4,
                              intermediate_size=1024),
    "transformer-tiny": dict(hidden_size=128, num_hidden_layers=2, num_decoder_layers=2, num_attention_heads=4,
                             intermediate_size=512),
}


class DietSeq2SeqConfig(DietConfig):
    """A `DietConfig` for the encoder-decoder: the encoder has `num_hidden_layers`, the decoder
    `num_decoder_layers`; both use `position` (with separate parameters). Token ids: `pad_token_id`,
    `bos_token_id` (also the decoder start), `eos_token_id`. Segments do not exist in translation
    (`segment='none'`), and Linformer cannot be causal or decoded incrementally (`attention='full'`).
    Defaults follow Vaswani et al.'s base model: ReLU, dropout 0.1, sinusoidal positions, token embeddings
    scaled by √d (`scale_embedding`), weights drawn with std 1/√d (`initializer_range`; for the d×d attention
    projections this is Xavier's std).
    """

    model_type = "diet-seq2seq"

    def __init__(self, num_decoder_layers: int | None = None, hidden_act: str = "relu",
                 position: str = "sinusoidal", segment: str = "none", max_position_embeddings: int = 256,
                 layer_norm_eps: float = 1e-6, pad_token_id: int = 0, bos_token_id: int = 1,
                 eos_token_id: int = 2, decoder_start_token_id: int | None = None, is_encoder_decoder: bool = True,
                 tie_word_embeddings: bool = True, use_cache: bool = True, scale_embedding: bool = True,
                 initializer_range: float | None = None, **kwargs):
        self.num_decoder_layers = num_decoder_layers if num_decoder_layers is not None else \
            kwargs.get("num_hidden_layers", 12)
        self.decoder_start_token_id = bos_token_id if decoder_start_token_id is None else decoder_start_token_id
        self.use_cache = use_cache
        self.scale_embedding = scale_embedding
        if initializer_range is None:
            initializer_range = kwargs.get("hidden_size", 768) ** -0.5
        super().__init__(initializer_range=initializer_range, hidden_act=hidden_act, position=position, segment=segment,
                         max_position_embeddings=max_position_embeddings, layer_norm_eps=layer_norm_eps,
                         pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         is_encoder_decoder=is_encoder_decoder, tie_word_embeddings=tie_word_embeddings, **kwargs)

    def validate(self) -> None:
        super().validate()
        n = self.num_decoder_layers
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"num_decoder_layers={n!r} must be a positive integer")
        if self.segment != "none":
            raise ConfigError(f"segment={self.segment!r}: translation models have no segments; use segment='none'")
        if self.attention != "full":
            raise ConfigError(f"attention={self.attention!r}: the decoder is causal and decoded one token at a "
                              f"time, which Linformer's length projection cannot do; use attention='full'")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ConfigError(f"{name}={value!r} must be a token id in [0, {self.vocab_size - 1}]")
        for name in ("scale_embedding", "use_cache", "tie_word_embeddings"):  # "no" would read as true
            boolean(name, getattr(self, name))

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "DietSeq2SeqConfig":
        """`transformer-base` (the paper's), `transformer-small`, `transformer-tiny`, or a BERT preset's sizes
        (then the decoder gets as many layers as the encoder)."""
        _check("preset", name, tuple(SEQ2SEQ_PRESETS) + tuple(PRESETS))
        sizes = SEQ2SEQ_PRESETS.get(name) or {**PRESETS[name], "num_decoder_layers": PRESETS[name]["num_hidden_layers"]}
        return cls(**{**sizes, **overrides})

    def decoder_view(self) -> "DietSeq2SeqConfig":
        """The same config with the decoder's depth, for what is sized per layer (Shaw, XLNet, DIET tables),
        marked causal, for what depends on the direction of attention (T5's buckets)."""
        view = copy.deepcopy(self)
        view.num_hidden_layers = self.num_decoder_layers
        view.causal = True  # causal self-attention: T5's unidirectional buckets (dietpe.positions.method.causal)
        return view


class ScaledEmbedding(nn.Embedding):
    """Token embedding times a constant (√d: Vaswani et al. §3.4); the weight itself stays tied unscaled."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, scale: float):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        self.scale = scale

    def forward(self, input_ids: Tensor) -> Tensor:
        return super().forward(input_ids) * self.scale


def causal_mask(q_index: Tensor, k_index: Tensor, dtype: torch.dtype) -> Tensor:
    """(1, 1, Lq, Lk) additive: query i sees key j iff j comes no later in the sequence (k_index[j] <= q_index[i],
    also right when keys are cached). Sequence indices, not position ids: causality is about order."""
    blocked = k_index[None, :] > q_index[:, None]  # (Lq, Lk)
    return (blocked.to(dtype) * torch.finfo(dtype).min)[None, None]


def _add_masks(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None or b is None:
        return a if b is None else b
    return (a + b).clamp(min=torch.finfo(a.dtype).min)  # two "min"s must not overflow to -inf


def step_positions(positions: PositionEncoding, position_ids: Tensor | None, batch: int, past: int, length: int,
                   device: torch.device) -> tuple[Context, Tensor]:
    """The positions of one causal step: `length` new tokens after `past` cached ones. position_ids cover cached
    and new tokens (default 0 .. past + length - 1). Returns the context of the new queries against every key
    (only the new rows are built; earlier ones were built at their own steps) and the new tokens' input
    position ids (1|B, length)."""
    if position_ids is None:
        positions.check(past + length, None)  # learned tables refuse lengths beyond them
    k_pos, k_ids = positions.positions(position_ids, batch, past + length, device)  # (Lk,) | (B, Lk); (1|B, Lk)
    ctx = positions.context(k_pos[..., past:], k_pos, None, starts=(past, 0) if position_ids is None else None)
    return ctx, k_ids[..., past:]


def step_mask(batch: int, past: int, length: int, attention_mask: Tensor | None, dtype: torch.dtype,
              device: torch.device, name: str = "attention_mask", heads: int = 1) -> Tensor | None:
    """Causality (by sequence order) plus padding for `length` new tokens after `past` cached ones; None when
    one new token sees every key; a `CausalMask` (SDPA's is_causal, no tensor) for causality alone, with
    nothing cached and nothing padded. attention_mask: (B, past + length), 1 = keep; or 4-D (B|1, 1|H, length,
    past + length) (`dietpe.attention.masks`), combined with causality: (B|1, 1|H, length, past + length)."""
    k_index = torch.arange(past + length, device=device)
    if is_4d(attention_mask):
        keep = check_4d(attention_mask, batch, heads, length, past + length, name)
        keep = keep & (k_index[None, :] <= k_index[past:, None])  # (Lq, Lk): causality by sequence order
        refuse_empty_rows(keep, name)
        return additive(keep, dtype)
    padding = None
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (batch, past + length):
            raise InputError(f"{name} has shape {tuple(attention_mask.shape)}, but there are {past} cached + "
                             f"{length} new tokens: give (batch, {past + length}) = ({batch}, {past + length}) or "
                             f"4-D (batch|1, 1|heads, {length}, {past + length})")
        padding = padding_mask(attention_mask, dtype)  # None when nothing is padded (and that is read)
    if padding is None and past == 0 and length > 1:
        return CausalMask(length, dtype, device)
    mask = causal_mask(k_index[past:], k_index, dtype) if length > 1 else None
    return _add_masks(mask, padding)


def shift_right(labels: Tensor, start_id: int, pad_id: int) -> Tensor:
    """Teacher forcing: decoder input = [start] + labels[:-1], with ignored (-100) labels read as padding."""
    out = labels.new_full(labels.shape, pad_id)
    out[:, 1:] = labels[:, :-1]
    out[:, 0] = start_id
    return out.masked_fill(out == -100, pad_id)


class DietDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: DietSeq2SeqConfig):
        super().__init__()
        d = config.hidden_size
        self.self_attention = MultiHeadAttention(config)
        self.self_output = nn.Linear(d, d)
        self.self_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.cross_attention = MultiHeadAttention(config)
        self.cross_output = nn.Linear(d, d)
        self.cross_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(d, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, d)
        self.output_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, terms, self_mask, memory, memory_mask, cache: EncoderDecoderCache | None,
                index: int, need_probs: bool):
        # self-attention: the new keys and values join the cache, the query attends to all of them
        kv = self.self_attention.keys_values(hidden)
        if cache is not None:
            kv = cache.self_attention_cache.update(*kv, index)
        attn, self_probs, _ = self.self_attention(hidden, terms, self_mask, kv=kv, need_probs=need_probs)
        hidden = self.self_norm(hidden + self.dropout(self.self_output(attn)))
        # cross-attention: the encoder states are projected once per generation, at the first step
        if cache is not None and cache.is_updated.get(index):
            layer = cache.cross_attention_cache.layers[index]
            kv = layer.keys, layer.values
        else:
            kv = self.cross_attention.keys_values(memory)
            if cache is not None:
                kv = cache.cross_attention_cache.update(*kv, index)
                cache.is_updated[index] = True
        attn, cross_probs, _ = self.cross_attention(hidden, EMPTY, memory_mask, kv=kv, need_probs=need_probs)
        hidden = self.cross_norm(hidden + self.dropout(self.cross_output(attn)))
        ffn = self.output(self.act(self.intermediate(hidden)))
        return self.output_norm(hidden + self.dropout(ffn)), self_probs, cross_probs


class DietDecoder(nn.Module):
    """Target-side stack. Reads token embeddings through the shared table it is handed (joint vocabulary)."""

    def __init__(self, config: DietSeq2SeqConfig):
        super().__init__()
        self.positions = PositionEncoding(config.decoder_view())  # separate parameters from the encoder's
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(DietDecoderLayer(config) for _ in range(config.num_decoder_layers))

    def forward(self, input_ids: Tensor, embed_tokens: nn.Embedding, memory: Tensor, memory_mask: Tensor | None,
                cache: EncoderDecoderCache | None = None, attention_mask: Tensor | None = None,
                need_probs: bool = False, output_hidden_states: bool = False, position_ids: Tensor | None = None):
        """position_ids: (Lk,), (1, Lk) or (B, Lk) positions of the cached tokens and the new ones, like
        `attention_mask` (default 0 .. Lk-1)."""
        past = cache.get_seq_length() if cache is not None else 0
        batch, length = input_ids.shape
        ctx, q_ids = step_positions(self.positions, position_ids, batch, past, length, input_ids.device)
        x = embed_tokens(input_ids)
        extra = self.positions.embed(q_ids, None)
        if extra is not None:
            x = x + extra.to(x.dtype)
        hidden = self.dropout(self.LayerNorm(x))
        self_mask = step_mask(batch, past, length, attention_mask, attention_dtype(hidden), input_ids.device,
                              "decoder_attention_mask", self.layers[0].self_attention.num_heads)
        hidden, all_hidden, probs = run_layers(
            self, ctx, hidden,
            lambda layer, i, h, terms: layer(h, terms, self_mask, memory, memory_mask, cache, i, need_probs),
            output_hidden_states)
        return hidden, all_hidden, [p for p, _ in probs], [p for _, p in probs]


# what generate() and Trainer may pass that carries nothing here
SEQ2SEQ_HARMLESS_KWARGS = frozenset({"cache_position"})


def check_dynamic(cache, kind: type = Cache) -> None:
    """A cache whose layers grow with the tokens (DynamicCache's, generate()'s default): masks and positions read
    its length as the tokens seen. A static cache's slots are allocated ahead, and the empty ones would be
    attended as if they held tokens."""
    if not isinstance(cache, kind):
        raise InputError(f"past_key_values must be a transformers {kind.__name__}, got {type(cache).__name__}")
    parts = (cache.self_attention_cache, cache.cross_attention_cache) if isinstance(cache, EncoderDecoderCache) \
        else (cache,)
    fixed = [type(layer).__name__ for part in parts for layer in part.layers if not isinstance(layer, DynamicLayer)]
    if fixed:
        raise InputError(f"past_key_values holds {fixed[0]} layers, a cache of a fixed size; diet's own models "
                         f"decode with a DynamicCache (generate()'s default: leave out cache_implementation)")


def ensure_layers(cache: DynamicCache, n: int) -> None:
    """A cache made without the config (or by another model) gets a layer per attention layer: generate() sizes
    an encoder-decoder's caches from `num_hidden_layers` (the encoder's depth), the decoder may be deeper."""
    while len(cache.layers) < n:
        cache.layers.append(DynamicLayer())


class DietForConditionalGeneration(GnmtBeamSearch, DietPreTrainedModel, GenerationMixin):
    """Encoder-decoder with a language-model head tied to the shared embedding; works with `generate()`, whose
    beam search also takes GNMT's length penalty (`length_penalty_form="gnmt"`, `dietpe.models.beam`)."""

    config_class = DietSeq2SeqConfig
    config: DietSeq2SeqConfig
    base_model_prefix = "model"
    _no_split_modules = ["DietLayer", "DietDecoderLayer"]
    _tied_weights_keys = {"lm_head.weight": "encoder.embeddings.word_embeddings.weight"}

    def __init__(self, config: DietSeq2SeqConfig):
        super().__init__(config)
        self.encoder = DietModel(config, add_pooling_layer=False)
        if config.scale_embedding:  # the one shared table, read by encoder and decoder
            self.encoder.embeddings.word_embeddings = ScaledEmbedding(
                config.vocab_size, config.hidden_size, config.pad_token_id, math.sqrt(config.hidden_size))
        self.decoder = DietDecoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.encoder.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.encoder.embeddings.word_embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def get_encoder(self, modality=None):
        return self.encoder

    def generate(self, *args, labels: Tensor | None = None, **kwargs):
        """`generate()`; `labels` (which Seq2SeqTrainer's prediction step passes with the batch) are not read:
        transformers would hand them to the encoder, which refuses what it does not take."""
        return super().generate(*args, **kwargs)

    def get_decoder(self, modality=None):
        return self.decoder

    @property
    def max_decode_length(self) -> int | None:
        """Longest decoder sequence (start token included) the position method serves; None: any."""
        return self.decoder.positions.max_length

    def _target(self, decoder_input_ids: Tensor | None, labels: Tensor | None, batch: int) -> Tensor:
        """The decoder's input ids (`labels` shifted right where none are given), checked with the labels
        against each other, the source's batch and the vocabulary."""
        if decoder_input_ids is None:
            if labels is None:
                raise InputError("give decoder_input_ids or labels")
            decoder_input_ids = shift_right(labels, self.config.decoder_start_token_id, self.config.pad_token_id)
        if decoder_input_ids.dim() != 2 or 0 in decoder_input_ids.shape:
            raise InputError(f"decoder_input_ids must be (batch, length) with both > 0, got shape "
                             f"{tuple(decoder_input_ids.shape)}")
        if decoder_input_ids.shape[0] != batch:
            raise InputError(f"decoder_input_ids hold {decoder_input_ids.shape[0]} sequences, the source "
                             f"{batch}: one target per source")
        if labels is not None:
            if labels.shape != decoder_input_ids.shape:
                raise InputError(f"labels have shape {tuple(labels.shape)}, decoder_input_ids "
                                 f"{tuple(decoder_input_ids.shape)}: one label per target token (-100 where none)")
            check_labels(labels, self.config.vocab_size)
        lo, hi = value_range(decoder_input_ids) if may_read(decoder_input_ids) else (0, 0)  # no GPU step sync
        if lo < 0 or hi >= self.config.vocab_size:
            raise InputError(f"decoder token id {lo if lo < 0 else hi} is outside the vocabulary "
                             f"[0, {self.config.vocab_size - 1}]")
        return decoder_input_ids

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: Cache | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        position_ids: Tensor | None = None,
        decoder_position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """input_ids (B, S) source (or inputs_embeds (B, S, D)); decoder_input_ids (B, T) target so far (or
        `labels`, shifted right). With `past_key_values`, decoder_input_ids holds only the tokens not yet in the
        cache. position_ids: the source's, (S,), (1, S) or (B, S); decoder_position_ids: the target's, covering
        cached and new tokens like decoder_attention_mask. Default: 0, 1, ... on both sides.
        logits_to_keep: if > 0, project only the last that many positions (generate() needs only the last)."""
        past_key_values = cache_argument(past_key_values, kwargs)
        check_kwargs(kwargs, f"{type(self).__name__}.forward", SEQ2SEQ_HARMLESS_KWARGS)
        output_attentions, output_hidden_states = self._outputs_asked(output_attentions, output_hidden_states)
        if is_4d(attention_mask):  # a 4-D source mask does not say which source tokens are padding
            raise InputError("attention_mask (the source's) must be (batch, source length): cross-attention needs "
                             "the source's padding; 4-D masks are taken by decoder_attention_mask")
        if encoder_outputs is None:
            if input_ids is None and inputs_embeds is None:
                raise InputError("give input_ids (the source) or encoder_outputs")
            encoder_outputs = self.encoder(input_ids, attention_mask, position_ids=position_ids,
                                           inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                                           output_hidden_states=output_hidden_states, return_dict=True)
        elif isinstance(encoder_outputs, (tuple, list)):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        memory = encoder_outputs.last_hidden_state  # (B, S, D)
        decoder_input_ids = self._target(decoder_input_ids, labels, memory.shape[0])
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(), DynamicCache())
        cache = past_key_values if use_cache or past_key_values is not None else None
        if cache is not None:
            check_dynamic(cache, EncoderDecoderCache)
            for part in (cache.self_attention_cache, cache.cross_attention_cache):
                ensure_layers(part, self.config.num_decoder_layers)
        memory_mask = padding_mask(attention_mask, attention_dtype(memory))
        hidden, all_hidden, self_probs, cross_probs = self.decoder(
            decoder_input_ids, self.get_input_embeddings(), memory, memory_mask,
            cache, decoder_attention_mask, bool(output_attentions), bool(output_hidden_states), decoder_position_ids)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                               ignore_index=-100)
        return self._returned(with_cache(
            Seq2SeqLMOutput, cache, loss=loss, logits=logits,
            decoder_hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            decoder_attentions=tuple(self_probs) if output_attentions else None,
            cross_attentions=tuple(cross_probs) if output_attentions else None,
            encoder_last_hidden_state=memory, encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions), return_dict)
