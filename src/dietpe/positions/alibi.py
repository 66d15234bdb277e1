"""ALiBi (Press et al. 2022, §3), beyond the papers: A_ij = q_i·k_j / √d_h - m_h · |i - j| (bidirectional form
for encoders; a decoder's causal mask hides j > i, leaving the paper's -m_h (i - j)). Fixed slopes m_h.
Entry point: logit bias, computed once per forward, shared by layers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dietpe.positions.context import Built, Context
from dietpe.positions.functional import alibi_bias, alibi_slopes
from dietpe.positions.method import KeptTerm, PositionMethod, Traits
from dietpe.positions.terms import DistanceBias, LayerTerms


def _paper_slope(n: int, h: int) -> float:
    """m_h as the authors' `get_slopes` writes it: 2^(-8(h+1)/n) for a power-of-two n; otherwise the slopes of
    the largest power of two p < n, then the odd-numbered slopes 2^(-8(2t+1)/(2p)) of 2p heads, t = 0, 1, ..."""
    p = 2 ** int(math.floor(math.log2(n)))
    if h < p:
        return 2.0 ** (-8.0 * (h + 1) / p)
    return 2.0 ** (-8.0 * (2 * (h - p) + 1) / (2 * p))


class ALiBi(PositionMethod):
    name = "alibi"
    traits = Traits(entry=("logits",), key_positions=True, relative=True, paper_row="alibi", tile_terms=True)

    @classmethod
    def from_config(cls, c):
        return cls(c.num_attention_heads)

    def reference_logit(self, config, q, k, i, j, layer, head):
        return super().reference_logit(config, q, k, i, j, layer, head) - _paper_slope(
            config.num_attention_heads, head) * abs(i - j)

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        # built once per device, not on the CPU and copied every forward; a plain attribute rather than a
        # buffer, which from_pretrained would leave uninitialised (it holds no weights to load)
        self._slopes: dict[torch.device, Tensor] = {}

    def slopes(self, device: torch.device) -> Tensor:
        """m_h (H,) on `device`."""
        if device not in self._slopes:
            self._slopes[device] = alibi_slopes(self.num_heads).to(device)
        return self._slopes[device]

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        slopes = self.slopes(ctx.q_pos.device)  # (H,)

        def build():
            # consecutive positions: a Toeplitz matrix, never built whole unless a backend asks for it
            term = DistanceBias(alibi_bias, (slopes,), ctx.q_pos, ctx.k_pos, ctx.diagonal_offsets(),
                                ctx.runs())
            # kept between inference forwards with the kernel's table: a function of the positions and the
            # constant slopes
            return KeptTerm(self.keep(ctx, "alibi", (slopes,), term), keep=("offset_table",))

        return ctx.cached(Built(self), lambda: self.kept_forward(ctx, (slopes,), build)).terms
