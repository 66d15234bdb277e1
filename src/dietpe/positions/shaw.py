"""Shaw et al. (2018), relative position representations, as written in DIET's companion paper (eq. 3):

    A_ij = x_i W_Q (x_j W_K + a^K_clip(i-j,k))ᵀ / √d_h,     o_i = Σ_j softmax(A)_ij (x_j W_V + a^V_clip(i-j,k))

with a^K, a^V ∈ R^{2k+1, d_h} learned per layer and shared by the heads, distances clipped to ±k.
Entry points: logit bias (a query-dependent key term) and values.

With consecutive positions the terms read only the rows some offset reaches: at L tokens, ±min(k, L - 1)
around the centre. Clipping to that window gives every pair the row clipping to ±k gives it, and the rows
beyond get no gradient either way; k = 1024 at 128 tokens would otherwise multiply each query by 2,049 rows
where 255 are reached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dietpe.positions.context import CacheKey, ClippedIndex, Context, clipped_index
from dietpe.positions.fields import Field, positive_int
from dietpe.positions.functional import OneHot, clipped_offset_index
from dietpe.positions.method import PositionMethod, Traits, normal_parameter
from dietpe.positions.terms import Band, LayerTerms, QueryRelativeBias, ValueTerm

SHAW_MAX_DISTANCE = Field("shaw_max_distance", 16, positive_int, "k: offsets clipped to ±k")


@dataclass(frozen=True)
class OneHotOf(CacheKey):
    """The `OneHot` of the index under `index` into `size` buckets, in `dtype` (or None)."""

    index: CacheKey
    size: int
    dtype: torch.dtype


@dataclass(frozen=True)
class BandOf(CacheKey):
    """The `Band` of offsets clipped to ±max_distance for the context's positions, or None."""

    max_distance: int


class Shaw(PositionMethod):
    name = "shaw"
    traits = Traits(entry=("logits", "values"), key_positions=True, probabilities=True, query_terms=True,
                    relative=True, paper_row="shaw")
    fields = (SHAW_MAX_DISTANCE,)

    @classmethod
    def from_config(cls, c):
        return cls(c.num_hidden_layers, c.head_size, c.shaw_max_distance)

    def _clip(self, config, i: int, j: int) -> int:
        """Row of a^K, a^V: clip(i - j, k) + k."""
        k = config.shaw_max_distance
        return max(-k, min(k, i - j)) + k

    def reference_logit(self, config, q, k, i, j, layer, head):
        return q @ (k + self.key[layer, self._clip(config, i, j)]) / math.sqrt(q.shape[-1])

    def reference_value(self, config, i, j, layer, head):
        return self.value[layer, self._clip(config, i, j)]

    def __init__(self, num_layers: int, head_size: int, max_distance: int):
        super().__init__()
        self.max_distance = max_distance
        self.key = normal_parameter(num_layers, 2 * max_distance + 1, head_size)  # a^K per layer
        self.value = normal_parameter(num_layers, 2 * max_distance + 1, head_size)  # a^V per layer
        self.scale = 1.0 / math.sqrt(head_size)

    def band(self, ctx: Context) -> Band | None:
        """The offsets as a band (consecutive positions: pos_i - pos_j = i + delta - j, in
        [delta - Lk + 1, delta + Lq - 1]) clipped to the reached window, else None."""
        diagonals = ctx.diagonal_offsets()  # (Lq + Lk - 1,) from pos_0 - pos'_(Lk-1), or None
        if diagonals is None:
            return None
        lq, lk = ctx.q_pos.shape[-1], ctx.k_pos.shape[-1]
        if ctx.q_start is not None and ctx.k_start is not None:
            delta = ctx.q_start - ctx.k_start
        else:
            delta = int(diagonals[0]) + lk - 1
        return Band(delta, min(self.max_distance, max(delta + lq - 1, lk - 1 - delta)))

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        band = ctx.cached(BandOf(self.max_distance), lambda: self.band(ctx))
        w = self.max_distance if band is None else band.max_distance  # the window: rows k - w .. k + w
        rows = slice(self.max_distance - w, self.max_distance + w + 1)
        m, dtype = 2 * w + 1, self.key.dtype

        # built when first read, once per forward: the banded inference path reads neither
        def index() -> Tensor:  # (1|B, Lq, Lk)
            return clipped_index(ctx, w)

        def onehot() -> OneHot | None:
            return ctx.cached(OneHotOf(ClippedIndex(w), m, dtype), lambda: OneHot.of(index(), m, dtype))

        key = QueryRelativeBias(self.key[layer, rows][:, None, :], ctx.q_pos, ctx.k_pos,
                                lambda offsets: clipped_offset_index(offsets, w), self.scale,
                                index=index, band=band, onehot=onehot, first=-w)  # r: (M, 1, Dh)
        return LayerTerms(logits=[key], values=[ValueTerm(self.value[layer, rows], index, band, onehot)])
