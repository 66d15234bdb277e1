"""The base class of a position (or segment) method and the layout of parameters shared by heads or layers.

A method owns its parameters and, once per forward, turns a `Context` into contributions to the four entry
points of `dietpe.positions.terms`: `embed` for the input, `layer_terms` for qk, logit and value terms.
Logit-unit parameters (`logit_parameters`: per-head scalar tables added to the logits, DIET-ABS's factors) are
stored divided by `logit_scale` and used multiplied back, θ_eff = logit_scale · θ: the same init in logit units,
while Adam (which moves a parameter by about its learning rate per step) moves the effective table
`logit_scale` × faster, so one optimizer and one learning rate train them (x-transformers scales its T5 table
by √d_h the same way). Every equation reads the effective table (`logit`).
Sharing (DIET Tables 5, 8, 9): `none` keeps a (layer, head) table each, `head` one per layer broadcast over
heads, `layer` one per head used by every layer.

A method class also states its facts, read through the registry (`dietpe.positions.registry`): its `name`,
its `traits`, its config `fields` (`dietpe.positions.fields`) and cross checks (`check_config`), how it is
built from a config (`from_config`), and its reference equation (`reference_logit`, with the optional
`reference_embedding` and `reference_value` hooks): plain loops over one query-key pair, written straight
from the paper and reading the parameters, against which tests/positions/test_references.py holds every
registered method.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol, TypeVar

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig
from transformers import initialization as hf_init

from dietpe.positions.context import Context, LayerSlices
from dietpe.positions.fields import Field
from dietpe.positions.terms import EMPTY, LayerTerms, LogitTerm

T = TypeVar("T")


_BUILD = object()

#: position-only products up to this many elements (64 MiB in float32) are kept between inference forwards
KEEP_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Traits:
    """What a method is, once; `DietConfig` validation, the backend choice, the pipeline's default segments,
    the papers' list of methods, `dietpe bench` and the tests' matrices read it through the registry.

    entry           the entry points it contributes to: input, qk, logits, values (dietpe.positions.terms)
    learned_table   a table indexed by absolute position: positions beyond max_position_embeddings are refused
    key_positions   needs each key's position (relative or untied terms): impossible after Linformer's projection
    probabilities   a value term reads the attention probabilities: only the eager backend serves it
    query_terms     its logit term reads the query (Shaw's key term, XLNet): built per layer and batch
    relative        its terms depend on positions only through pos_i - pos_j: a shift of all positions changes
                    nothing (the tests hold every such method to it)
    shareable       DIET's per-head tables, which `sharing` applies to (DIET Tables 5, 8, 9)
    segment         the segment mode of its row in DIET's tables (DIET rows: per head, eq. 2; others: input)
    paper_row       its spec in the papers' comparison (DIET Table 2 rows, plus rotary and ALiBi), or None
    causal_ok       meaningful in causal self-attention (a decoder-only LM, `DietCausalConfig`); the causal
                    LM refuses the others when its config is built
    cls_reset       resets the terms of position 0 as [CLS]'s (TUPE's reset_θ): an encoder's device, refused
                    in a causal LM unless switched off (tupe_reset=False)
    bert_table      its `weight` is BERT's learned input position table (`from_bert` / `to_bert` map it as is)
    tile_terms      its logit terms are per-offset tables, low-rank factors or segment tables
                    (`LogitTerm.offset_table`, `factors`, `segment_table`), which the fused kernel reads inside
                    its tile (`attn_backend="fused"`); a method with logit terms and without it is refused there
    """

    entry: tuple[str, ...] = ()
    learned_table: bool = False
    key_positions: bool = False
    probabilities: bool = False
    query_terms: bool = False
    relative: bool = False
    shareable: bool = False
    segment: str = "input"
    paper_row: str | None = None
    causal_ok: bool = True
    cls_reset: bool = False
    bert_table: bool = False
    tile_terms: bool = False

    @property
    def per_head(self) -> bool:
        """Position enters attention itself (qk, logits or values), not the token embeddings."""
        return any(e != "input" for e in self.entry)


def causal(c: PretrainedConfig) -> bool:
    """Whether the stack built from `c` attends causally: a `DietCausalConfig`, or the translation decoder's
    view of its config (`DietSeq2SeqConfig.decoder_view`). T5's buckets (also inside TUPE-R) are then T5's
    decoder's unidirectional ones."""
    return bool(getattr(c, "causal", False))


