"""The backends of the one attention equation, found by name in a registry that users extend, as Hugging Face's
`AttentionInterface` / `ALL_ATTENTION_FUNCTIONS` find their attention functions.

    scores = (q'·k'ᵀ) · scale · score_scale + Σ logit terms + mask
    out    = dropout(softmax(scores)) · v + Σ value terms(dropout(softmax(scores)))

Notation: B batch, H heads, Lq queries, Lk keys, Dh the query/key head size, Dv the value head size.

Every backend is an `AttentionFunction` (one signature, below) registered under a name with what it can serve
(`AttentionBackend`): value terms (Shaw's, which read the probabilities), attention dropout, and the methods
it refuses by their traits. `DietConfig` allows `attn_backend` = "auto" or any registered name and refuses,
when the model is built, a backend that cannot serve the configuration. "auto" is the first of `AUTO` that
can; for the calls a backend declines (the fused kernel: off CUDA, short or with no logit term, per-example
positions the mask does not separate) it runs the next one (the fallback the fused kernel keeps when named in
`AUTO`).

    eager    the reference, straight from the equation (`dietpe.attention.backends.eager`)
    sdpa     torch's scaled_dot_product_attention, the bias built the cheapest way the shapes allow
    flex     FlexAttention: terms as score_mods, padding and causality as a block mask (no dropout)
    fused    one Triton kernel, position terms read in the tile (`dietpe.attention.fused`; CUDA)
    banded   Shaw's banded paths at inference on CPU (`dietpe.attention.banded`), the reference otherwise

`banded` is its own entry rather than a choice inside `eager`: the reference stays one plain function the fast
paths are held to, and what `auto` picks for Shaw is a name a run records.

    from dietpe.attention.registry import register_backend
    register_backend("mine", my_attention, value_terms=False, dropout=True)
    DietConfig(attn_backend="mine", ...)
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, replace
from typing import Callable, Protocol

from torch import Tensor

from dietpe.attention import fused as fused_backend
from dietpe.attention.backends import eager, flex, sdpa
from dietpe.attention.banded import band_or_eager
from dietpe.attention.masks import CausalMask
from dietpe.errors import ConfigError, NotServed
from dietpe.positions.terms import LayerTerms


class AttentionFunction(Protocol):
    """One call of the equation for one layer.

    q (B, H, Lq, Dh); k (B, H, Lk, Dh); v (B, H, Lk, Dv); terms: the layer's position terms (qk transforms,
    logit terms (1|B, H|1, Lq, Lk), value terms); mask: additive (B|1, 1|H, Lq|1, Lk) of 0 and finfo.min, a
    `CausalMask` (causality alone), or None; scale: 1/√Dh; dropout_p: attention dropout (0 at inference);
    need_probs: the caller wants the probabilities. Returns out (B, H, Lq, Dv) and the probabilities
    (B, H, Lq, Lk) when the backend computes them, else None."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | CausalMask | None,
                 scale: float, dropout_p: float, need_probs: bool) -> tuple[Tensor, Tensor | None]: ...


