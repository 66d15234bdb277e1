"""diet Transformer encoders as Hugging Face models, in BERT's block layout (Devlin et al. 2019):

    h_0 = LayerNorm(token + input position + input segment)          (input terms, if the method has them)
    a   = LayerNorm(h + Dropout(W_O · Attention(h; LayerTerms_l)))    (qk, logit and value terms per layer)
    h'  = LayerNorm(a + Dropout(W_2 · GELU(W_1 a)))

The position encoding builds every layer's terms once per forward from positions (and segments) alone and
passes them down; layers never look at the method's name.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers import initialization as hf_init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
)

from dietpe.attention.layer import MultiHeadAttention
from dietpe.attention.masks import additive, attention_dtype, check_4d, is_4d, keep_of, refuse_empty_rows
from dietpe.attention.registry import resolve_backend
from dietpe.config import NEEDS_PROBABILITIES, DietConfig, backend_for
from dietpe.errors import ConfigError, InputError, may_read, value_range
from dietpe.positions.encoding import PositionEncoding
from dietpe.positions.method import PositionMethod
from dietpe.positions.registry import REGISTRY
from dietpe.positions.segments import InputSegments


# Keyword arguments the Hugging Face stack may pass that carry nothing for an encoder; anything else unknown
# is refused rather than silently ignored.
HARMLESS_KWARGS = frozenset({"use_cache", "logits_to_keep"})  # an encoder has no cache and no logits


def check_kwargs(kwargs: dict, where: str, allowed: frozenset = HARMLESS_KWARGS) -> None:
    unknown = sorted(k for k in kwargs if k not in allowed)
    if unknown:
        raise InputError(f"{where} got unexpected keyword argument(s) {', '.join(map(repr, unknown))}")


def cache_argument(past_key_values, kwargs: dict):
    """The decoding cache of a forward: `past_key_values`, or `cache`, the name transformers' `generate()` passes
    from 5.24 on (taken out of kwargs)."""
    cache = kwargs.pop("cache", None)
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise InputError("got both `cache` and `past_key_values`; give one")
    return past_key_values if past_key_values is not None else cache


def _cache_field() -> str:
    from transformers.modeling_outputs import BaseModelOutputWithPast

    return "cache" if "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)} else "past_key_values"


# The name model outputs give the decoding cache in the installed transformers (`cache` from 5.24,
# `past_key_values` before; one rename for every output class). Read once: a forward compiled with
# fullgraph=True cannot call dataclasses.fields.
CACHE_FIELD = _cache_field()


def with_cache(output_cls, cache, **fields):
    """A model output with the cache under the name the installed transformers gives it: `generate()` looks for
    it there."""
    return output_cls(**fields, **{CACHE_FIELD: cache})


def cache_of(output):
    """The cache of a model output, under the name its class has (reading the other name would warn)."""
    return getattr(output, CACHE_FIELD, None)


def run_layers(model: nn.Module, ctx, hidden: Tensor, call, output_hidden_states: bool
               ) -> tuple[Tensor, list[Tensor] | None, list[list]]:
    """hidden through `model.layers`, each given its terms from the forward's position context (made ready for
    recomputation under activation checkpointing): call(layer, i, hidden, terms) -> (hidden, *probs). Returns
    the last hidden states, every layer's after the input's where asked (else None), and each layer's probs.
    The context is released even if a layer raises, so the objects it kept are free for the next forward."""
    all_hidden, probs = [hidden] if output_hidden_states else None, []
    recompute = model.training and any(layer.gradient_checkpointing for layer in model.layers)
    try:
        for i, layer in enumerate(model.layers):
            terms = model.positions.layer_terms(ctx, i)
            hidden, *layer_probs = call(layer, i, hidden, terms.for_checkpointing() if recompute else terms)
            probs.append(layer_probs)
            if all_hidden is not None:
                all_hidden.append(hidden)
    finally:
        ctx.release()
    return hidden, all_hidden, probs


def check_like(name: str, value: Tensor | None, shape: tuple[int, ...]) -> None:
    """A per-token input (attention_mask, token_type_ids) must have the input's (batch, length) shape."""
    if value is None:
        return
    if not isinstance(value, Tensor):
        raise InputError(f"{name} must be a tensor, got {type(value).__name__}")
    if tuple(value.shape) != shape:
        raise InputError(f"{name} has shape {tuple(value.shape)}, but the input is (batch, length) = {shape}")


