"""ALiBi (Press et al. 2022, §3), beyond the papers: A_ij = q_i·k_j / √d_h - m_h · |i - j| (bidirectional form
for encoders; a decoder's causal mask hides j > i, leaving the paper's -m_h (i - j)). Fixed slopes m_h.
Entry point: logit bias, computed once per forward, shared by layers.
"""

from __future__ import annotations

import torch

from diet.positions.base import Context, DenseBias, LayerTerms, TableBias
from diet.positions.functional import alibi_slopes, relative_offsets
from diet.positions.method import PositionMethod


class ALiBi(PositionMethod):
    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        def build():
            slopes = alibi_slopes(self.num_heads).to(ctx.q_pos.device)  # (H,)
            offsets = ctx.diagonal_offsets()  # (Lq + Lk - 1,) or None
            if offsets is not None:  # a Toeplitz matrix: never built whole unless a backend asks for it
                values = -(slopes[:, None] * offsets.abs().float())  # (H, Lq + Lk - 1), one per diagonal
                return TableBias(values, lambda: relative_offsets(ctx.q_pos, ctx.k_pos) - offsets[0],
                                 diagonals=torch.arange(len(offsets), device=offsets.device),
                                 size=(len(ctx.q_pos), len(ctx.k_pos)))
            dist = relative_offsets(ctx.q_pos, ctx.k_pos).abs().float()  # (Lq, Lk) or per example (B, Lq, Lk)
            dist = dist.view(-1, 1, *dist.shape[-2:])  # (1|B, 1, Lq, Lk)
            return DenseBias(-(slopes[:, None, None] * dist))  # (1|B, H, Lq, Lk)

        return LayerTerms(logits=[ctx.cached("alibi_term", build)])