@dataclass(frozen=True)
class AttentionBackend:
    """A registered backend: its name, its function, and what it can serve (checked when a model is built)."""

    name: str
    forward: AttentionFunction
    #: adds value terms, which read the attention probabilities (Shaw)
    value_terms: bool = False
    #: applies attention dropout
    dropout: bool = True
    #: why it cannot serve a method, from its registry entry (`MethodInfo`: the traits), or None
    method_refusal: Callable[[object], str | None] | None = None
    #: set for a backend that may decline a call (raising NotServed): the calls "auto" leaves to the next
    #: backend without trying, a test on the query (the fused kernel: off CUDA)
    skip: Callable[[Tensor], bool] | None = None
    #: what "auto" runs for the calls this backend declines (set on what `resolve_backend("auto")` returns)
    fallback: "AttentionBackend | None" = None
    #: what "auto" calls in `forward`'s place, for a backend auto gives only some of the calls it can serve
    #: (raising NotServed for the others): the fused kernel takes long inputs with logit terms
    auto_forward: AttentionFunction | None = None
    #: prepare(auto), run when a model that may call this backend is built, `auto` when through "auto" (the
    #: fused kernel imports its kernels then)
    prepare: Callable[[bool], None] | None = None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | CausalMask | None,
                 scale: float, dropout_p: float, need_probs: bool) -> tuple[Tensor, Tensor | None]:
        if self.fallback is None:
            return self.forward(q, k, v, terms, mask, scale, dropout_p, need_probs)
        if self.skip(q):
            return self.fallback(q, k, v, terms, mask, scale, dropout_p, need_probs)
        try:
            return self.forward(q, k, v, terms, mask, scale, dropout_p, need_probs)
        except NotServed:
            return self.fallback(q, k, v, terms, mask, scale, dropout_p, need_probs)

    def refusal(self, *, value_terms: bool, dropout: float, method=None) -> str | None:
        """Why this backend cannot serve a model with value terms, this attention dropout and this method
        (its `MethodInfo`, when given), or None."""
        if value_terms and not self.value_terms:
            return "the method's value term needs the attention probabilities"
        if dropout > 0 and not self.dropout:
            return f"it has no attention dropout, but attention_probs_dropout_prob={dropout}"
        if method is not None and self.method_refusal is not None:
            return self.method_refusal(method)
        return None


class AttentionBackends(MutableMapping):
    """Name -> `AttentionBackend`. `register` adds to the table every instance reads (Hugging Face's
    `GeneralInterface`: a class-wide mapping and per-instance overrides). An unknown name is a ConfigError
    listing the known ones."""

    _global_mapping: dict[str, AttentionBackend] = {}

    def __init__(self):
        self._local_mapping: dict[str, AttentionBackend] = {}

    @classmethod
    def register(cls, name: str, forward: AttentionFunction, *, value_terms: bool = False,
                 dropout: bool = True, method_refusal: Callable[[object], str | None] | None = None,
                 skip: Callable[[Tensor], bool] | None = None,
                 auto_forward: AttentionFunction | None = None,
                 prepare: Callable[[bool], None] | None = None) -> AttentionBackend:
        if not isinstance(name, str) or not name or name == "auto":
            raise ConfigError(f"backend name {name!r}: give a non-empty name other than 'auto'")
        if not callable(forward):
            raise ConfigError(f"backend {name!r}: {forward!r} is not callable")
        backend = AttentionBackend(name, forward, value_terms, dropout, method_refusal, skip,
                                   auto_forward=auto_forward, prepare=prepare)
        cls._global_mapping[name] = backend
        return backend

    def __getitem__(self, name: str) -> AttentionBackend:
        if name in self._local_mapping:
            return self._local_mapping[name]
        if name in self._global_mapping:
            return self._global_mapping[name]
        raise ConfigError(f"attn_backend={name!r} is not one of {', '.join(map(repr, ['auto', *self]))}")

    def __contains__(self, name: object) -> bool:
        return name in self._local_mapping or name in self._global_mapping

    def get(self, name: str, default: AttentionBackend | None = None) -> AttentionBackend | None:
        return self[name] if name in self else default

    def __setitem__(self, name: str, backend: AttentionBackend) -> None:
        if not isinstance(backend, AttentionBackend) or backend.name != name:
            raise ConfigError(f"backend {name!r}: give an AttentionBackend named {name!r}")
        self._local_mapping[name] = backend

    def __delitem__(self, name: str) -> None:
        del self._local_mapping[name]

    def __iter__(self) -> Iterator[str]:
        return iter({**self._global_mapping, **self._local_mapping})

    def __len__(self) -> int:
        return len(self._global_mapping.keys() | self._local_mapping.keys())


