"""`attach`: one of diet's position methods inside a Hugging Face model of a common family.

The method's terms enter through Hugging Face's own extension point: an attention function registered with
`transformers.AttentionInterface` under the name "dietpe", which every attention module of these families
calls with its q, k, v and 4-D mask. It computes diet's one equation (dietpe.attention.backends: eager, sdpa
or flex) with the method's `LayerTerms`. The terms are built once per forward, by a forward pre-hook on the
base model that reads the `position_ids` (or the cache's length) and stashes a `Context` for the layers, so
`position_ids`, caches, gradient checkpointing and `Trainer` keep their Hugging Face code paths.

The model's own positions are switched off (RoPE made the identity, a learned input table made to add the
method's input term instead) unless the spec keeps them (`input_positions=true`). The spec and backend are
recorded in the config (`config.dietpe`); after `import dietpe`, `from_pretrained` re-attaches the method
before the weights are loaded (a wrapper around `PreTrainedModel.post_init`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

from dietpe.attention.registry import ALL_BACKENDS, serving_backend
from dietpe.errors import ConfigError, InputError
from dietpe.positions.context import Context
from dietpe.positions.registry import REGISTRY
from dietpe.positions.terms import EMPTY, LayerTerms

#: the name registered with Hugging Face's attention and mask interfaces
NAME = "dietpe"
#: the model's attention implementation -> diet's backend computing the same equation
BACKEND_OF = {"eager": "eager", "sdpa": "sdpa", "flex_attention": "flex", None: "sdpa"}


@dataclass
class Family:
    """How one family of Hugging Face models is wired: its attention modules, its own positions."""

    model_types: tuple[str, ...]
    #: the base model's self-attention modules, in layer order
    attention_modules: Callable[[nn.Module], list[nn.Module]]
    #: switch the base model's own positions off and route the method's input term: (base, encoding, keep)
    replace_positions: Callable[[nn.Module, "AttachedPositions", bool], None]
    causal: bool
    #: the base model's learned input table (n, D), whose values an attached `absolute` starts from
    input_table: Callable[[nn.Module], Tensor | None] = lambda base: None
    #: the forward takes token_type_ids: per-head segments can read them
    segments: bool = False
    #: the input term is added to inputs_embeds by the pre-hook (no learned table to route it through)
    embed_in_hook: bool = False


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    for t in family.model_types:
        FAMILIES[t] = family
    return family


class AttachedPositions(nn.Module):
    """The attached method's parameters (`encoding`, a `PositionEncoding`) and the state of one forward:
    the `Context` and every layer's `LayerTerms`, built by the base model's pre-hook."""

    def __init__(self, encoding: nn.Module, spec: str, backend: str, causal: bool):
        super().__init__()
        self.encoding = encoding
        self.spec, self.backend, self.causal = spec, backend, causal
        self.ctx: Context | None = None
        self.terms: list[LayerTerms] = []
        self.q_ids: Tensor | None = None  # (1|B, L) positions of the forward's tokens

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}, backend={self.backend!r}"

    def input_term(self, position_ids: Tensor) -> Tensor | None:
        """What the method adds to the token embeddings at `position_ids` (1|B, L), or None."""
        return self.encoding.embed(position_ids, None)


def _positions_of(value: Tensor | None, batch: int, length: int, what: str) -> Tensor | None:
    if value is None:
        return None
    if not isinstance(value, Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool:
        raise InputError(f"{what} must be an integer tensor, got {getattr(value, 'dtype', type(value).__name__)}")
    if tuple(value.shape) not in ((length,), (1, length), (batch, length)):
        raise InputError(f"{what} has shape {tuple(value.shape)}, but the input is (batch={batch}, "
                         f"length={length}): give ({length},), (1, {length}) or ({batch}, {length})")
    return value.reshape(-1, length)


def _pre_hook(attached: AttachedPositions, family: Family, signature: inspect.Signature):
    """The base model's forward pre-hook: positions of queries and keys, the context and every layer's terms."""

    def hook(module: nn.Module, args: tuple, kwargs: dict):
        bound = signature.bind_partial(*args, **kwargs).arguments
        input_ids, embeds = bound.get("input_ids"), bound.get("inputs_embeds")
        source = input_ids if input_ids is not None else embeds
        if source is None:
            return None
        b, length = source.shape[:2]
        device = source.device
        cache = bound.get("past_key_values", bound.get("cache"))
        if cache is None and "kwargs" in bound:
            cache = bound["kwargs"].get("past_key_values", bound["kwargs"].get("cache"))
        self_cache = getattr(cache, "self_attention_cache", cache)
        past = self_cache.get_seq_length() if self_cache is not None and hasattr(self_cache, "get_seq_length") \
            else 0
        q_ids = _positions_of(bound.get("position_ids"), b, length, "position_ids")
        default = q_ids is None
        if default:
            q_ids = torch.arange(past, past + length, device=device)[None]  # (1, L)
        q_ids = q_ids.to(device)
        # the keys' positions: the cached tokens' (recorded by earlier steps) and the new ones
        k_ids = q_ids
        if past:
            before = getattr(self_cache, "_dietpe_positions", None)
            if before is None or before.shape[-1] < past:
                before = torch.arange(past, device=device)[None]
            before = before[..., :past]
            if before.shape[0] != q_ids.shape[0]:
                rows = max(before.shape[0], q_ids.shape[0])
                before, q_ids_b = before.expand(rows, -1), q_ids.expand(rows, -1)
            else:
                q_ids_b = q_ids
            k_ids = torch.cat((before, q_ids_b), dim=-1)
            default = default and getattr(self_cache, "_dietpe_default", True)
        if self_cache is not None:
            try:
                self_cache._dietpe_positions = k_ids
                self_cache._dietpe_default = default
            except AttributeError:
                pass
        enc = attached.encoding
        if not default:
            enc.check(length, None, k_ids)
        elif enc.max_length is not None and past + length > enc.max_length:
            enc.check(past + length, None, None)
        segments = bound.get("token_type_ids") if family.segments else None
        if segments is not None and enc.head_segments is not None:
            enc.check(length, segments, None)
        elif enc.head_segments is not None:
            segments = torch.zeros(b, length, dtype=torch.long, device=device)
        q_pos = q_ids[0] if q_ids.shape[0] == 1 else q_ids
        k_pos = k_ids[0] if k_ids.shape[0] == 1 else k_ids
        if q_pos.dim() != k_pos.dim():
            q_pos, k_pos = q_ids.expand(k_ids.shape[0], -1), k_ids
        k_segments = None
        if segments is not None and past:
            k_segments = torch.cat((segments.new_zeros(b, past), segments), dim=1)
        starts = (past, 0) if default else None
        ctx = enc.context(q_pos, k_pos, segments, k_segments, starts)
        recompute = module.training and getattr(module, "is_activation_checkpointing", False)
        terms = [enc.layer_terms(ctx, i) for i in range(len(attached.attention))]
        attached.terms = [t.for_checkpointing() for t in terms] if recompute else terms
        attached.ctx, attached.q_ids = ctx, q_ids
        if family.embed_in_hook:
            extra = attached.input_term(q_ids)
            if extra is not None:
                if embeds is None:
                    embeds = module.get_input_embeddings()(input_ids)
                new = dict(bound)
                new.pop("input_ids", None)
                new["inputs_embeds"] = embeds + extra.to(embeds.dtype)
                extra_kwargs = new.pop("kwargs", {})
                return (), {**new, **extra_kwargs}
        return None

    return hook


def _additive(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """The 4-D mask a Hugging Face model gives its attention function (additive or boolean, True = attend) as
    diet's backends take it: additive, (B|1, 1, Lq|1, Lk)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask.to(dtype)