class PositionMethod(nn.Module):
    """Base: contributes nothing. Subclasses override `embed` and/or `layer_terms`, and a registered method
    states its facts in the class attributes and class methods below."""

    #: the `position` name it is registered under (dietpe.positions.registry)
    name: ClassVar[str] = ""
    traits: ClassVar[Traits] = Traits()
    #: the config fields it reads: its own, and those of other methods it shares (named by their owner)
    fields: ClassVar[tuple[Field, ...]] = ()
    #: what the analysis pictures call its per-offset profile and its `position_table` (dietpe.analysis)
    profile_name: ClassVar[str] = "mean logit"
    table_name: ClassVar[str] = "input position embeddings"

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> "PositionMethod":
        """The method for a config (its sizes, its fields; `causal(config)` for the direction of attention)."""
        return cls()

    @classmethod
    def check_config(cls, config: PretrainedConfig) -> None:
        """Checks across the method's fields and the model's sizes; raise ConfigError naming the values."""

    # -- reference equation: one query-key pair, plain loops and math, read from the parameters ------------
    def reference_logit(self, config: PretrainedConfig, q: Tensor, k: Tensor, i: int, j: int, layer: int,
                        head: int) -> Tensor:
        """The logit A_ij of head `head` in layer `layer` from the paper's equation: q (Dh,) the query of the
        token at position i, k (Dh,) the key of the token at position j (i, j are positions, not indices),
        before segments and masks. Default: the content term q·k/√d_h alone."""
        return q @ k / math.sqrt(q.shape[-1])

    def reference_embedding(self, config: PretrainedConfig, pos: int) -> Tensor | None:
        """Input hook: what the method adds to the token embedding at position `pos` (D,), or None."""
        return None

    def reference_value(self, config: PretrainedConfig, i: int, j: int, layer: int, head: int) -> Tensor | None:
        """Value hook: what the method adds to the value of the key at position j for the query at position i
        in head `head` (Dh,), weighted by the attention probability p_ij (Shaw's a^V), or None."""
        return None

    #: longest sequence the method's learned tables allow; None when any length works
    max_length: int | None = None
    #: parameters added to the attention logits as they are (per-head scalar tables) or as the factors of a
    #: logit term (DIET-ABS's P_Q, P_K), yet initialised at the embedding std: stored over `logit_scale`, and
    #: `--logit-lr-scale` applies to these, for every method alike (dietpe.tasks.optim, docs/parametrization.md)
    logit_parameters: tuple[str, ...] = ()
    #: effective = logit_scale × stored, for the `logit_parameters` (the config's `logit_scale`, set by
    #: `PositionEncoding`; 1 is the stored-as-used form of checkpoints written before the field existed)
    logit_scale: float = 1.0

    def logit(self, name: str) -> Tensor:
        """Parameter `name` as the equations use it: × logit_scale for a logit-unit parameter."""
        value = getattr(self, name)
        return value * self.logit_scale if name in self.logit_parameters and self.logit_scale != 1 else value

    def embed(self, position_ids: Tensor) -> Tensor | None:
        """Input entry point: (1|B, L, D) added to the token embeddings, or None."""
        return None

    def kept(self, ctx: Context, name: str, tensors: tuple[Tensor, ...], elements: int,
             build: Callable[[], T]) -> Callable[[], T] | None:
        """`build` made to keep its result between inference forwards, or None where it cannot.

        DIET §3.1: the position term "is independent of the input, [so] we only need to compute the matrix
        multiplication once for each training batch, and we can cache the computed matrix before running
        inference". So a method's position-only term, a function of `tensors` (its parameters) and the
        positions alone, is built once per forward in training and, at inference, once while the tensors and
        the positions stay the same. The entry is keyed by the lengths and starts of the default positions
        and holds a copy of the tensors it was built from; a forward uses it only if every tensor still equals
        its copy exactly (version counters would not do: fused optimizers update parameters without bumping
        them). One entry per name, at most KEEP_ELEMENTS elements; never with per-example or custom
        positions, a gradient to track, or while compiling. Only on the CPU: on a GPU the comparison is a host
        sync per term and forward, which stalls the queue for longer than the term takes to build there (and
        cannot be captured in a CUDA graph), so a GPU builds the term every forward, as training does."""
        if (ctx.q_start is None or ctx.k_start is None or elements > KEEP_ELEMENTS
                or ctx.q_pos.device.type != "cpu" or torch.compiler.is_compiling()
                or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))):
            return None
        store = self.__dict__.setdefault("_kept", {})  # not state: never saved, nor moved by .to()
        # a value built in inference mode may not enter autograd later (it is an inference tensor)
        key = (ctx.q_pos.shape[-1], ctx.k_pos.shape[-1], ctx.q_start, ctx.k_start, ctx.q_pos.device,
               torch.is_inference_mode_enabled())

        def fetch() -> T:
            hit = store.get(name)
            if hit is not None and hit[0] == key and all(same_bits(a, b) for a, b in zip(hit[1], tensors)):
                return hit[2]
            value = build()
            store[name] = (key, tuple(t.detach().clone() for t in tensors), value)
            return value

        return fetch

    def train(self, mode: bool = True) -> "PositionMethod":
        """Leaving inference frees what `kept` and `kept_forward` hold: training builds its terms every forward."""
        if mode:
            self.__dict__.pop("_kept", None)
            self.__dict__.pop("_forward_kept", None)
        return super().train(mode)

    def __getstate__(self) -> dict:
        # what inference keeps is no state: pickling (torch.save of a whole model, deepcopy) leaves it
        state = super().__getstate__()
        state.pop("_kept", None)
        state.pop("_forward_kept", None)
        return state

    def kept_forward(self, ctx: Context, sources: tuple[Tensor, ...], build: Callable[[], K],
                     unkept: object = _BUILD) -> K:
        """build(): what the method's layers share in a forward (its terms, and the tensors they read), kept from
        the last forward where `forward_key` allows and no other forward uses it (else built afresh), then
        `start`ed for this one; it `drop`s what this forward built on it when the forward ends
        (`Context.on_release`). The object's tensors must be views of
        `sources` (its parameters) or of buffers `start` refills from them, or functions of the positions and
        constants, so that it reads the current parameters however they changed (DIET §3.1 on any device: no
        comparison, no host sync). unkept: what to return where nothing may be kept (default: build())."""
        key = forward_key(ctx, sources, self.logit_scale)
        if key is None:
            return build() if unkept is _BUILD else unkept
        kept = self.__dict__.get("_forward_kept")  # not state: never saved, nor moved by .to()
        if kept is not None and kept.key == key:
            if not kept.claim(ctx):  # another forward is using it (threads serving one model)
                return build() if unkept is _BUILD else unkept
            kept.value.start(ctx)
        else:
            kept = _KeptEntry(key, build())
            kept.claim(ctx)
            self.__dict__["_forward_kept"] = kept
        ctx.on_release(kept.free)
        return kept.value

    def keep(self, ctx: Context, name: str, tensors: tuple[Tensor, ...], term: LogitTerm) -> LogitTerm:
        """`term`, position-only, a function of `tensors` and the positions, with its dense form kept between
        inference forwards (see `kept`)."""
        if ctx.q_pos.device.type != "cpu" or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return term  # what `kept` refuses, before the builder is made: every layer asks
        lq, lk = term.size
        ref = weakref.ref(term)  # the term holds this builder: a strong reference back would make a cycle
        term.kept = self.kept(ctx, name, tensors, term.heads * lq * lk, lambda: ref().build(None, None))
        return term

    def layer_table(self, ctx: Context, name: str, layer: int, stored: bool = False) -> Tensor:
        """Layer `layer`'s slice of the per-layer parameter `name` (n_layers, ...), as the equations read it (×
        logit_scale), or as `stored` (a view of the parameter, for a term that applies the scale itself). The
        slices are taken by one `unbind` per forward, so the backward writes each layer's gradient straight into
        one stacked gradient instead of a zero-filled copy of the whole parameter per layer, added up."""
        if stored:
            return ctx.cached(LayerSlices(self, f"{name} stored"), lambda: getattr(self, name).unbind(0))[layer]
        return ctx.cached(LayerSlices(self, name), lambda: self.logit(name).unbind(0))[layer]

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        """qk, logit and value contributions to attention layer `layer`."""
        return EMPTY

    def draw(self, ctx: Context, layer: int) -> Tensor | None:
        """The method's position-only logits in `layer` for the context's positions, (1, H|1, Lq, Lk): the sum
        of its logit terms that need no query (DIET Fig. 4, 7; TUPE Fig. 6). None when it puts nothing
        position-only into the logits (input methods, rotary, Shaw's query-times-offset key term)."""
        dense = [t.dense(None) for t in self.layer_terms(ctx, layer).logits if not t.query_dependent]
        return sum(dense[1:], dense[0]) if dense else None

    def position_table(self, length: int) -> Tensor | None:
        """The absolute position embeddings (n, D) the method has for positions 0..n-1 (DIET Fig. 5), or None."""
        return None

    def reset_parameters(self, std: float) -> None:
        # HF's init helpers skip tensors already loaded from a checkpoint; logit-unit tables start at std in
        # logit units, so stored at std / logit_scale
        logit = getattr(self, "logit_parameters", ())
        for name, p in self.named_parameters(recurse=False):
            hf_init.normal_(p, std=std / self.logit_scale if name in logit else std)


