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

from dietpe.positions.functional import clipped_offset_index, consecutive_offsets, relative_offsets

T = TypeVar("T")


@dataclass(frozen=True)
class CacheKey:
    """Base of the keys of `Context.cached`. Subclasses are frozen dataclasses: equal when of the same class
    with equal fields (a dataclass's equality compares the class first)."""


@dataclass(frozen=True)
class Built(CacheKey):
    """What `owner` (a method module, compared by identity) builds once per forward for the layers that read
    its table `table` (0 when one table serves every layer): a term, or a whole `LayerTerms`."""

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

    def diagonal_offsets(self) -> Tensor | None:
        """(Lq + Lk - 1,) offsets pos_i - pos_j along the diagonals of the (Lq, Lk) offsets (see `toeplitz`), or
        None when they are no Toeplitz matrix (positions with gaps, per example, or unknown while compiling)."""
        if self.q_start is not None and self.k_start is not None:
            lq, lk = self.q_pos.shape[-1], self.k_pos.shape[-1]
            first = self.q_start - (self.k_start + lk - 1)
            return torch.arange(first, first + lq + lk - 1, device=self.q_pos.device)
        if torch.compiler.is_compiling():
            return None  # reading the positions would break the graph: the general path serves any positions
        return consecutive_offsets(self.q_pos, self.k_pos)

    @property
    def batch(self) -> int:
        """Leading size of position-only terms: B for per-example positions, else 1."""
        return self.q_pos.shape[0] if self.q_pos.dim() == 2 else 1

    def cached(self, key: CacheKey, fn: Callable[[], T]) -> T:
        """`fn()`, computed once per forward under `key` and shared between layers and methods."""
        if not isinstance(key, CacheKey):
            raise TypeError(f"Context.cached takes a CacheKey, got {type(key).__name__}")
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]


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
