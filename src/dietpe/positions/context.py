"""What the position methods read to build their terms, once per forward, and the cache they share.

A `Context` holds the positions (and segments) of one forward. Methods build their terms from it, and
tensors worth building once (an (Lq, Lk) bucket index, the unbound slices of a per-layer table, a term every
layer reads) go through `Context.cached` under a typed `CacheKey`: the key's class says what the tensor is,
its fields what it was built from. Two methods that mean the same tensor build equal keys and share it (TUPE-R
reads T5's bucket index); keys of different classes never compare equal, so two tensors cannot collide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import torch
from torch import Tensor

from dietpe.attention.masks import BLOCKED_AT_MOST
from dietpe.positions.functional import clipped_offset_index, consecutive_offsets, relative_offsets

T = TypeVar("T")


_MISSING = object()


@dataclass(frozen=True)
class CacheKey:
    """Base of the keys of `Context.cached`. Subclasses are frozen dataclasses: equal when of the same class
    with equal fields (a dataclass's equality compares the class first)."""


@dataclass(frozen=True)
class Built(CacheKey):
    """What `owner` (a method module, compared by identity) builds once per forward for the layers that read
    its table `table` (0 when one table serves every layer): a term, or a whole `LayerTerms`; table -1: what
    all its tables share in the forward (DIET-REL's and the per-head segments' slices and terms)."""

    owner: Any
    table: int = 0


@dataclass(frozen=True)
class LayerSlices(CacheKey):
    """The per-layer slices of `owner`'s parameter `name` (n_layers, ...), one `unbind` per forward."""

    owner: Any
    name: str


@dataclass(frozen=True)
class ClippedIndex(CacheKey):
    """(1|B, Lq, Lk) int64: clip(pos_i - pos_j, ±max_distance) + max_distance (Shaw's a^K, a^V rows,
    DIET-REL's columns of R)."""

    max_distance: int


@dataclass(frozen=True)
class ClippedDiagonals(CacheKey):
    """(Lq + Lk - 1,) int64: `ClippedIndex` along the diagonals (consecutive positions), or None."""

    max_distance: int


@dataclass(frozen=True)
class RunsKey(CacheKey):
    """`Runs` of the context's positions."""


class Runs:
    """Positions as runs of consecutive integers, each example its own (packed documents restarting at 0, left
    padding, per-example starts). With the queries aligned to the last Lq keys (self-attention, or new tokens
    after cached ones),

        pos_q[b, i] = (i + Lk - Lq) + run_q[b, i],   pos_k[b, j] = j + run_k[b, j],

    so on every pair whose runs agree, pos_i - pos_j = i - j + Lk - Lq: `diagonals` ((Lq + Lk - 1,), the offset
    of each diagonal i - j + Lk - 1). A relative term read along those diagonals is exact wherever the mask
    opens only such pairs (a block-diagonal document mask, causal left padding), and blocked pairs add nothing;
    `hold(mask, causal)` says whether it does. q, k: (1|B, Lq), (1|B, Lk)."""

    def __init__(self, q_pos: Tensor, k_pos: Tensor):
        lq, lk = q_pos.shape[-1], k_pos.shape[-1]
        device = q_pos.device
        self.q = (q_pos - torch.arange(lk - lq, lk, device=device)).reshape(-1, lq)
        self.k = (k_pos - torch.arange(lk, device=device)).reshape(-1, lk)
        self.diagonals = torch.arange(lq + lk - 1, device=device) - (lq - 1)
        self._held: dict[tuple[int, bool], tuple[Tensor | None, bool]] = {}

    def hold(self, mask: Tensor | None, causal: bool, rows: int = 1024) -> bool:
        """Whether every pair the additive mask (B|1, H|1, 1|Lq, Lk) and causality open has agreeing runs:
        checked once per forward and mask (its layers share it), `rows` queries at a time (no (Lq, Lk) tensor
        held whole)."""
        key = (id(mask), causal)
        if key not in self._held:
            self._held[key] = (mask, self._check(mask, causal, rows))  # the mask kept: its id stays its own
        return self._held[key][1]

    def _check(self, mask: Tensor | None, causal: bool, rows: int) -> bool:
        first = self.q[:, :1]
        if bool(((self.q == first).all() & (self.k == first).all())):
            return True  # one run per example, queries and keys alike: every pair agrees
        lq, lk = self.q.shape[-1], self.k.shape[-1]
        opened = None if mask is None else mask.amax(1) > BLOCKED_AT_MOST  # (B|1, 1|Lq, Lk): open to some head
        across = torch.zeros((), dtype=torch.bool, device=self.q.device)  # read once, at the end: one host sync
        for start in range(0, lq, rows):
            stop = min(start + rows, lq)
            differ = self.q[:, start:stop, None] != self.k[:, None, :]  # (1|B, rows, Lk)
            if opened is not None:
                differ = differ & (opened if opened.shape[1] == 1 else opened[:, start:stop])
            if causal:
                i = torch.arange(start, stop, device=self.q.device)[:, None] + (lk - lq)
                differ = differ & (torch.arange(lk, device=self.q.device) <= i)
            across = across | differ.any()
        return not bool(across)


@dataclass
class Context:
    """What the position methods need to build their terms, computed once per forward.

    q_pos, k_pos: (Lq,), (Lk,) integer positions of queries and keys shared by the batch (k_pos covers cached
        keys when decoding), or (B, Lq), (B, Lk) when each example has its own (`position_ids` of shape (B, L):
        packed documents, left padding). Terms built from per-example positions have batch B, else 1.
    q_segments, k_segments: (B, Lq), (B, Lk) segment ids, or None.
    projected_keys: the keys were projected along the length (Linformer); k_pos then indexes the k slots.
    q_start, k_start: set when the model knows, without reading the tensors, that q_pos and k_pos are the runs
        q_start, q_start + 1, ... and k_start, ... (its default positions): the relative terms then take their
        Toeplitz fast path with no data-dependent check, so a compiled forward has no graph break.
    """

    q_pos: Tensor
    k_pos: Tensor
    q_segments: Tensor | None = None
    k_segments: Tensor | None = None
    projected_keys: bool = False
    q_start: int | None = None
    k_start: int | None = None
    _cache: dict[CacheKey, Any] = field(default_factory=dict, repr=False)
    _on_release: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def runs(self) -> Runs | None:
        """The positions as `Runs`, where `diagonal_offsets` has none (per-example or gapped positions) and the
        data may be read (not while compiling); else None."""
        if self.projected_keys or torch.compiler.is_compiling():
            return None
        # once per forward, None included: every layer's term asks, and reading given positions syncs a GPU
        return self.cached(RunsKey(), lambda: None if self.diagonal_offsets() is not None
                           else Runs(self.q_pos, self.k_pos))

    def first_offset(self) -> int | None:
        """pos_0 - pos'_(Lk-1), the first of the diagonals' offsets (they run on by one), when the model knows
        its positions without reading them (q_start, k_start); else None."""
        if self.q_start is None or self.k_start is None:
            return None
        return self.q_start - (self.k_start + self.k_pos.shape[-1] - 1)

    def diagonal_offsets(self) -> Tensor | None:
        """(Lq + Lk - 1,) offsets pos_i - pos_j along the diagonals of the (Lq, Lk) offsets (see `toeplitz`), or
        None when they are no Toeplitz matrix (positions with gaps, per example, or unknown while compiling)."""
        first = self.first_offset()
        if first is not None:
            lq, lk = self.q_pos.shape[-1], self.k_pos.shape[-1]
            return torch.arange(first, first + lq + lk - 1, device=self.q_pos.device)
        if torch.compiler.is_compiling():
            return None  # reading the positions would break the graph: the general path serves any positions
        return consecutive_offsets(self.q_pos, self.k_pos)

    @property
    def batch(self) -> int:
        """Leading size of position-only terms: B for per-example positions, else 1."""
        return self.q_pos.shape[0] if self.q_pos.dim() == 2 else 1

    def release(self) -> None:
        """Forget what `cached` kept, at the end of the forward that built this context. Terms kept there hold
        closures over the context (built on demand, shared by layers): a reference cycle that would keep each
        forward's terms, dense biases included, alive until Python's cycle collector happens to run. Then what
        `on_release` was given runs: terms kept between forwards let go of what this forward built on them."""
        self._cache.clear()
        for fn in self._on_release:
            fn()
        self._on_release.clear()

    def on_release(self, fn: Callable[[], None]) -> None:
        """Run `fn` when the forward ends (`release`)."""
        self._on_release.append(fn)

    def cached(self, key: CacheKey, fn: Callable[[], T]) -> T:
        """`fn()`, computed once per forward under `key` and shared between layers and methods."""
        if not isinstance(key, CacheKey):
            raise TypeError(f"Context.cached takes a CacheKey, got {type(key).__name__}")
        value = self._cache.get(key, _MISSING)  # one lookup: every layer asks, and a key's hash is Python's
        if value is _MISSING:
            value = self._cache[key] = fn()
        return value


def clipped_index(ctx: Context, max_distance: int) -> Tensor:
    """`ClippedIndex(max_distance)` of the context, built once per forward."""
    return ctx.cached(ClippedIndex(max_distance), lambda: clipped_offset_index(
        relative_offsets(ctx.q_pos, ctx.k_pos), max_distance))


def clipped_diagonals(ctx: Context, max_distance: int) -> Tensor | None:
    """`ClippedDiagonals(max_distance)` of the context, built once per forward."""

    def build():
        offsets = ctx.diagonal_offsets()
        return None if offsets is None else clipped_offset_index(offsets, max_distance)

    return ctx.cached(ClippedDiagonals(max_distance), build)