def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
              scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """Hugging Face's attention-function signature over diet's one equation: q (B, H, Lq, Dh), k and v
    (B, Hkv, Lk, Dh) -> out (B, Lq, H, Dh), probabilities (B, H, Lq, Lk) or None."""
    attached: AttachedPositions | None = module.__dict__.get("_dietpe")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped keys: each key head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    layer = module.__dict__.get("_dietpe_layer")
    terms = attached.terms[layer] if attached is not None and layer is not None and attached.terms else EMPTY
    backend = attached.backend if attached is not None else "sdpa"
    need_probs = backend == "eager"
    mask = _additive(attention_mask, query.dtype)
    out, probs = ALL_BACKENDS[backend](query, key, value, terms, mask, scaling, dropout, need_probs)
    return out.transpose(1, 2).contiguous(), probs


AttentionInterface.register(NAME, attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)


def _families_line() -> str:
    return ", ".join(sorted(FAMILIES))


def init_encoding(encoding: nn.Module, std: float) -> None:
    """Initialise a `PositionEncoding` as diet's models do: each method its own way, linear maps and norms as
    Hugging Face's `_init_weights`."""
    from dietpe.positions.method import PositionMethod

    for m in encoding.modules():
        if isinstance(m, PositionMethod):
            m.reset_parameters(std)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def family_of(model: PreTrainedModel) -> Family:
    model_type = getattr(model.config, "model_type", None)
    if model_type not in FAMILIES:
        raise ConfigError(f"attach: model_type {model_type!r} is not supported; supported: {_families_line()}")
    return FAMILIES[model_type]


