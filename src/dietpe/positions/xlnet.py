"""Transformer-XL / XLNet relative attention (Dai et al. 2019, §3.3; Yang et al. 2019), DIET companion eq. 3-4:

    A_ij = [ q_i·k_j + q_i·(W_R R_{i-j}) + u·k_j + v·(W_R R_{i-j}) ] / √d_h

R_{i-j} is the sinusoid of the offset (width D), W_R a per-layer projection to the heads, u and v learned
per head and per layer (XLNet's untied biases). We keep Transformer-XL's separate W_R for positions; the
companion paper writes W_K there. No value term.
Entry points: qk (u is added to the query of the content term) and logit bias (the position terms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dietpe.positions.absolute import sinusoid_reference
from dietpe.positions.context import CacheKey, Context
from dietpe.positions.functional import relative_offsets, sinusoids
from dietpe.positions.method import PositionMethod, Traits, normal_parameter
from dietpe.positions.terms import LayerTerms, QueryRelativeBias


@dataclass(frozen=True)
class DistinctOffsets(CacheKey):
    """(the M distinct offsets pos_i - pos_j (M,), the (1|B, Lq, Lk) index of each pair among them)."""


@dataclass(frozen=True)
class OffsetSinusoids(CacheKey):
    """(M, width) sinusoids of the `DistinctOffsets`."""

    width: int


class AddToQuery:
    """qk term: q + u for the content logits (Transformer-XL's global content bias)."""

    def __init__(self, u: Tensor):
        self.u = u  # (H, Dh)

    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q + self.u[:, None, :].to(q.dtype), k


class XLNet(PositionMethod):
    name = "xlnet"
    traits = Traits(entry=("qk", "logits"), key_positions=True, query_terms=True, relative=True, paper_row="xlnet")

    @classmethod
    def from_config(cls, c):
        return cls(c.num_hidden_layers, c.hidden_size, c.num_attention_heads)

    def reference_logit(self, config, q, k, i, j, layer, head):
        dh = q.shape[-1]
        r = (sinusoid_reference(i - j, config.hidden_size) @ self.w_r[layer]).view(-1, dh)[head]  # W_R R_{i-j}
        u, v = self.u[layer, head], self.v[layer, head]
        return ((q + u) @ k + (q + v) @ r) / math.sqrt(dh)

    def __init__(self, num_layers: int, hidden_size: int, num_heads: int):
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, num_heads
        head_size = hidden_size // num_heads
        self.w_r = normal_parameter(num_layers, hidden_size, hidden_size)  # W_R per layer, D -> H·Dh
        self.u = normal_parameter(num_layers, num_heads, head_size)
        self.v = normal_parameter(num_layers, num_heads, head_size)
        self.scale = 1.0 / math.sqrt(head_size)

    def draw(self, ctx: Context, layer: int) -> Tensor:
        """The position terms at q = 0: v·W_R R_{i-j}, what is left of them without a query."""
        (term,) = self.layer_terms(ctx, layer).logits
        head_size = self.hidden_size // self.num_heads
        return term.dense(torch.zeros(1, self.num_heads, ctx.q_pos.shape[-1], head_size, device=ctx.q_pos.device))

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        def offsets():
            rel = relative_offsets(ctx.q_pos, ctx.k_pos)  # (Lq, Lk) or per example (B, Lq, Lk)
            values = ctx.diagonal_offsets()  # known without reading the data for the default positions
            if values is None:
                values = torch.arange(int(rel.min()), int(rel.max()) + 1, device=rel.device)
            return values, rel - values[0]  # the M distinct offsets (M,), index (1|B, Lq, Lk)

        values, index = ctx.cached(DistinctOffsets(), offsets)
        table = ctx.cached(OffsetSinusoids(self.hidden_size), lambda: sinusoids(values, self.hidden_size))  # (M, D)
        w_r = self.w_r[layer]
        r = (table.to(w_r.dtype) @ w_r).view(len(values), self.num_heads, -1)  # (M, H, Dh), once per layer
        lo = values[0]
        pos = QueryRelativeBias(r, ctx.q_pos, ctx.k_pos, lambda off: off - lo, self.scale, u=self.v[layer],
                                index=index, first=lo)
        return LayerTerms(qk=[AddToQuery(self.u[layer])], logits=[pos])
