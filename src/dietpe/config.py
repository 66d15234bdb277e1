"""Typed model configuration, its validation, and the named presets.

Every choice of where position and segment information enter attention is one named field here:
`position`, `segment`, `sharing`, `attention`. The position methods' own fields (`shaw_max_distance`,
`t5_num_buckets`, `position_rank`, ...) come from the registry: each method declares them in its file
(`dietpe.positions.fields`), and `DietConfig` takes them as keywords, applies their defaults, saves and loads
them. Everything is validated once, in `DietConfig.validate()`, with errors that list the allowed values.
"""

from __future__ import annotations

import difflib
import inspect
from typing import ClassVar, Literal, get_args

from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from dietpe.attention.registry import backend_names, resolve_backend
from dietpe.errors import ConfigError
from dietpe.positions.fields import boolean, positive_float, positive_int
from dietpe.positions.registry import FIELDS, REGISTRY, names, users
from dietpe.presets import PRESETS  # noqa: F401  (re-exported: dietpe.config.PRESETS)

Position = Literal[tuple(REGISTRY)]  # the registry's names (dietpe.positions.registry)
Segment = Literal["none", "input", "per-head"]
Sharing = Literal["none", "head", "layer"]
AttentionKind = Literal["full", "linformer"]

POSITIONS: tuple[str, ...] = get_args(Position)
SEGMENTS: tuple[str, ...] = get_args(Segment)
SHARINGS: tuple[str, ...] = get_args(Sharing)
ATTENTIONS: tuple[str, ...] = get_args(AttentionKind)

# Traits of the methods, from the registry: learned tables (inputs longer are refused), methods that need
# key positions (not with Linformer), value terms that need the probabilities (eager only), and what
# `sharing` applies to (DIET's per-head parameters, DIET Tables 5, 8, 9).
LEARNED_ABSOLUTE = names(learned_table=True)
NEEDS_KEY_POSITIONS = names(key_positions=True)
NEEDS_PROBABILITIES = names(probabilities=True)
SHAREABLE_POSITIONS = names(shareable=True)

#: default `logit_scale` (docs/parametrization.md)
LOGIT_SCALE = 10.0


#: Hugging Face's `attn_implementation` names, and the diet backend each asks for
HF_IMPLEMENTATIONS = {"eager": "eager", "sdpa": "sdpa", "flex_attention": "flex"}
# keywords PretrainedConfig takes that lie close to a diet field's name: never taken for its misspelling
_HF_KEYWORDS = frozenset({"num_labels", "sep_token_id", "tie_encoder_decoder", "is_decoder", "add_cross_attention",
                          "torch_dtype", "tokenizer_class", "prefix", "task_specific_params", "finetuning_task",
                          "output_attentions", "pruned_heads", "use_return_dict", "experts_implementation"})


def backend_for(implementation, attn_backend: str = "auto") -> str:
    """The `attn_backend` Hugging Face's `attn_implementation` asks for. One diet has no backend for, or one
    that contradicts an `attn_backend` also given, is refused rather than run on another backend."""
    if implementation not in HF_IMPLEMENTATIONS:
        raise ConfigError(f"attn_implementation={implementation!r}: diet's models take "
                          f"{', '.join(map(repr, HF_IMPLEMENTATIONS))}, or attn_backend= one of "
                          f"{', '.join(map(repr, backend_names()))} (docs/gpu.md)")
    backend = HF_IMPLEMENTATIONS[implementation]
    if attn_backend not in ("auto", backend):
        raise ConfigError(f"attn_implementation={implementation!r} asks for attn_backend={backend!r}, but "
                          f"attn_backend={attn_backend!r} is given too; give one of them")
    return backend


def _refuse_misspelt(config_class, keys) -> None:
    """Hugging Face keeps an unknown keyword as an attribute, so `positon='diet-rel'` would build BERT's table
    without a word: a keyword close to one of diet's own fields is refused as its misspelling."""
    ours = set(FIELDS)
    for cls in config_class.__mro__:
        if issubclass(cls, DietConfig):
            ours |= set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
    for key in keys:
        close = difflib.get_close_matches(key, sorted(ours), n=1, cutoff=0.8)
        if close and key not in ours and key not in _HF_KEYWORDS:
            raise ConfigError(f"{config_class.__name__}: unknown field {key!r}; did you mean {close[0]!r}?")


def _check(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}")


