"""KERPLE, logarithmic variant (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", NeurIPS 2022):

    A_ij = q_i·k_j / √d_h - r1_h · log(1 + r2_h · |i - j|),        r1_h, r2_h > 0 learned per head, per model

A conditionally positive definite kernel of the distance, shifted into the softmax; ALiBi is the linear
special case -r1·|i - j| with fixed slopes. The paper's decoder sees only j <= i, so |i - j| = i - j; in an
encoder the same function of |i - j| applies to both directions (as `alibi` does here). Positivity: the
parameters are clamped to r >= 0.01 where they are used (the values the authors' code uses), and initialised
uniformly, r1 in (0, 2), r2 in (0, 1). Unlike the authors' code, which projects the stored value in place
each forward (`.data.clamp_`), a value below 0.01 then gets no gradient: an in-place write inside the
forward would break activation checkpointing's recomputation. Entry point: logit bias, built once per
forward and shared by layers (the authors share it across layers too); a Toeplitz matrix for consecutive
positions, a `score_mod` for FlexAttention.
"""

from __future__ import annotations

import math

import torch
from transformers import initialization as hf_init

from dietpe.positions.context import Built, Context
from dietpe.positions.functional import kerple_log_bias
from dietpe.positions.method import KeptTerm, PositionMethod, Traits, normal_parameter
from dietpe.positions.terms import DistanceBias, LayerTerms

EPS = 0.01  # the authors' lower bound on r1, r2


class Kerple(PositionMethod):
    name = "kerple"
    traits = Traits(entry=("logits",), key_positions=True, relative=True, tile_terms=True)

    @classmethod
    def from_config(cls, c):
        return cls(c.num_attention_heads)

    def reference_logit(self, config, q, k, i, j, layer, head):
        # -r1 log(1 + r2 |i - j|), r clamped to >= 0.01 as in the authors' code
        r1, r2 = max(float(self.r1[head]), 0.01), max(float(self.r2[head]), 0.01)
        return super().reference_logit(config, q, k, i, j, layer, head) - r1 * math.log(1 + r2 * abs(i - j))

    def __init__(self, num_heads: int):
        super().__init__()
        self.r1 = normal_parameter(num_heads)  # r1_h, the kernel's scale
        self.r2 = normal_parameter(num_heads)  # r2_h, inside the log

    def reset_parameters(self, std: float) -> None:
        # the authors' initialisation (HF's helpers skip tensors already loaded from a checkpoint)
        hf_init.uniform_(self.r1, 0.0, 2.0)
        hf_init.uniform_(self.r2, 0.0, 1.0)

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        def build():
            r1, r2 = self.r1.clamp(min=EPS), self.r2.clamp(min=EPS)  # (H,) each, positive
            term = DistanceBias(kerple_log_bias, (r1, r2), ctx.q_pos, ctx.k_pos, ctx.diagonal_offsets(),
                                ctx.runs())
            p1, p2 = self.r1, self.r2  # not the module, which keeps the refill: no cycle

            def refill():  # a later inference forward: the clamped copies read afresh
                torch.clamp(p1, min=EPS, out=r1)
                torch.clamp(p2, min=EPS, out=r2)

            return KeptTerm(self.keep(ctx, "kerple", (self.r1, self.r2), term), refill)

        return ctx.cached(Built(self), lambda: self.kept_forward(ctx, (self.r1, self.r2), build)).terms