def position_config(model_config, spec: str, causal: bool, heads: int, head_dim: int, layers: int,
                    type_vocab_size: int):
    """The DietConfig of the method's tables for a model of these sizes; returns (config, keep_own_positions)."""
    from dietpe.config import DietConfig
    from dietpe.methods import parse_method
    from dietpe.models.causal import DietCausalConfig

    cls = DietCausalConfig if causal else DietConfig
    method = parse_method(spec, cls, segment="none", run_fields={"vocab_size": "the model"})
    fields = method.config_fields()
    keep = bool(fields.pop("input_positions", False))
    if fields["segment"] == "input":
        fields["segment"] = "none"  # the model's own token types stay where they are
    rope = getattr(model_config, "rope_parameters", None) or {}
    base = rope.get("rope_theta", getattr(model_config, "rope_theta", 10000.0)) if isinstance(rope, dict) else 1e4
    own = dict(vocab_size=8, hidden_size=heads * head_dim, num_attention_heads=heads, num_hidden_layers=layers,
               max_position_embeddings=getattr(model_config, "max_position_embeddings", None) or 512,
               type_vocab_size=type_vocab_size,
               initializer_range=getattr(model_config, "initializer_range", 0.02))
    if REGISTRY[method.position].uses("rotary_base"):  # the model's own RoPE base, for a method that reads one
        own["rotary_base"] = float(base)
    return cls(**{**own, **fields}), keep