class DietConfig(PretrainedConfig):
    """Configuration of a diet Transformer (BERT block layout) with a chosen position method.

    position: where and how positions enter (see `dietpe.positions` for each method's equation).
    segment: `input` (BERT's token-type embedding), `per-head` (DIET eq. 2), or `none`; when not given, the
        segment mode of the method's row in the papers (the registry's `segment` trait: `per-head` for
        `diet-abs` and `diet-rel`, `input` otherwise and with Linformer), as the method spec `diet-rel` means
        on the command line. A saved config names its segment, so it loads as saved.
    sharing: of DIET's per-head parameters: `none`, `head` (heads of a layer share), `layer` (layers share).
    input_positions: also add BERT's learned input position table (DIET Fig. 5's DIET-ABS + input table;
        what `dietpe pretrain --init BERT --init-keep-positions` keeps), for a per-head `position`.
    the methods' own fields (e.g. `t5_num_buckets`, `position_rank`): keywords declared by the methods that
        read them, each with its default, check and doc (`dietpe.positions.registry.FIELDS`); a non-default
        value is refused for a method that does not read it.
    logit_scale: the per-head logit-unit tables (DIET-REL's R, DIET-ABS's P_Q and P_K, T5's and TUPE-R's
        buckets, per-head segments) are stored divided by it and used multiplied back, so that one optimizer and
        one learning rate train them (docs/parametrization.md). A saved config without the field is read with
        1, the stored-as-used form every earlier checkpoint has.
    attention: `full` softmax attention or `linformer` (keys/values projected along the length to
        `linformer_k`; with `diet-abs` this is DIET-ABS-LIN, eq. 4).
    attn_backend: `auto` (SDPA unless the method needs the probabilities), or a backend registered in
        `dietpe.attention.registry`: `eager` (the reference), `sdpa`, `flex` (FlexAttention), `banded` (Shaw).
        Hugging Face's `attn_implementation` ('eager', 'sdpa', 'flex_attention'), here, in `from_pretrained`,
        `from_config` or `set_attn_implementation`, sets it.
    sparse_prediction: the masked LM given `labels` runs its head on the labelled tokens only (label != -100)
        and returns their logits, (N, vocab_size) in row-major order, as transformers' ModernBERT does: the
        same loss without the (B, L, vocab_size) logits (`dietpe pretrain` sets it). Without labels, or False
        (the default, BERT's), the logits of every token.
    """

    model_type = "diet"
    #: attends causally (a decoder-only LM): the methods' fields take their causal defaults, T5 its causal
    #: buckets (dietpe.positions.method.causal)
    causal: ClassVar[bool] = False

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-12,
        pad_token_id: int = 0,
        position: str = "absolute",
        segment: str | None = None,
        sharing: str = "none",
        attention: str = "full",
        linformer_k: int = 128,
        input_positions: bool = False,
        logit_scale: float = LOGIT_SCALE,
        attn_backend: str = "auto",
        classifier_dropout: float | None = None,
        tie_word_embeddings: bool = True,
        sparse_prediction: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.position = position
        if segment is None:
            per_head_ok = attention != "linformer"
            segment = REGISTRY[position].segment if position in REGISTRY and per_head_ok else "input"
        self.segment = segment
        self.sharing = sharing
        self.attention = attention
        self.linformer_k = linformer_k
        for name in FIELDS:  # the methods' own fields (dietpe.positions.registry.FIELDS)
            setattr(self, name, kwargs.pop(name) if name in kwargs else self.field_default(name))
        if kwargs.get("attn_implementation") is not None:
            attn_backend = backend_for(kwargs.pop("attn_implementation"), attn_backend)
        _refuse_misspelt(type(self), kwargs)
        self.input_positions = input_positions
        self.logit_scale = logit_scale
        self.attn_backend = attn_backend
        self.classifier_dropout = classifier_dropout
        self.tie_word_embeddings = tie_word_embeddings  # BERT ties the MLM decoder to the word embeddings
        self.sparse_prediction = sparse_prediction
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.validate()

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rank(self) -> int:
        """d_p of DIET-ABS: `position_rank`, or the head size (the paper's default)."""
        return self.position_rank if self.position_rank is not None else self.head_size

    def field_default(self, name: str):
        """The default of the method field `name` in this kind of model, at its sizes."""
        return FIELDS[name].default_for(self, self.causal)

    # -- validation ------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError naming the field and the allowed values for anything invalid."""
        _check("position", self.position, POSITIONS)
        _check("segment", self.segment, SEGMENTS)
        _check("sharing", self.sharing, SHARINGS)
        _check("attention", self.attention, ATTENTIONS)
        _check("attn_backend", self.attn_backend, backend_names())  # "auto" and every registered backend
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "linformer_k"):
            positive_int(name, getattr(self, name))
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ConfigError(f"{name}={value!r} must be a probability in [0, 1)")
        for name in ("layer_norm_eps", "initializer_range", "logit_scale"):
            positive_float(name, getattr(self, name))
        if not isinstance(self.type_vocab_size, int) or isinstance(self.type_vocab_size, bool) or \
                self.type_vocab_size < 0:
            raise ConfigError(f"type_vocab_size={self.type_vocab_size!r} must be a non-negative integer")
        if isinstance(self.hidden_act, str) and self.hidden_act not in ACT2FN:
            _check("hidden_act", self.hidden_act, tuple(ACT2FN))
        pad = self.pad_token_id
        if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < self.vocab_size):
            raise ConfigError(f"pad_token_id={pad!r} must be a token id in [0, {self.vocab_size - 1}] "
                              f"(vocab_size={self.vocab_size}) or None")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}")
        self.validate_method()
        boolean("input_positions", self.input_positions)
        boolean("sparse_prediction", self.sparse_prediction)
        if self.input_positions and not REGISTRY[self.position].per_head:
            raise ConfigError(f"input_positions=True adds BERT's learned input position table to a per-head method; "
                              f"position={self.position!r} has no per-head term (use position='absolute' for BERT)")
        if self.segment != "none" and self.type_vocab_size < 1:
            raise ConfigError(f"segment={self.segment!r} needs type_vocab_size >= 1")
        if self.sharing != "none" and self.position not in SHAREABLE_POSITIONS and self.segment != "per-head":
            raise ConfigError(
                f"sharing={self.sharing!r} shares DIET's per-head parameters, but position={self.position!r} "
                f"and segment={self.segment!r} have none; use position in {SHAREABLE_POSITIONS} or "
                f"segment='per-head', or sharing='none'")
        if self.attention == "linformer":
            if self.position in NEEDS_KEY_POSITIONS:
                allowed = ", ".join(repr(n) for n in POSITIONS if n not in NEEDS_KEY_POSITIONS)
                raise ConfigError(
                    f"attention='linformer' projects keys along the length, so key positions no longer exist "
                    f"and position={self.position!r} makes no sense; use one of {allowed} ('diet-abs' is "
                    f"DIET-ABS-LIN)")
            if self.segment == "per-head":
                raise ConfigError("attention='linformer' cannot take segment='per-head' (projected keys have no "
                                  "segment); use segment='input' or 'none'")
            if self.linformer_k > self.max_position_embeddings:
                raise ConfigError(f"linformer_k={self.linformer_k} exceeds max_position_embeddings="
                                  f"{self.max_position_embeddings}")
        resolve_backend(self.attn_backend, value_terms=self.position in NEEDS_PROBABILITIES,
                        dropout=self.attention_probs_dropout_prob, subject=f"position={self.position!r}",
                        method=REGISTRY[self.position])

    def validate_method(self) -> None:
        """The method fields: each value by its field's check, a non-default value only for a method that
        reads it, then the method's own cross checks (e.g. rotary's even head size)."""
        info = REGISTRY[self.position]
        for name, field in FIELDS.items():
            value = getattr(self, name)
            field.validate(value)
            if not info.uses(name) and value != self.field_default(name):
                owners = users(name)
                where = f"position={owners[0]!r}" if len(owners) == 1 else \
                    f"position in {', '.join(map(repr, owners))}"
                raise ConfigError(f"{name}={value!r} only applies to {where} ({field.doc}), not {self.position!r}")
        info.method.check_config(self)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        # checkpoints written before `logit_scale` existed store their tables as used: scale 1
        if "logit_scale" not in config_dict and "logit_scale" not in kwargs:
            config_dict = {**config_dict, "logit_scale": 1.0}
        # fields of methods other than the saved one change nothing in its model; older configs may hold
        # any value there, so they load with the defaults
        info = REGISTRY.get(config_dict.get("position"))
        if info is not None:
            config_dict = {k: v for k, v in config_dict.items() if k not in FIELDS or info.uses(k)}
        loaded = super().from_dict(config_dict, **kwargs)
        # from_pretrained's keyword overrides are set after __init__ checked the file's values: check again
        (loaded[0] if isinstance(loaded, tuple) else loaded).validate()
        return loaded

    # -- presets ---------------------------------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str, **overrides) -> "DietConfig":
        """A named size (`bert-tiny`, `bert-mini`, `bert-small`, `bert-base`) with field overrides."""
        _check("preset", name, tuple(PRESETS))
        return cls(**{**PRESETS[name], **overrides})
