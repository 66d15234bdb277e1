"""Segment (token type) information, at the input or per head.

    input     BERT (Devlin et al. 2019, §3.2): a learned segment embedding added to the token embeddings.
    per-head  DIET eq. 2: E_S(S(i), S(j)) = Ŝ_{S(i), S(j)}, a k×k table of scalars per head (and per layer,
              subject to `sharing`) added to the logits. As a product Ŝ[S(i), :] · onehot(S(j))ᵀ it is a
              rank-k term, so backends may fold it into queries and keys instead of building (B, H, L, L).
              Ŝ is stored over `logit_scale` (dietpe.positions.method).
"""

from __future__ import annotations

from torch import Tensor, nn

from dietpe.positions.context import Built, Context
from dietpe.positions.method import PositionMethod, normal_parameter, refill_logit, shared_layer, sharing_shape
from dietpe.positions.terms import LayerTerms, SegmentBias
from dietpe.positions.terms.low_rank import one_hot_keys


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
        shared = ctx.cached(Built(self, -1), lambda: self.kept_forward(ctx, (self.table,),
                                                                       lambda: _SegmentsForward(self, ctx)))
        return shared.layer(shared_layer(self.sharing, layer))


class _SegmentsForward:
    """What the layers' segment terms share in one forward, in one cache entry (every layer asks, and each entry
    costs its key's hashing in Python): Ŝ's per-layer slices (one `unbind`), the keys' one-hot factor built when
    first read, and each table's terms once built. Kept between forwards without a gradient
    (`PositionMethod.kept_forward`, DIET §3.1): the slices are views of Ŝ or of a buffer each later forward
    refills with Ŝ × logit_scale; the terms take each forward's segment ids, and let go of them when it ends."""

    def __init__(self, method: PerHeadSegments, ctx: Context):
        self._values = method.logit("table")
        self.tables = self._values.unbind(0)
        self.layers: list[LayerTerms | None] = [None] * len(self.tables)
        self._source, self._scale, self._k = method.table, method.logit_scale, method.num_segments  # no cycle
        self._use(ctx)

    def _use(self, ctx: Context) -> None:
        k, dtype, segments = self._k, self._source.dtype, ctx.k_segments
        self.ids = (ctx.q_segments, ctx.k_segments)
        built: list[Tensor] = []  # the forward's, shared by its layers (the closure holds neither self nor ctx)

        def one_hot() -> Tensor:
            if not built:
                built.append(one_hot_keys(segments, k, dtype))
            return built[0]

        self.one_hot = one_hot

    def layer(self, table: int) -> LayerTerms:
        terms = self.layers[table]
        if terms is None:
            terms = self.layers[table] = LayerTerms(logits=[SegmentBias(self.tables[table], *self.ids, self.one_hot)])
        return terms

    def start(self, ctx: Context) -> None:
        refill_logit(self._values, self._source, self._scale)
        self._use(ctx)
        self._renew(self.ids, self.one_hot)

    def drop(self) -> None:
        """The forward has ended: its segment ids and one-hot go with it."""
        self.ids = self.one_hot = None
        self._renew(None, None)

    def _renew(self, ids, one_hot) -> None:
        for terms in self.layers:
            if terms is not None:
                terms.logits[0].renew((), ids, one_hot)
