"""Rotary position embedding (Su et al. 2021, RoFormer eq. 34), beyond the papers: q_i and k_j are rotated
by angles i·θ and j·θ, so q_i·k_j depends on i - j only. Entry point: qk; angles computed once per forward.
"""

from __future__ import annotations

from torch import Tensor

from dietpe.positions.base import Context, LayerTerms
from dietpe.positions.functional import apply_rotary, rotary_angles
from dietpe.positions.method import PositionMethod


class Rotate:
    """qk term: rotate queries by their positions' angles and keys by theirs."""

    def __init__(self, q_angles: tuple[Tensor, Tensor], k_angles: tuple[Tensor, Tensor]):
        self.q_angles, self.k_angles = q_angles, k_angles

    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return apply_rotary(q, *self.q_angles), apply_rotary(k, *self.k_angles)


class Rotary(PositionMethod):
    def __init__(self, head_size: int, base: float):
        super().__init__()
        self.head_size, self.base = head_size, base

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        rotate = ctx.cached("rotary", lambda: Rotate(rotary_angles(ctx.q_pos, self.head_size, self.base),
                                                     rotary_angles(ctx.k_pos, self.head_size, self.base)))
        return LayerTerms(qk=[rotate])