class _KeptEntry:
    """`kept_forward`'s entry: its key, the kept objects, and the forward using them (a weak reference to its
    context: a forward that raised before its end frees them when its context goes)."""

    __slots__ = ("key", "value", "_user")
    _lock = threading.Lock()  # claims are atomic, also without the GIL

    def __init__(self, key: tuple, value: "KeptForward"):
        self.key, self.value, self._user = key, value, None

    def claim(self, ctx: Context) -> bool:
        """Whether the objects were free and are now this forward's."""
        with self._lock:
            if self._user is not None and self._user() is not None:
                return False
            self._user = weakref.ref(ctx)
            return True

    def free(self) -> None:
        """The forward has ended: it drops what it built on the objects, and they are free again."""
        self.value.drop()
        self._user = None


class KeptForward(Protocol):
    """What `PositionMethod.kept_forward` keeps."""

    def start(self, ctx: Context) -> None:
        """A later forward with this context: refill what is read from a copy of the parameter."""

    def drop(self) -> None:
        """The forward has ended: let go of what it built (dense forms, indices)."""


K = TypeVar("K", bound=KeptForward)


def forward_key(ctx: Context, sources: tuple[Tensor, ...], logit_scale: float) -> tuple | None:
    """What a forward's shared objects built from `sources` at these positions hold for, or None where none may
    be kept: an autograd graph to build (training), positions the model does not know without reading them,
    while compiling, while a CUDA graph is captured (a buffer refilled by each forward would outlive the graph's
    memory pool). Inference mode and the stream are part of it (a buffer is never refilled while another
    stream may read it), and each source's address, shape and dtype (a new tensor in a parameter's place)."""
    if (torch.is_grad_enabled() or ctx.q_start is None or ctx.k_start is None or ctx.projected_keys
            or torch.compiler.is_compiling()):
        return None
    device = ctx.q_pos.device
    stream = None
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return None
        stream = torch.cuda.current_stream(device)
    return (ctx.q_pos.shape[-1], ctx.k_pos.shape[-1], ctx.q_start, ctx.k_start, device, stream,
            torch.is_inference_mode_enabled(), logit_scale, *[(t.data_ptr(), t.shape, t.dtype) for t in sources])