def attach(model: PreTrainedModel, spec: str, backend: str | None = None, _init: bool = True) -> PreTrainedModel:
    """Put the position method `spec` (the `--method` syntax: `diet-rel`, `t5`, `alibi`, `rotary`,
    `diet-abs:position_rank=16`, `diet-rel:segment=per-head`, `diet-rel:input_positions=true`, ...) into a
    Hugging Face model of a supported family, in place; returns the model.

    The method replaces the model's own positions (RoPE off, a learned input table replaced) unless the spec
    says `input_positions=true`. `backend`: diet's backend computing attention (a name registered in
    `dietpe.attention.registry`: `eager`, `sdpa`, `flex`, `banded`; default: the one matching the model's
    attn_implementation). The spec is recorded in `config.dietpe`, so
    `save_pretrained` / `from_pretrained` (after `import dietpe`) restore it."""
    if not isinstance(model, PreTrainedModel):
        raise ConfigError(f"attach: expected a transformers PreTrainedModel, got {type(model).__name__}")
    family = family_of(model)
    base = model.base_model
    if "diet_positions" in base._modules:
        if base.diet_positions.spec == spec and backend in (None, base.diet_positions.backend):
            return model  # built from a config that records this method: attached by post_init already
        raise ConfigError(f"attach: this {type(model).__name__} already has a method attached "
                          f"({base.diet_positions.spec!r}); attach to a fresh model")
    current = model.config._attn_implementation
    if backend is None:
        backend = BACKEND_OF.get(current, "sdpa")
    if backend not in ALL_BACKENDS:
        raise ConfigError(f"attach: backend={backend!r}; use one of {', '.join(map(repr, ALL_BACKENDS))}")
    modules = family.attention_modules(base)
    c = model.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    config, keep = position_config(c, spec, family.causal, heads, head_dim, len(modules),
                                   getattr(c, "type_vocab_size", 2) or 2)
    if config.segment == "per-head" and not family.segments:
        raise ConfigError(f"attach: segment='per-head' needs token_type_ids, which {c.model_type} models do not "
                          f"take; use segment=none")
    if "input" in REGISTRY[config.position].entry and config.hidden_size != c.hidden_size:
        raise ConfigError(f"attach: {config.position!r} adds to the embeddings, but heads × head size "
                          f"{config.hidden_size} differs from hidden_size {c.hidden_size}")
    from dietpe.positions.encoding import PositionEncoding
    backend = serving_backend(backend, value_terms=REGISTRY[config.position].probabilities).name
    encoding = PositionEncoding(config)
    attached = AttachedPositions(encoding, spec, backend, family.causal)
    attached.config = config  # the method's DietConfig: its limits (max_position_embeddings), causal or not
    if _init:
        init_encoding(encoding, config.initializer_range)
        table = family.input_table(base)
        weight = getattr(encoding.method, "weight", None)
        if REGISTRY[config.position].bert_table and table is not None and weight is not None \
                and weight.shape == table.shape:
            with torch.no_grad():  # the model's own learned table: attaching `absolute` changes nothing
                weight.copy_(table)
    device = next((p.device for p in base.parameters()), torch.device("cpu"))
    dtype = next((p.dtype for p in base.parameters() if p.is_floating_point()), torch.float32)
    if device.type != "meta":
        attached.to(device=device, dtype=dtype)
    base.diet_positions = attached
    object.__setattr__(attached, "attention", modules)  # not submodules: the model owns them
    for i, m in enumerate(modules):
        m.__dict__["_dietpe"], m.__dict__["_dietpe_layer"] = attached, i
    family.replace_positions(base, attached, keep)
    signature = inspect.signature(base.forward)
    base.register_forward_pre_hook(_pre_hook(attached, family, signature), with_kwargs=True)
    record = {"method": spec, "backend": backend, "attn_implementation": current}
    for cfg in {id(c): c, id(base.config): base.config}.values():
        cfg.dietpe = record
        cfg._attn_implementation = NAME
    return model


_original_post_init = PreTrainedModel.post_init


def _post_init(self: PreTrainedModel) -> None:
    """`PreTrainedModel.post_init`, then re-attach the method a config records (from_pretrained of a folder
    `save_pretrained` wrote after `attach`): the tables exist before the weights are loaded into them."""
    _original_post_init(self)
    record = getattr(self.config, "dietpe", None)
    if isinstance(record, dict) and "method" in record and self.base_model is self \
            and "diet_positions" not in self._modules and getattr(self.config, "model_type", None) in FAMILIES:
        attach(self, record["method"], record.get("backend"), _init=True)


if PreTrainedModel.post_init is _original_post_init:
    PreTrainedModel.post_init = _post_init
