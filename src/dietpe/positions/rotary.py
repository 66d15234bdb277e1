"""Rotary position embedding (Su et al. 2021, RoFormer eq. 34), beyond the papers: q_i and k_j are rotated
by angles i·θ and j·θ, so q_i·k_j depends on i - j only. Entry point: qk; angles computed once per forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dietpe.positions.context import CacheKey, Context
from dietpe.positions.functional import apply_rotary, rotary_angles
from dietpe.positions.method import PositionMethod
from dietpe.positions.terms import LayerTerms


@dataclass(frozen=True)
class RotaryAngles(CacheKey):
    """The `Rotate` qk term of the context's positions for head size `head_size` and base `base`."""

    head_size: int
    base: float


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
        rotate = ctx.cached(RotaryAngles(self.head_size, self.base), lambda: Rotate(rotary_angles(ctx.q_pos, self.head_size, self.base),
                                                     rotary_angles(ctx.k_pos, self.head_size, self.base)))
        return LayerTerms(qk=[rotate])