def register_backend(name: str, forward: AttentionFunction, *, value_terms: bool = False,
                     dropout: bool = True, method_refusal: Callable[[object], str | None] | None = None,
                     skip: Callable[[Tensor], bool] | None = None,
                     auto_forward: AttentionFunction | None = None,
                     prepare: Callable[[bool], None] | None = None) -> AttentionBackend:
    """Make `forward` available as `attn_backend=name` in every model built afterwards. method_refusal(info)
    says why it cannot serve a method (its `MethodInfo`), or None; skip(q), for a backend whose forward may
    raise NotServed, which calls "auto" gives to the next backend without trying; auto_forward, what "auto"
    calls instead of forward (declining, with NotServed, calls auto should give the next backend); prepare(auto),
    run when a model that may call it is built (through "auto" when `auto`)."""
    return AttentionBackends.register(name, forward, value_terms=value_terms, dropout=dropout,
                                      method_refusal=method_refusal, skip=skip, auto_forward=auto_forward,
                                      prepare=prepare)


register_backend("eager", eager, value_terms=True)
register_backend("sdpa", sdpa)
register_backend("flex", flex, dropout=False)
register_backend("banded", band_or_eager, value_terms=True)
register_backend("fused", fused_backend.fused, method_refusal=fused_backend.method_refusal,
                 skip=fused_backend.auto_skip, auto_forward=fused_backend.fused_long, prepare=fused_backend.prepare)

#: the global table
ALL_BACKENDS = AttentionBackends()
#: what "auto" tries, in order: the first that can serve the configuration (the next runs the calls it declines).
#: The fused kernel only for long inputs with logit terms (`fused.fused_long`), where sdpa would build its bias
#: block by block and keep every block for the backward, (L, L) per layer: at 512 tokens on an H200 it trained
#: bert-base (8 x 512, bf16) slower than sdpa for DIET-ABS, T5, ALiBi and KERPLE, as fast for DIET-REL (docs/gpu.md)
AUTO = ("fused", "sdpa", "banded")


def backend_names() -> tuple[str, ...]:
    """The values `attn_backend` takes: "auto" and every registered name."""
    return ("auto", *ALL_BACKENDS)


def resolve_backend(name: str, *, value_terms: bool, dropout: float = 0.0, subject: str = "this model",
                    method=None) -> AttentionBackend:
    """The backend `attn_backend=name` means for a model with (or without) value terms, this attention dropout
    and this method (its `MethodInfo`, when given); ConfigError naming `subject` when it cannot serve them."""
    if name == "auto":
        serving = [ALL_BACKENDS[c] for c in AUTO
                   if ALL_BACKENDS[c].refusal(value_terms=value_terms, dropout=dropout, method=method) is None]
        chosen = ALL_BACKENDS["eager"]
        for backend in reversed(serving):  # a backend that may decline calls hands them to the next
            chosen = replace(backend, forward=backend.auto_forward or backend.forward, fallback=chosen) \
                if backend.skip is not None else backend
        for backend in serving:
            _prepare(backend, auto=True)
        return chosen
    backend = ALL_BACKENDS[name]
    reason = backend.refusal(value_terms=value_terms, dropout=dropout, method=method)
    if reason:
        raise ConfigError(f"attn_backend={name!r} cannot serve {subject}: {reason}; use attn_backend='eager' or "
                          f"'auto'")
    return _prepare(backend, auto=False)


def _prepare(backend: AttentionBackend, auto: bool) -> AttentionBackend:
    if backend.prepare is not None:
        backend.prepare(auto)
    return backend


def serving_backend(name: str, *, value_terms: bool) -> AttentionBackend:
    """`name`'s backend, or what "auto" picks where it cannot add the method's value terms (for code that
    attaches a method to a model whose attention implementation was chosen before the method)."""
    backend = ALL_BACKENDS[name]
    if backend.refusal(value_terms=value_terms, dropout=0.0) is None:
        return _prepare(backend, auto=False)
    return resolve_backend("auto", value_terms=value_terms)