def check_attention_mask(attention_mask: Tensor | None, batch: int, heads: int, lq: int, lk: int,
                         name: str = "attention_mask") -> None:
    """(batch, Lk) padding, or 4-D (batch|1, 1|heads, Lq, Lk) (`dietpe.attention.masks`); one line if not."""
    if isinstance(attention_mask, Tensor) and attention_mask.dim() not in (2, 4):
        raise InputError(f"{name} has shape {tuple(attention_mask.shape)}; give (batch, length) = ({batch}, {lk}) "
                         f"or 4-D (batch|1, 1|heads, queries, keys) = ({batch}|1, 1|{heads}, {lq}, {lk})")
    if is_4d(attention_mask):
        refuse_empty_rows(check_4d(attention_mask, batch, heads, lq, lk, name), name)
    else:
        check_like(name, attention_mask, (batch, lk))


def attention_bias(attention_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """The additive mask the backends add, from a checked mask: (B, Lk) -> (B, 1, 1, Lk) or None
    (`padding_mask`); 4-D -> (B|1, 1|H, Lq, Lk), built once per forward."""
    if is_4d(attention_mask):
        return additive(keep_of(attention_mask), dtype)
    return padding_mask(attention_mask, dtype)


def padding_mask(attention_mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """(B, Lk) 1 = keep, 0 = pad  ->  additive (B, 1, 1, Lk), or None when nothing is padded (while compiling
    the mask is always built: looking would break the graph)."""
    if attention_mask is None or (may_read(attention_mask) and bool(attention_mask.all())):
        return None
    return ((1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min)


def _refuse_reentrant(checkpointing_kwargs: dict | None) -> None:
    if (checkpointing_kwargs or {}).get("use_reentrant"):
        raise ConfigError("use_reentrant=True checkpointing would lose the gradients of position terms that "
                          "reach layers outside their tensor arguments; use use_reentrant=False (the default)")


def _implementation_to_backend(kwargs: dict) -> None:
    """`from_pretrained(..., attn_implementation=...)`: the request becomes `attn_backend`, overriding the saved
    one (Hugging Face's own handling would keep the saved backend and record the request only)."""
    if kwargs.get("attn_implementation") is None:
        return
    backend = backend_for(kwargs.pop("attn_implementation"), kwargs.get("attn_backend", "auto"))
    config = kwargs.get("config")
    if isinstance(config, PretrainedConfig):
        kwargs["config"] = config = copy.deepcopy(config)
        config.attn_backend = backend
        config.validate()
    else:
        kwargs["attn_backend"] = backend


class DietPreTrainedModel(PreTrainedModel):
    config_class = DietConfig
    config: DietConfig
    base_model_prefix = "diet"
    supports_gradient_checkpointing = True  # non-reentrant only (see activation_checkpointing_enable)
    _no_split_modules = ["DietLayer"]
    # a head's loss is a mean over its batch: Trainer scales it for accumulation and DDP (the masked LM's, a mean
    # over labelled tokens that vary in number, takes the step's count instead)
    accepts_loss_kwargs = False

    def _outputs_asked(self, attentions: bool | None, hidden_states: bool | None) -> tuple[bool, bool]:
        """output_attentions and output_hidden_states: the call's, else the config's (Hugging Face's rule)."""
        config = self.config
        return (bool(getattr(config, "output_attentions", False) if attentions is None else attentions),
                bool(getattr(config, "output_hidden_states", False) if hidden_states is None else hidden_states))

    def _returned(self, output, return_dict: bool | None):
        """The output, or with return_dict=False (the call's, else the config's) its fields that are not None
        as a tuple, as Hugging Face's models return them."""
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """Hugging Face's `from_pretrained`, refusing a folder diet did not write (a BERT, Llama or GPT-2
        checkpoint would otherwise load as a diet model with random weights and only a warning)."""
        config = kwargs.get("config")
        if not isinstance(config, PretrainedConfig) and pretrained_model_name_or_path is not None:
            try:
                found = PretrainedConfig.get_config_dict(pretrained_model_name_or_path)[0].get("model_type")
            except (OSError, ValueError):
                found = None  # no config.json: Hugging Face's own error follows
            wanted = cls.config_class.model_type
            if found is not None and found != wanted:
                way = ("dietpe.models.bert.from_bert(path or model)" if found in ("bert", "roberta")
                       else "dietpe.attach(model, spec)")
                raise ConfigError(f"{pretrained_model_name_or_path}: model_type {found!r} was not written by diet "
                                  f"({cls.__name__} reads model_type {wanted!r}); load it with its own class and "
                                  f"use {way} (see docs/integrate.md)")
        _implementation_to_backend(kwargs)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    @classmethod
    def _from_config(cls, config, **kwargs):
        """`AutoModel.from_config(config, attn_implementation=...)`: the request becomes the backend."""
        if kwargs.get("attn_implementation") is not None:
            config = copy.deepcopy(config)
            config.attn_backend = backend_for(kwargs.pop("attn_implementation"), kwargs.pop("attn_backend", "auto"))
            config.validate()
        return super()._from_config(config, **kwargs)

    def set_attn_implementation(self, attn_implementation, allow_all_kernels: bool = False):
        """Hugging Face's switch between attention implementations, onto diet's backends: 'eager', 'sdpa' or
        'flex_attention' (a backend that cannot serve the method is refused, naming it)."""
        if isinstance(attn_implementation, dict):
            attn_implementation = attn_implementation.get("", attn_implementation)
        backend = backend_for(attn_implementation)
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                module.backend = resolve_backend(backend, value_terms=self.config.position in NEEDS_PROBABILITIES,
                                                 dropout=self.config.attention_probs_dropout_prob,
                                                 subject=f"position={self.config.position!r}",
                                                 method=REGISTRY[self.config.position])
        self.config.attn_backend = backend

    def resize_token_embeddings(self, *args, **kwargs):
        """Hugging Face's, with the LM head's output bias resized too."""
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        head = getattr(self, "lm_head", None)
        if isinstance(head, DietLMHead):
            head.resize_bias(embeddings.num_embeddings)
        return embeddings

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        """Hugging Face's activation (gradient) checkpointing of every layer, non-reentrant: position terms
        reach the layers as Python objects, not tensor arguments, which reentrant checkpointing would cut
        off from their gradients."""
        _refuse_reentrant(activation_checkpointing_kwargs)
        enable = getattr(super(), "activation_checkpointing_enable", None)
        if enable is None:  # transformers before 5.24 names it gradient_checkpointing_enable
            return super().gradient_checkpointing_enable(activation_checkpointing_kwargs, **kwargs)
        return enable(activation_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        """The same under its older name: older transformers 5 releases have only this one (their Trainer calls
        it); newer ones keep it as an alias of `activation_checkpointing_enable`."""
        _refuse_reentrant(gradient_checkpointing_kwargs)
        return super().gradient_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, (PositionMethod, InputSegments)):
            module.reset_parameters(std)
        elif isinstance(module, MultiHeadAttention) and module.proj_k is not None:
            hf_init.normal_(module.proj_k, std=1.0 / module.proj_k.shape[0])
            hf_init.normal_(module.proj_v, std=1.0 / module.proj_v.shape[0])
        elif isinstance(module, DietLMHead):
            hf_init.zeros_(module.bias)


class DietEmbeddings(nn.Module):
    """Token embeddings plus whatever the position encoding adds at the input."""

    def __init__(self, config: DietConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor | None, extra: Tensor | None, inputs_embeds: Tensor | None = None) -> Tensor:
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if extra is not None:
            x = x + extra.to(x.dtype)
        return self.dropout(self.LayerNorm(x))


class DietLayer(GradientCheckpointingLayer):
    def __init__(self, config: DietConfig):
        super().__init__()
        self.attention = MultiHeadAttention(config, linformer=config.attention == "linformer")
        self.attention_output = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, terms, mask, key_padding, need_probs):
        attn, probs, _ = self.attention(hidden, terms, mask, key_padding=key_padding, need_probs=need_probs)
        hidden = self.attention_norm(hidden + self.dropout(self.attention_output(attn)))
        ffn = self.output(self.act(self.intermediate(hidden)))
        return self.output_norm(hidden + self.dropout(ffn)), probs


class DietModel(DietPreTrainedModel):
    """The encoder: embeddings, position encoding, and the stack of layers; optional BERT pooler."""

    def __init__(self, config: DietConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = DietEmbeddings(config)
        self.positions = PositionEncoding(config)
        self.layers = nn.ModuleList(DietLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def _check_inputs(self, input_ids: Tensor | None, inputs_embeds: Tensor | None, attention_mask: Tensor | None,
                      token_type_ids: Tensor | None) -> tuple[int, int]:
        """Refuse malformed inputs with one line naming the value and the limit; returns (batch, length)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise InputError("give exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            if not isinstance(input_ids, Tensor) or input_ids.dtype.is_floating_point or input_ids.dim() != 2:
                what = (f"shape {tuple(input_ids.shape)} {input_ids.dtype}" if isinstance(input_ids, Tensor)
                        else type(input_ids).__name__)
                raise InputError(f"input_ids must be an integer tensor (batch, length), got {what}")
            shape = tuple(input_ids.shape)
        else:
            d = self.config.hidden_size
            if not isinstance(inputs_embeds, Tensor) or inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != d:
                what = tuple(inputs_embeds.shape) if isinstance(inputs_embeds, Tensor) else type(inputs_embeds)
                raise InputError(f"inputs_embeds must be (batch, length, hidden_size={d}), got {what}")
            shape = tuple(inputs_embeds.shape[:2])
        if 0 in shape:
            raise InputError(f"empty input: (batch, length) = {shape}")
        if is_4d(attention_mask) and self.config.attention == "linformer":
            raise InputError("attention='linformer' projects keys along the length, so it cannot take a 4-D "
                             "attention_mask; give a (batch, length) padding mask")
        check_attention_mask(attention_mask, shape[0], self.config.num_attention_heads, shape[1], shape[1])
        check_like("token_type_ids", token_type_ids, shape)
        if token_type_ids is not None and token_type_ids.dtype.is_floating_point:
            raise InputError(f"token_type_ids must be integers, got {token_type_ids.dtype}")
        self.positions.check(shape[1], token_type_ids)
        if not may_read(input_ids if input_ids is not None else inputs_embeds):
            return shape  # the checks of values read the data (a graph break, a host sync on a GPU)
        if input_ids is not None:
            lo, hi = value_range(input_ids)
            if lo < 0 or hi >= self.config.vocab_size:
                raise InputError(f"token id {lo if lo < 0 else hi} is outside the vocabulary "
                                 f"[0, {self.config.vocab_size - 1}] (vocab_size={self.config.vocab_size})")
        elif not bool(torch.isfinite(inputs_embeds).all()):
            raise InputError("inputs_embeds contains NaN or infinite values")
        return shape

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        inputs_embeds: Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPooling:
        """input_ids (B, L), or inputs_embeds (B, L, D) used instead of the token embeddings (the input
        position and segment terms are still added). position_ids: (L,), (1, L) or (B, L), default 0 .. L-1;
        every method reads them (relative ones through pos_i - pos_j). attention_mask: (B, L) 1 = token, or
        4-D (B|1, 1|H, L, L) boolean, integer or additive (`dietpe.attention.masks`): with position_ids
        restarting at 0 per document, a block-diagonal one keeps packed documents apart."""
        check_kwargs(kwargs, f"{type(self).__name__}.forward")
        output_attentions, output_hidden_states = self._outputs_asked(output_attentions, output_hidden_states)
        b, length = self._check_inputs(input_ids, inputs_embeds, attention_mask, token_type_ids)
        device = (input_ids if input_ids is not None else inputs_embeds).device
        starts = (0, 0) if position_ids is None else None  # default positions: known runs 0 .. L-1
        pos, position_ids = self.positions.positions(position_ids, b, length, device)  # (L,) | (B, L); (1|B, L)
        if token_type_ids is None and self.positions.num_segments:
            token_type_ids = torch.zeros(b, length, dtype=torch.long, device=device)
        hidden = self.embeddings(input_ids, self.positions.embed(position_ids, token_type_ids), inputs_embeds)
        # position-only terms are built here, once per forward, and handed to every layer
        ctx = self.positions.context(pos, pos, token_type_ids, starts=starts)
        mask = attention_bias(attention_mask, attention_dtype(hidden))
        key_padding = None if is_4d(attention_mask) else attention_mask  # Linformer's (B, L) only
        need_probs = bool(output_attentions)
        hidden, all_hidden, probs = run_layers(
            self, ctx, hidden, lambda layer, i, h, terms: layer(h, terms, mask, key_padding, need_probs),
            output_hidden_states)
        all_probs = [p for p, in probs] if need_probs else None
        pooled = torch.tanh(self.pooler(hidden[:, 0])) if self.pooler is not None else None
        return self._returned(BaseModelOutputWithPooling(
            last_hidden_state=hidden, pooler_output=pooled,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_probs) if all_probs is not None else None), return_dict)


class DietLMHead(nn.Module):
    """BERT's MLM head: transform, then a decoder tied to the word embeddings."""

    def __init__(self, config: DietConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.LayerNorm(self.act(self.dense(hidden)))) + self.bias

    def resize_bias(self, size: int) -> None:
        """The output bias at a new vocabulary size: kept rows kept, new rows 0 (`resize_token_embeddings`
        resizes the tied decoder, not this separate parameter)."""
        old = self.bias
        if old.shape[0] != size:
            new = old.new_zeros(size)
            new[:min(size, old.shape[0])] = old.detach()[:size]
            self.bias = nn.Parameter(new, requires_grad=old.requires_grad)


def check_labels(labels: Tensor, vocab_size: int) -> None:
    """Token ids or -100 (no loss there); read where `may_read` allows (a GPU training step's labels come from
    the commands' collators)."""
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise InputError(f"labels have dtype {labels.dtype}; they are token ids (an integer tensor, -100 where none)")
    if labels.numel() and may_read(labels):
        lo, hi = value_range(labels.masked_fill(labels == -100, 0))
        if lo < 0 or hi >= vocab_size:
            raise InputError(f"label {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab_size - 1}] "
                             f"(-100 marks a token without a label)")


class DietForMaskedLM(DietPreTrainedModel):
    """BERT's masked LM. Its loss is the mean over the batch's labelled tokens; under Trainer, over the whole
    step's (`num_items_in_batch`: every accumulated micro-batch of every process), so that how a batch is split
    over processes and accumulation changes float rounding only, as one batch of BERT's would be."""

    _tied_weights_keys = {"lm_head.decoder.weight": "diet.embeddings.word_embeddings.weight"}
    accepts_loss_kwargs = True

    def __init__(self, config: DietConfig):
        super().__init__(config)
        self.diet = DietModel(config, add_pooling_layer=False)
        self.lm_head = DietLMHead(config)
        if config.tie_word_embeddings:  # saved once, as the word embeddings: Trainer's resume then re-ties it
            self._keys_to_ignore_on_save = ["lm_head.decoder.weight"]  # instead of warning it missing
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, value):
        self.lm_head.decoder = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, inputs_embeds=None,
                num_items_in_batch=None, **kwargs) -> MaskedLMOutput:
        check_kwargs(kwargs, f"{type(self).__name__}.forward")
        out = self.diet(input_ids, attention_mask, token_type_ids, position_ids, output_attentions,
                        output_hidden_states, return_dict=True, inputs_embeds=inputs_embeds)
        hidden = out.last_hidden_state
        if labels is not None and labels.numel() != hidden.shape[:-1].numel():  # BERT's head takes them flat too
            raise InputError(f"labels of shape {tuple(labels.shape)} for inputs of shape {tuple(hidden.shape[:-1])}: "
                             f"one label per token (-100 where none)")
        if labels is not None:
            check_labels(labels, self.config.vocab_size)
        if labels is not None and self.config.sparse_prediction:
            # the head and the loss on the labelled tokens alone (about 15% of them): no (B, L, V) logits
            labels = labels.reshape(hidden.shape[:-1])
            keep = labels != -100
            hidden, labels = hidden[keep], labels[keep]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None and num_items_in_batch is not None:  # this micro-batch's share of the step's mean
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1),
                                               ignore_index=-100, reduction="sum") / num_items_in_batch
        elif labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1),
                                               ignore_index=-100)
        return self._returned(MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                             attentions=out.attentions), return_dict)


