"""KERPLE, logarithmic variant (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", NeurIPS 2022):

    A_ij = q_i·k_j / √d_h - r1_h · log(1 + r2_h · |i - j|),        r1_h, r2_h > 0 learned per head, per model

A conditionally positive definite kernel of the distance, shifted into the softmax; ALiBi is the linear
special case -r1·|i - j| with fixed slopes. The paper's decoder sees only j <= i, so |i - j| = i - j; in an
encoder the same function of |i - j| applies to both directions (as `alibi` does here). Positivity is kept as
in the authors' code: the parameters are clamped to r >= 0.01 where they are used, and initialised
uniformly, r1 in (0, 2), r2 in (0, 1). Entry point: logit bias, built once per forward and shared by layers
(the authors share it across layers too); a Toeplitz matrix for consecutive positions, a `score_mod` for
FlexAttention.
"""

from __future__ import annotations

from torch import Tensor
from transformers import initialization as hf_init

from diet.positions.base import Context, LayerTerms, LogitTerm, ScoreMod, position_at
from diet.positions.functional import kerple_log_bias, relative_offsets, toeplitz
from diet.positions.method import PositionMethod, normal_parameter

EPS = 0.01  # the authors' lower bound on r1, r2


class LogDistanceBias(LogitTerm):
    """-r1_h · log(1 + r2_h · |pos_i - pos_j|). r1, r2: (H,); q_pos, k_pos as in `TableBias`; diagonals: optional
    (Lq + Lk - 1,) offsets i - j for consecutive positions (then a Toeplitz matrix, never a gather)."""

    def __init__(self, r1: Tensor, r2: Tensor, q_pos: Tensor, k_pos: Tensor, diagonals: Tensor | None = None):
        self.r1, self.r2, self.q_pos, self.k_pos, self.diagonals = r1, r2, q_pos, k_pos, diagonals
        self.size = (q_pos.shape[-1], k_pos.shape[-1])
        self.batch = q_pos.shape[0] if q_pos.dim() == 2 else 1
        self._dense: Tensor | None = None

    def _rows(self, rows: slice) -> Tensor:
        lq, lk = self.size
        if self.diagonals is not None:
            start, stop, _ = rows.indices(lq)
            dist = self.diagonals[start:stop + lk - 1].abs()  # (rows + Lk - 1,)
            per_diagonal = kerple_log_bias(dist, self.r1[:, None], self.r2[:, None])  # (H, rows + Lk - 1)
            return toeplitz(per_diagonal, stop - start, lk).unsqueeze(0)  # (1, H, rows, Lk)
        dist = relative_offsets(self.q_pos[..., rows], self.k_pos).abs()  # (1|B, rows, Lk)
        dist = dist.view(-1, 1, *dist.shape[-2:])  # (1|B, 1, rows, Lk)
        return kerple_log_bias(dist, self.r1[:, None, None], self.r2[:, None, None])  # (1|B, H, rows, Lk)

    def dense(self, q: Tensor | None = None) -> Tensor:
        if not self.reuse:
            return self._rows(slice(None))
        if self._dense is None:
            self._dense = self._rows(slice(None))
        return self._dense

    def dense_block(self, q: Tensor | None, rows: slice) -> Tensor:
        return self._dense[..., rows, :] if self._dense is not None else self._rows(rows)

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        r1, r2, q_pos, k_pos = self.r1, self.r2, self.q_pos, self.k_pos
        return lambda b, h, qi, ki: kerple_log_bias(
            (position_at(q_pos, b, qi) - position_at(k_pos, b, ki)).abs(), r1[h], r2[h])


class Kerple(PositionMethod):
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
            return LogDistanceBias(r1, r2, ctx.q_pos, ctx.k_pos, ctx.diagonal_offsets())

        return LayerTerms(logits=[ctx.cached("kerple_term", build)])
