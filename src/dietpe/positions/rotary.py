"""Rotary position embedding (Su et al. 2021, RoFormer eq. 34), beyond the papers: q_i and k_j are rotated
by angles i·θ and j·θ, so q_i·k_j depends on i - j only. Entry point: qk; angles computed once per forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from dietpe.attention.kernels import triton_problem
from dietpe.errors import ConfigError
from dietpe.positions.context import CacheKey, Context
from dietpe.positions.fields import Field, positive_float
from dietpe.positions.functional import apply_rotary, rotary_angles
from dietpe.positions.method import PositionMethod, Traits
from dietpe.positions.terms import LayerTerms

ROTARY_BASE = Field("rotary_base", 10000.0, positive_float, "θ_m = base^(-2m/d_h), RoFormer's 10000")


def rotate_reference(x: Tensor, pos: int, base: float) -> Tensor:
    """RoFormer eq. 34 for one (Dh,) vector, rotate-half layout, a loop over the pairs of dimensions."""
    d = x.shape[-1]
    out = x.clone()
    for m in range(d // 2):
        theta = pos * base ** (-2 * m / d)
        a, b = x[m], x[m + d // 2]
        out[m] = a * math.cos(theta) - b * math.sin(theta)
        out[m + d // 2] = b * math.cos(theta) + a * math.sin(theta)
    return out


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
        if q.is_cuda and not torch.compiler.is_compiling() and triton_problem() is None:
            # both in one Triton kernel, forward and backward (a compiled forward fuses apply_rotary itself)
            from dietpe.attention.kernels.rotary import rotary_qk
            return rotary_qk(q, k, *self.q_angles, *self.k_angles)
        return apply_rotary(q, *self.q_angles), apply_rotary(k, *self.k_angles)


class Rotary(PositionMethod):
    name = "rotary"
    traits = Traits(entry=("qk",), key_positions=True, relative=True, paper_row="rotary")
    fields = (ROTARY_BASE,)

    @classmethod
    def from_config(cls, c):
        return cls(c.head_size, c.rotary_base)

    @classmethod
    def check_config(cls, c) -> None:
        if c.head_size % 2:
            raise ConfigError(f"position='rotary' needs an even head size, got {c.head_size}")

    def reference_logit(self, config, q, k, i, j, layer, head):
        base = config.rotary_base
        return super().reference_logit(config, rotate_reference(q, i, base), rotate_reference(k, j, base), i, j,
                                       layer, head)

    def __init__(self, head_size: int, base: float):
        super().__init__()
        self.head_size, self.base = head_size, base

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        rotate = ctx.cached(RotaryAngles(self.head_size, self.base), lambda: Rotate(rotary_angles(ctx.q_pos, self.head_size, self.base),
                                                     rotary_angles(ctx.k_pos, self.head_size, self.base)))
        return LayerTerms(qk=[rotate])
