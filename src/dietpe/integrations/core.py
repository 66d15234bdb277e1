"""`attach`: one of diet's position methods inside a Hugging Face model of a common family.

The method's terms enter through Hugging Face's own extension point, the attention function every attention
module of these families looks up by its implementation name (`dietpe.integrations.dispatch`): a module that
carries the method computes diet's one equation with the method's `LayerTerms`, through the backend matching
the model's implementation. The positions of each forward are read by a forward pre-hook on the base model and
the terms built from them in the layers (`dietpe.integrations.forward`), so `position_ids`, every kind of
cache, activation checkpointing (reentrant or not), `torch.compile` and `Trainer` keep their Hugging Face code
paths.

The model's own positions are switched off (RoPE made the identity, a learned input table made to add the
method's input term instead) unless the spec keeps them (`input_positions=true`), or unless the method is the
model's own scheme: `rotary` in a model with RoPE is the model's rotary module itself, with its `rope_type`
(linear, dynamic, yarn, longrope, llama3, ...) and factors. The spec is recorded in the config
(`config.dietpe`); after `import dietpe`, `from_pretrained` re-attaches the method before the weights are
loaded (a wrapper around `PreTrainedModel.post_init`), `set_attn_implementation` keeps it (a wrapper that
refuses an implementation that cannot serve it), and transformers' weight initialisation gives the method's
tables their own (a wrapper around `PreTrainedModel._initialize_weights`).
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from dietpe.attention.registry import ALL_BACKENDS, serving_backend
from dietpe.errors import ConfigError
from dietpe.integrations import dispatch
from dietpe.integrations.common import method_fields, own_base
from dietpe.integrations.forward import ForwardState, pre_hook
from dietpe.positions.registry import REGISTRY


@dataclass
class Family:
    """How one family of Hugging Face models is wired: its attention modules, its own positions."""

    model_types: tuple[str, ...]
    #: the base model's self-attention modules, in layer order
    attention_modules: Callable[[nn.Module], list[nn.Module]]
    #: switch the base model's own positions off and route the method's input term: (base, attached, keep)
    replace_positions: Callable[[nn.Module, "AttachedPositions", bool], None]
    causal: bool
    #: the base model's learned input table (n, D), whose values an attached `absolute` starts from
    input_table: Callable[[nn.Module], Tensor | None] = lambda base: None
    #: the forward takes token_type_ids: per-head segments can read them
    segments: bool = False
    #: the input term is added to inputs_embeds by the pre-hook (no learned table to route it through)
    embed_in_hook: bool = False
    #: checks of the model's config against a method acting inside attention: (config) -> None or ConfigError
    check: Callable[[object], None] = lambda config: None


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    for t in family.model_types:
        FAMILIES[t] = family
    return family


class AttachedPositions(nn.Module):
    """The attached method's parameters (`encoding`, a `PositionEncoding`) and the state of one forward
    (`state`, a `ForwardState` set by the base model's pre-hook).

    backend: diet's backend pinned by `attach(backend=...)`, or None: the one matching the model's attention
    implementation (`dispatch.BACKEND_OF`). native: the model's own module computes the method (`rotary` in a
    model with RoPE), which then adds nothing inside attention."""

    def __init__(self, encoding: nn.Module, spec: str, backend: str | None, family: Family):
        super().__init__()
        self.encoding = encoding
        self.spec, self.backend, self.family, self.causal = spec, backend, family, family.causal
        self.native = False
        self.state: ForwardState | None = None
        self.unservable: frozenset = frozenset()  # backends "auto" found unable to serve a term

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}, backend={self.backend or 'auto'!r}"

    def __getstate__(self) -> dict:
        # the last forward's state holds its autograd graph: deepcopy and pickling of the model leave it
        state = super().__getstate__()
        state["state"] = None
        return state

    @property
    def acts_in_attention(self) -> bool:
        """Whether the method adds terms inside attention (else the layers run Hugging Face's own function)."""
        per_head = REGISTRY[self.config.position].per_head
        return not self.native and (per_head or self.encoding.head_segments is not None)

    def input_term(self, position_ids: Tensor) -> Tensor | None:
        """What the method adds to the token embeddings at `position_ids` (1|B, L), or None."""
        return self.encoding.embed(position_ids, None)

    def recomputing(self, layer: int) -> bool:
        """Whether layer `layer` runs under activation checkpointing now (its terms are then built inside it)."""
        owner = self.checkpointed[layer]
        return bool(owner.training and getattr(owner, "gradient_checkpointing", False) and torch.is_grad_enabled())

    def start(self, state: ForwardState, length: int, past) -> None:
        """A new forward: refuse positions the learned tables cannot serve, then keep its state."""
        enc = self.encoding
        if state.record is not None:
            enc.check(length, None, state.q_ids)
        elif enc.max_length is not None and isinstance(past, int) and past + length > enc.max_length:
            enc.check(past + length, None, None)
        if state.segments is not None and enc.head_segments is not None:
            enc.check(length, state.segments, None)
        if self.state is not None:  # the last forward's terms go now, not when the cycle collector runs
            for ctx in self.state.contexts.values():
                ctx.release()
        self.state = state


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
    fields = method_fields(method, "attach")
    keep = bool(fields.pop("input_positions", False))
    if fields["segment"] == "input":
        fields["segment"] = "none"  # the model's own token types stay where they are
    own = dict(vocab_size=8, hidden_size=heads * head_dim, num_attention_heads=heads, num_hidden_layers=layers,
               max_position_embeddings=getattr(model_config, "max_position_embeddings", None) or 512,
               type_vocab_size=type_vocab_size,
               initializer_range=getattr(model_config, "initializer_range", 0.02))
    if REGISTRY[method.position].uses("rotary_base"):  # the model's own RoPE base, for a method that reads one
        own["rotary_base"] = own_base(model_config)
    return cls(**{**own, **fields}), keep


def attach(model: PreTrainedModel, spec: str, backend: str | None = None, _init: bool = True) -> PreTrainedModel:
    """Put the position method `spec` (the `--method` syntax: `diet-rel`, `t5`, `alibi`, `rotary`,
    `diet-abs:position_rank=16`, `diet-rel:segment=per-head`, `diet-rel:input_positions=true`, ...) into a
    Hugging Face model of a supported family, in place; returns the model.

    The method replaces the model's own positions (RoPE off, a learned input table replaced) unless the spec
    says `input_positions=true`; `rotary` in a model with RoPE is the model's own rotary module. `backend`:
    diet's backend computing attention with the method's terms (a name registered in
    `dietpe.attention.registry`: `eager`, `sdpa`, `flex`, `banded`, ...); default None: the one matching the
    model's attn_implementation, which `set_attn_implementation` then changes (`dispatch.BACKEND_OF`). The spec
    is recorded in `config.dietpe`, so `save_pretrained` / `from_pretrained` (after `import dietpe`) restore it."""
    if not isinstance(model, PreTrainedModel):
        raise ConfigError(f"attach: expected a transformers PreTrainedModel, got {type(model).__name__}")
    family = family_of(model)
    base = model.base_model
    if "diet_positions" in base._modules:
        if base.diet_positions.spec == spec and backend in (None, base.diet_positions.backend):
            return model  # built from a config that records this method: attached by post_init already
        raise ConfigError(f"attach: this {type(model).__name__} already has a method attached "
                          f"({base.diet_positions.spec!r}); attach to a fresh model")
    if backend is not None and backend not in ALL_BACKENDS:
        raise ConfigError(f"attach: backend={backend!r}; use one of {', '.join(map(repr, ALL_BACKENDS))}")
    modules = family.attention_modules(base)
    c = model.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    config, keep = position_config(c, spec, family.causal, heads, head_dim, len(modules),
                                   getattr(c, "type_vocab_size", 2) or 2)
    info = REGISTRY[config.position]
    if config.segment == "per-head" and not family.segments:
        raise ConfigError(f"attach: segment='per-head' needs token_type_ids, which {c.model_type} models do not "
                          f"take; use segment=none")
    if "input" in info.entry and config.hidden_size != c.hidden_size:
        raise ConfigError(f"attach: {config.position!r} adds to the embeddings, but heads × head size "
                          f"{config.hidden_size} differs from hidden_size {c.hidden_size}")
    from dietpe.positions.encoding import PositionEncoding
    if backend is not None:
        backend = serving_backend(backend, value_terms=info.probabilities).name
    attached = AttachedPositions(PositionEncoding(config), spec, backend, family)
    attached.config = config  # the method's DietConfig: its limits (max_position_embeddings), causal or not
    device = next((p.device for p in base.parameters()), torch.device("cpu"))
    dtype = next((p.dtype for p in base.parameters() if p.is_floating_point()), torch.float32)
    table = family.input_table(base)  # the model's own learned table, before it is replaced
    family.replace_positions(base, attached, keep)
    if attached.acts_in_attention:
        family.check(c)
        reason = dispatch.refusal(c._attn_implementation)
        if reason:
            raise ConfigError(f"attach: {reason}")
    base.diet_positions = attached
    if device.type != "meta":  # on meta (from_pretrained), transformers initialises what the checkpoint lacks
        if _init:
            _initialise(attached, base, table)
        attached.to(device=device, dtype=dtype)  # the model's device and dtype (the method computes in it)
    _wire(attached, base, modules)
    dispatch.install()
    _own_config(model)
    # "pinned" tells a backend given here from one an earlier version recorded by default (sdpa)
    model.config.dietpe = {"method": spec, "backend": backend, "pinned": backend is not None}
    return model


def _own_config(model: PreTrainedModel) -> None:
    """The model's config replaced by a copy in every module that holds it, before the method is recorded on
    it: the config object the caller built the model from stays as it was, so another model built from it is a
    plain one, free to take another method."""
    old = model.config
    new = copy.deepcopy(old)
    for m in model.modules():
        if m.__dict__.get("config") is old:
            m.__dict__["config"] = new


def _initialise(attached: AttachedPositions, base: PreTrainedModel, table: Tensor | None) -> None:
    """The method's weights, initialised module by module by the model's own `_initialize_weights`, as
    transformers initialises the weights a checkpoint lacks (in the order diet always drew them: the same
    weights from the same seed); an `absolute` table starts from the model's own `table`."""
    config = attached.config
    with torch.no_grad():
        for m in attached.modules():
            base._initialize_weights(m)
    weight = getattr(attached.encoding.method, "weight", None)
    if REGISTRY[config.position].bert_table and table is not None and weight is not None \
            and weight.shape == table.shape:
        with torch.no_grad():  # the model's own learned table: attaching `absolute` changes nothing
            weight.copy_(table)


def _checkpointed(base: nn.Module, module: nn.Module) -> nn.Module:
    """The layer whose activation checkpointing covers `module`: its nearest ancestor that Hugging Face
    checkpoints (a `GradientCheckpointingLayer`), else the module itself."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    names = {id(m): n for n, m in base.named_modules()}
    path = names[id(module)].split(".")
    for i in range(len(path) - 1, 0, -1):
        candidate = base.get_submodule(".".join(path[:i]))
        if isinstance(candidate, GradientCheckpointingLayer):
            return candidate
    return module


def _wire(attached: AttachedPositions, base: nn.Module, modules: list[nn.Module]) -> None:
    """Point the attention modules at the method and hook the base model's forward. The references are plain
    attributes (the model owns the modules), which `copy.deepcopy` maps onto the copy's own."""
    object.__setattr__(attached, "attention", modules)
    object.__setattr__(attached, "checkpointed", [_checkpointed(base, m) for m in modules])
    attached.forward_params = tuple(inspect.signature(base.forward).parameters)
    for i, m in enumerate(modules):
        m.__dict__["_dietpe"], m.__dict__["_dietpe_layer"] = attached, i
    base.register_forward_pre_hook(pre_hook, with_kwargs=True)


_original_post_init = PreTrainedModel.post_init
_original_set_attn_implementation = PreTrainedModel.set_attn_implementation
_original_initialize_weights = PreTrainedModel._initialize_weights


def _post_init(self: PreTrainedModel) -> None:
    """`PreTrainedModel.post_init`, then re-attach the method a config records (from_pretrained of a folder
    `save_pretrained` wrote after `attach`): the tables exist before the weights are loaded into them."""
    _original_post_init(self)
    record = getattr(self.config, "dietpe", None)
    if isinstance(record, dict) and "method" in record and self.base_model is self \
            and "diet_positions" not in self._modules and getattr(self.config, "model_type", None) in FAMILIES:
        backend = record.get("backend")
        if not record.get("pinned") and (backend == dispatch.BACKEND_OF.get(record.get("attn_implementation"),
                                                                              backend) or backend == "sdpa"):
            backend = None  # written before the backend followed the implementation: follow it
        attach(self, record["method"], backend, _init=True)


def _set_attn_implementation(self: PreTrainedModel, attn_implementation, *args, **kwargs):
    """`PreTrainedModel.set_attn_implementation`, keeping an attached method: its layers then run diet's backend
    matching the new implementation (a backend pinned by `attach` is released), or the change is refused in
    one line when the implementation cannot serve the method. A name transformers does not know gets
    transformers' own error."""
    attached = getattr(self.base_model, "_modules", {}).get("diet_positions")
    requested = attn_implementation if not isinstance(attn_implementation, dict) else \
        attn_implementation.get("", self.config._attn_implementation)
    if attached is not None and attached.acts_in_attention and dispatch.known(requested):
        reason = dispatch.refusal(requested)
        if reason:
            raise ConfigError(f"set_attn_implementation: the attached method {attached.spec!r} stays; {reason}")
    out = _original_set_attn_implementation(self, attn_implementation, *args, **kwargs)
    if attached is not None:
        attached.backend = None
        if isinstance(getattr(self.config, "dietpe", None), dict):
            self.config.dietpe = {**self.config.dietpe, "backend": None, "pinned": False}
    return out


def _initialize_weights(self: PreTrainedModel, module: nn.Module, *args, **kwargs):
    """`PreTrainedModel._initialize_weights`, which also initialises an attached method's tables each its own
    way (modules transformers' `_init_weights` does not know): so `from_pretrained` of a checkpoint lacking
    them, or `initialize_weights` after building on the meta device, gives them what `attach` gives them.
    Tensors loaded from a checkpoint are left alone (diet's methods initialise through transformers' guarded
    helpers); any other model, diet's own included, is initialised as before."""
    from dietpe.positions.method import PositionMethod
    from dietpe.positions.segments import InputSegments

    attached = getattr(getattr(self, "base_model", None), "_modules", {}).get("diet_positions")
    if attached is not None and isinstance(module, (PositionMethod, InputSegments)) \
            and not getattr(module, "_is_hf_initialized", False) and any(module is m for m in attached.modules()):
        with torch.no_grad():
            module.reset_parameters(getattr(self.config, "initializer_range", None) or 0.02)
    return _original_initialize_weights(self, module, *args, **kwargs)


if PreTrainedModel.post_init is _original_post_init:
    PreTrainedModel.post_init = _post_init
    PreTrainedModel.set_attn_implementation = _set_attn_implementation
    PreTrainedModel._initialize_weights = _initialize_weights
