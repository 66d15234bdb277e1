"""Segment (token type) information, at the input or per head.

    input     BERT (Devlin et al. 2019, §3.2): a learned segment embedding added to the token embeddings.
    per-head  DIET eq. 2: E_S(S(i), S(j)) = Ŝ_{S(i), S(j)}, a k×k table of scalars per head (and per layer,
              subject to `sharing`) added to the logits. As a product Ŝ[S(i), :] · onehot(S(j))ᵀ it is a
              rank-k term, so backends may fold it into queries and keys instead of building (B, H, L, L).
              Ŝ is stored over `logit_scale` (dietpe.positions.method).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from dietpe.positions.context import Built, CacheKey, Context
from dietpe.positions.method import PositionMethod, normal_parameter, shared_layer, sharing_shape
from dietpe.positions.terms import LayerTerms, SegmentBias
from dietpe.positions.terms.low_rank import one_hot_keys


@dataclass(frozen=True)
class KeyOneHot(CacheKey):
    """onehot(S(j)) of the keys' segments, (B, 1, Lk, k): the same for every layer's Ŝ."""

    owner: object


class InputSegments(nn.Module):
    """Entry point: input."""

    def __init__(self, num_segments: int, hidden_size: int):
        super().__init__()
        self.num_segments = num_segments
        self.weight = normal_parameter(num_segments, hidden_size)

    def embed(self, segment_ids: Tensor) -> Tensor:
        return nn.functional.embedding(segment_ids, self.weight)  # (B, L, D)

    reset_parameters = PositionMethod.reset_parameters


class PerHeadSegments(PositionMethod):
    """Entry point: logit bias."""

    logit_parameters = ("table",)

    def __init__(self, num_layers: int, num_heads: int, num_segments: int, sharing: str):
        super().__init__()
        self.num_segments, self.sharing = num_segments, sharing
        n_layers, n_heads = sharing_shape(sharing, num_layers, num_heads)
        self.table = normal_parameter(n_layers, n_heads, num_segments, num_segments)  # Ŝ

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        if ctx.q_segments is None:
            return LayerTerms()
        table = shared_layer(self.sharing, layer)
        shared = ctx.cached(Built(self, -1), lambda: _SegmentsForward(self, ctx))
        term = shared.terms[table]
        if term is None:
            term = shared.terms[table] = SegmentBias(shared.tables[table], ctx.q_segments, ctx.k_segments,
                                                     shared.one_hot)
        return LayerTerms(logits=[term])


class _SegmentsForward:
    """What the layers' segment terms share in one forward, in one cache entry (every layer asks, and each entry
    costs its key's hashing in Python): Ŝ's per-layer slices (one `unbind`), the keys' one-hot factor built when
    first read, and each table's term once built."""

    def __init__(self, method: PerHeadSegments, ctx: Context):
        self.tables = method.logit("table").unbind(0)
        self.one_hot = lambda: ctx.cached(KeyOneHot(method), lambda: one_hot_keys(
            ctx.k_segments, method.num_segments, method.table.dtype))
        self.terms: list[SegmentBias | None] = [None] * len(self.tables)