def refill_logit(buffer: Tensor, source: Tensor, scale: float) -> None:
    """A later forward's `PositionMethod.logit` in place: buffer = source × scale, where `logit` made a copy
    (nothing where it returned the parameter itself, at scale 1)."""
    if buffer is not source:
        torch.mul(source, scale, out=buffer)


class KeptTerm:
    """One term for every layer, kept between inference forwards (`PositionMethod.kept_forward`): T5, ALiBi,
    KERPLE. refill: rewrites, at each later forward, the buffers the term reads (the parameters' copies:
    × logit_scale, clamped); keep: the term's per-forward entries that stay valid (functions of the positions
    and constants: ALiBi's table); index: the forward's context -> the term's lazy (Lq, Lk) index (TableBias)."""

    def __init__(self, term: LogitTerm, refill: Callable[[], object] | None = None, keep: tuple[str, ...] = (),
                 index: Callable[[Context], Callable[[], Tensor]] | None = None):
        self.term, self.terms = term, LayerTerms(logits=[term])
        self._refill, self._keep, self._index = refill, keep, index

    def start(self, ctx: Context) -> None:
        if self._refill is not None:
            self._refill()
        self._renew(ctx)

    def drop(self) -> None:
        """The forward has ended: what it built on the term goes, and its context (positions, index) with it."""
        self._renew(None)

    def _renew(self, ctx: Context | None) -> None:
        if self._index is None:
            self.term.renew(self._keep)
        else:
            self.term.renew(self._keep, None if ctx is None else self._index(ctx))


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors hold the same bits: compared as 64-bit words where the layout allows (about twice as
    fast as a float comparison, and stricter: -0.0 differs from 0.0)."""
    if a.dtype != b.dtype or a.device != b.device or a.shape != b.shape:
        return False
    if a.is_contiguous() and b.is_contiguous() and a.numel() * a.element_size() % 8 == 0 and a.numel():
        return torch.equal(a.reshape(-1).view(torch.int64), b.reshape(-1).view(torch.int64))
    return torch.equal(a, b)


def sharing_shape(sharing: str, num_layers: int, num_heads: int) -> tuple[int, int]:
    """How many distinct (layers, heads) parameter tables a sharing mode keeps."""
    return (1 if sharing == "layer" else num_layers, 1 if sharing == "head" else num_heads)


def shared_layer(sharing: str, layer: int) -> int:
    """Which table a layer reads: its own, or table 0 when all layers share one."""
    return 0 if sharing == "layer" else layer


def normal_parameter(*shape: int) -> nn.Parameter:
    # real values are set by reset_parameters via the model's _init_weights; empty() keeps meta-device loading cheap
    return nn.Parameter(torch.empty(*shape))
