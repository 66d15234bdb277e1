"""Shaw et al. (2018), relative position representations, as written in DIET's companion paper (eq. 3):

    A_ij = x_i W_Q (x_j W_K + a^K_clip(i-j,k))ᵀ / √d_h,     o_i = Σ_j softmax(A)_ij (x_j W_V + a^V_clip(i-j,k))

with a^K, a^V ∈ R^{2k+1, d_h} learned per layer and shared by the heads, distances clipped to ±k.
Entry points: logit bias (a query-dependent key term) and values.
"""

from __future__ import annotations

import math

from diet.positions.base import Context, LayerTerms, QueryRelativeBias, ValueTerm
from diet.positions.functional import clipped_offset_index, relative_offsets
from diet.positions.method import PositionMethod, normal_parameter


class Shaw(PositionMethod):
    def __init__(self, num_layers: int, head_size: int, max_distance: int):
        super().__init__()
        self.max_distance = max_distance
        self.key = normal_parameter(num_layers, 2 * max_distance + 1, head_size)  # a^K per layer
        self.value = normal_parameter(num_layers, 2 * max_distance + 1, head_size)  # a^V per layer
        self.scale = 1.0 / math.sqrt(head_size)

    def bucket(self, offsets):
        return clipped_offset_index(offsets, self.max_distance)

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        bucket = self.bucket
        index = ctx.cached("shaw_index", lambda: bucket(relative_offsets(ctx.q_pos, ctx.k_pos)))  # (1|B, Lq, Lk)
        key = QueryRelativeBias(self.key[layer][:, None, :], ctx.q_pos, ctx.k_pos, bucket, self.scale,
                                index=index)  # r: (M, 1, Dh)
        return LayerTerms(logits=[key], values=[ValueTerm(self.value[layer], index)])
