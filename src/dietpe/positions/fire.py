"""FIRE: Functional Interpolation for Relative Positions (Li et al. 2023, "Functional Interpolation for Relative
Positions Improves Long Context Transformers", eq. 4-6):

    A_ij = q_i·k_j / √d_h + f_θ( ψ(i - j) / ψ(max(L, i)) )_h,        ψ(x) = log(c·x + 1)

f_θ an MLP 1 -> width -> H (ReLU), one output per head, shared by all layers; c > 0 and the threshold L are
learned (L as a multiplier of its initial value, as in the authors' code, where ψ reads |c·x| and |L|); L starts at
a quarter of the longest position the model is built for (the authors' 512 for their 2048-token training), so
the normaliser, and with it the absolute position, matters inside the training length.
Normalising by the query's position ("progressive interpolation") maps every offset into [0, 1], so a longer
input asks f for no value outside what it was trained on. The paper's decoder sees i >= j; in an encoder the
same function of |i - j| serves both directions (as `alibi` and `kerple` do here). Not shift-invariant: the
normaliser reads the query's position. Initialisation as the authors': c = 0.1, L = `fire_threshold`,
PyTorch's default uniform for the MLP. Entry point: logit bias, a `PositionBias` built once per forward and
shared by layers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from transformers import initialization as hf_init

from dietpe.positions.context import Built, Context, Runs
from dietpe.positions.fields import Field, positive_float, positive_int
from dietpe.positions.method import PositionMethod, Traits
from dietpe.positions.terms import LayerTerms, PiecewiseTable, PositionBias, ScoreMod, position_at

FIRE_WIDTH = Field("fire_width", 32, positive_int, "hidden units of FIRE's MLP f_θ")


def _optional_positive(name: str, value) -> None:
    if value is not None:
        positive_float(name, value)


FIRE_THRESHOLD = Field("fire_threshold", None, _optional_positive,
                       "initial L of ψ(max(L, i)), learned as L·s (None: max_position_embeddings / 4)")
EPS = 1e-6  # the authors' guard on the normaliser
C_INIT = 0.1  # the authors' initial c


def fire_pair(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor, q_pos: Tensor, k_pos: Tensor, c: Tensor, limit: Tensor,
              slope: Tensor, intercept: Tensor, kinks: Tensor) -> Tensor:
    """score_mod: f_θ(x)_h = slope[piece, h] · x + intercept[piece, h], x = ψ(|i - j|) / ψ(max(L, i)), piece the
    number of kinks below x (`Fire.pieces`; torch.bucketize's count, unrolled into comparisons). Each tensor
    that requires grad is read by one index, the form of the flex backward's gradients of captured tensors
    (it allows no second): c and L as (1,) tensors read at 0."""
    c, limit = c[0], limit[0]
    i, j = position_at(q_pos, b, qi).to(slope.dtype), position_at(k_pos, b, ki).to(slope.dtype)
    x = torch.log1p(c * (i - j).abs()) / (torch.log1p(c * torch.maximum(i, limit)) + EPS)
    piece = (kinks[0] < x).long()
    for u in range(1, kinks.shape[0]):
        piece = piece + (kinks[u] < x).long()
    return slope[piece, h] * x + intercept[piece, h]


class FireBias(PositionBias):
    """FIRE's term: the dense form from `Fire.bias`; for FlexAttention the same piecewise-linear f_θ pair by
    pair (pointwise operations only), so flex never builds a query-key tensor; for the fused kernel, over
    consecutive positions (`diagonals`, the offsets i - j), ψ(|i - j|) per offset and ψ(max(L, i)) per query
    with f_θ's pieces (`PiecewiseTable`), evaluated in its tile; with per-example positions, along their `runs`
    and ψ(max(L, i)) per example."""

    def __init__(self, fire: "Fire", q_pos: Tensor, k_pos: Tensor, diagonals: Tensor | None = None,
                 runs: Runs | None = None):
        super().__init__(fire.bias, q_pos, k_pos, fire.w2.shape[0])
        self.fire, self.diagonals, self.runs = fire, diagonals, runs

    def piecewise_table(self) -> PiecewiseTable | None:
        if self.diagonals is None and self.runs is None:
            return None

        def build():
            fire = self.fire
            c, dtype = fire.c.abs(), fire.w1.dtype
            along = self.diagonals if self.diagonals is not None else self.runs.diagonals
            numerator = torch.log1p(c * along.abs().to(dtype))  # (Lq + Lk - 1,)
            den = torch.log1p(c * torch.maximum(self.q_pos.to(dtype), fire.limit())) + EPS  # (Lq,) or (B, Lq)
            slope, intercept, kinks = fire.pieces()
            # float32, as the kernel reads them (autocast's matmul gives bf16): cast once a forward, not per layer
            return PiecewiseTable(numerator, den, kinks, slope.float(), intercept.float(), self.runs)

        return self.per_forward("piecewise_table", build)

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        fire = self.fire
        slope, intercept, kinks = fire.pieces()
        return ScoreMod(fire_pair, (self.q_pos, self.k_pos, fire.c.abs().reshape(1), fire.limit().reshape(1), slope,
                                    intercept, kinks))


class Fire(PositionMethod):
    name = "fire"
    traits = Traits(entry=("logits",), key_positions=True, tile_terms=True)
    fields = (FIRE_WIDTH, FIRE_THRESHOLD)
    profile_name = "FIRE bias"

    @classmethod
    def from_config(cls, c):
        threshold = c.fire_threshold if c.fire_threshold is not None else c.max_position_embeddings / 4
        return cls(c.num_attention_heads, c.fire_width, threshold)

    def __init__(self, num_heads: int, width: int, threshold: float):
        super().__init__()
        self.threshold = threshold
        self.w1, self.b1 = nn.Parameter(torch.empty(width)), nn.Parameter(torch.empty(width))  # 1 -> width
        self.w2, self.b2 = nn.Parameter(torch.empty(num_heads, width)), nn.Parameter(torch.empty(num_heads))
        self.c = nn.Parameter(torch.empty(()))
        self.threshold_scale = nn.Parameter(torch.empty(()))  # L = threshold_scale · threshold

    def reset_parameters(self, std: float) -> None:
        # the authors' init: nn.Linear's default U(±1/√fan_in), c = 0.1, L at its initial value
        width = self.w1.shape[0]
        hf_init.uniform_(self.w1, -1.0, 1.0)
        hf_init.uniform_(self.b1, -1.0, 1.0)
        hf_init.uniform_(self.w2, -1 / math.sqrt(width), 1 / math.sqrt(width))
        hf_init.uniform_(self.b2, -1 / math.sqrt(width), 1 / math.sqrt(width))
        hf_init.constant_(self.c, C_INIT)
        hf_init.constant_(self.threshold_scale, 1.0)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """f_θ(ψ(|i - j|) / ψ(max(L, i))): q_pos (1|B, 1, Lq, 1), k_pos (1|B, 1, 1, Lk) -> (1|B, H, Lq, Lk).

        f_θ of a scalar is piecewise linear (a ReLU layer): between the sorted kinks -b1_u / w1_u it is
        slope_s·x + intercept_s, with the units active there. So each pair reads its piece's two numbers
        per head instead of an (Lq, Lk, width) hidden layer kept for the backward; the gradients are the
        ReLU's, almost everywhere."""
        c, dtype = self.c.abs(), self.w1.dtype
        i, j = q_pos.to(dtype), k_pos.to(dtype)
        limit = self.limit()
        x = torch.log1p(c * (i - j).abs()) / (torch.log1p(c * torch.maximum(i, limit)) + EPS)  # (1|B,1,Lq,Lk)
        slope, intercept, kinks = self.pieces()
        x = x.squeeze(1)  # (1|B, Lq, Lk)
        piece = torch.bucketize(x.detach(), kinks)  # (1|B, Lq, Lk)
        return (slope[piece] * x.unsqueeze(-1) + intercept[piece]).movedim(-1, 1)  # (1|B, H, Lq, Lk)

    def limit(self) -> Tensor:
        """L, learned as threshold_scale · threshold (0-dim)."""
        return (self.threshold_scale * self.threshold).abs()

    def pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """(slope (width+1, H), intercept (width+1, H), sorted kinks (width,)) of f_θ's linear pieces."""
        w1, b1 = self.w1, self.b1
        flat = w1.detach() == 0  # a unit with no slope never switches: its kink is at infinity
        kinks = torch.where(flat, torch.inf, -b1.detach() / torch.where(flat, 1.0, w1.detach())).sort().values
        # one point inside each piece (static shapes, for torch.compile): infinite kinks stand at `span`,
        # beyond every finite one, and never bound a piece that a finite x falls in
        finite = kinks.isfinite()
        span = torch.where(finite, kinks.abs(), 0).amax() + 1
        at = torch.where(finite, kinks, span)
        points = torch.cat([at[:1] - span, (at[:-1] + at[1:]) / 2, at[-1:] + span])  # (width + 1,)
        active = ((points[:, None] * w1.detach() + b1.detach()) > 0).to(w1.dtype)  # (pieces, width)
        return (active * w1) @ self.w2.T, ((active * b1) @ self.w2.T + self.b2), kinks

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        def build():
            term = FireBias(self, ctx.q_pos, ctx.k_pos, ctx.diagonal_offsets(), ctx.runs())
            return self.keep(ctx, "fire", tuple(self.parameters(recurse=False)), term)

        return LayerTerms(logits=[ctx.cached(Built(self), build)])

    def reference_logit(self, config, q, k, i, j, layer, head):
        # eq. 4-6 for one pair, scalar by scalar
        c = abs(float(self.c))
        limit = abs(float(self.threshold_scale) * self.threshold)
        x = math.log(c * abs(i - j) + 1) / (math.log(c * max(i, limit) + 1) + EPS)
        out = float(self.b2[head])
        for u in range(config.fire_width):
            out += float(self.w2[head, u]) * max(0.0, x * float(self.w1[u]) + float(self.b1[u]))
        return super().reference_logit(config, q, k, i, j, layer, head) + out