class DietForSequenceClassification(DietPreTrainedModel):
    """[CLS] pooled output -> classifier. The loss by the config's `problem_type`, else as BERT chooses it:
    regression (MSE) for num_labels == 1 (STS-B), cross-entropy for integer labels, binary cross-entropy for
    float ones (multi-label)."""

    def __init__(self, config: DietConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.diet = DietModel(config)
        drop = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(drop)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, inputs_embeds=None,
                **kwargs) -> SequenceClassifierOutput:
        check_kwargs(kwargs, f"{type(self).__name__}.forward")
        out = self.diet(input_ids, attention_mask, token_type_ids, position_ids, output_attentions,
                        output_hidden_states, return_dict=True, inputs_embeds=inputs_embeds)
        logits = self.classifier(self.dropout(out.pooler_output))
        loss = None if labels is None else self._loss(logits, labels)
        return self._returned(SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                                       attentions=out.attentions), return_dict)


    def _loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Hugging Face's rule: `problem_type` when the config gives it, else regression for one label,
        single-label classification for integer labels, multi-label for float ones."""
        problem = self.config.problem_type or (
            "regression" if self.num_labels == 1 else
            "multi_label_classification" if labels.dtype.is_floating_point else "single_label_classification")
        if problem == "regression":
            if labels.numel() != logits.numel():
                raise InputError(f"regression labels of shape {tuple(labels.shape)} for logits of shape "
                                 f"{tuple(logits.shape)}: one value per output")
            return nn.functional.mse_loss(logits.float().reshape(-1), labels.float().reshape(-1))
        if problem == "multi_label_classification":
            if labels.shape != logits.shape:
                raise InputError(f"multi-label labels must have the logits' shape {tuple(logits.shape)} (one 0/1 "
                                 f"per label), got {tuple(labels.shape)}")
            return nn.functional.binary_cross_entropy_with_logits(logits.float(), labels.float())
        if labels.dtype.is_floating_point or may_read(labels) and (
                int(labels.min()) < 0 or int(labels.max()) >= self.num_labels):
            raise InputError(f"classification labels must be integers in [0, {self.num_labels - 1}] "
                             f"(num_labels={self.num_labels})")
        return nn.functional.cross_entropy(logits.float(), labels.view(-1))


class DietForQuestionAnswering(DietPreTrainedModel):
    """Span extraction: a start and an end logit per token (BERT's SQuAD head)."""

    def __init__(self, config: DietConfig):
        super().__init__(config)
        self.diet = DietModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                start_positions=None, end_positions=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, inputs_embeds=None, **kwargs) -> QuestionAnsweringModelOutput:
        check_kwargs(kwargs, f"{type(self).__name__}.forward")
        out = self.diet(input_ids, attention_mask, token_type_ids, position_ids, output_attentions,
                        output_hidden_states, return_dict=True, inputs_embeds=inputs_embeds)
        start, end = self.qa_outputs(out.last_hidden_state).unbind(-1)  # (B, L) each
        loss = None
        if start_positions is not None and end_positions is not None:
            n = start.shape[1]  # positions outside the sequence are ignored, as in BERT
            # (B, 1) as (B,), as BERT's head takes them
            start_positions = start_positions.squeeze(-1) if start_positions.dim() > 1 else start_positions
            end_positions = end_positions.squeeze(-1) if end_positions.dim() > 1 else end_positions
            loss = (nn.functional.cross_entropy(start.float(), start_positions.clamp(0, n), ignore_index=n)
                    + nn.functional.cross_entropy(end.float(), end_positions.clamp(0, n), ignore_index=n)) / 2
        return self._returned(QuestionAnsweringModelOutput(loss=loss, start_logits=start, end_logits=end,
                                                           hidden_states=out.hidden_states,
                                                           attentions=out.attentions), return_dict)
