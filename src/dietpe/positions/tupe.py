"""TUPE: untied positional encoding (Ke et al. 2021, eq. 10 and 11, appendix B).

    TUPE-A  A_ij = (x_i W_Q)(x_j W_K)ᵀ / √(2d) + reset_θ( (p_i U_Q)(p_j U_K)ᵀ / √(2d), i, j )
    TUPE-R  A_ij = (x_i W_Q)(x_j W_K)ᵀ / √(2d) + reset_θ( (p_i U_Q)(p_j U_K)ᵀ / √(2d) + b_{j-i}, i, j )

p_i is a learned absolute embedding with layer norm applied whenever it is used; U_Q, U_K (D×D, split into
heads) are shared by all layers, so the positional correlation is computed once per forward. reset_θ
(eq. 9) replaces row 0 (from [CLS]) by θ_1 and column 0 (to [CLS]) by θ_2, per head, with
θ_k = (p_θk U_Q)(p_θk U_K)ᵀ / √(2d) (appendix B). b is T5's bucketed bias, per head, shared by layers.
In TUPE-R the reset also replaces b on [CLS]'s row and column by two learned buckets per head, b_[CLS]→ and
b_→[CLS], which add to θ_1 and θ_2: the form of the authors' released code (its `rp_bucket[0, :]` and
`rp_bucket[:, 0]`), where eq. 11 leaves it open. In the multi-head form d is the head size.
b and the [CLS] buckets are stored over `logit_scale` (dietpe.positions.method).
`tupe_reset=False` gives TUPE-A^tie-cls (and TUPE-R with b_{j-i} everywhere).
Entry points: logit bias (the absolute part is low rank, with the reset as two extra rank-1 columns, so it
can be folded into queries and keys; the fused kernel reads the reset as a 2 × 2 table per head instead:
`ResetCorrelation`), and score scale (1/√2 on the content term).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from dietpe.positions.context import Built, Context
from dietpe.positions.fields import Field, boolean
from dietpe.positions.method import PositionMethod, Traits, causal, normal_parameter
from dietpe.positions.t5 import (
    T5_MAX_DISTANCE,
    T5_NUM_BUCKETS,
    check_t5_buckets,
    t5_bucket_reference,
    t5_diagonals,
    t5_index,
    t5_offset_bucket,
    t5_range,
)
from dietpe.positions.terms import LayerTerms, LogitTerm, LowRankBias, SegmentBias, SeparableKeep, TableBias

# in a causal LM position 0 is an ordinary token, not [CLS]
TUPE_RESET = Field("tupe_reset", True, boolean, "reset_θ on position 0 ([CLS]); false: TUPE^tie-cls",
                   causal_default=False)


def _not_cls(pos: Tensor) -> Tensor:
    return pos != 0


#: whether neither position is [CLS]'s 0: where TUPE-R's relative buckets apply. One object for every model,
#: so FlexAttention's kernel for it is one; separable, so the fused kernel reads it as two vectors
off_cls = SeparableKeep(_not_cls, _not_cls)


class ResetCorrelation(LowRankBias):
    """reset_θ((p_i U_Q)(p_j U_K)ᵀ / √(2d)) as fq·fkᵀ (the correlation's factors fq, fk, zero at [CLS]) plus the
    reset: θ_1 on [CLS]'s row, θ_2 on its column elsewhere. Its factors (rank d + 2, for sdpa and flex) append
    the reset as two columns; its `parts`, for the fused kernel, are the rank-d product (read from its own
    tensors as the head's second part, a power of two wide: no copy of q and k per layer) and the reset as a
    2 × 2 table per head read at [CLS]'s 0/1 ids, Ŝ[h, [i = 0], [j = 0]] = ((0, θ_2), (θ_1, θ_1)).
    theta (H, 2); q_cls (1|B, 1, Lq), k_cls (1|B, 1, Lk): 1 at position 0."""

    def __init__(self, fq: Tensor, fk: Tensor, theta: Tensor, q_cls: Tensor, k_cls: Tensor):
        super().__init__(fq, fk)
        self.theta, self.q_cls, self.k_cls = theta, q_cls, k_cls

    def factors(self) -> tuple[Tensor, Tensor]:
        return self.per_forward("factors", self._factors)

    def _factors(self) -> tuple[Tensor, Tensor]:
        fq, fk, theta, q_cls, k_cls = self.fq, self.fk, self.theta, self.q_cls, self.k_cls
        # row i = 0 gets θ_1 against every key; rows i != 0 get θ_2 against key 0
        col_q = torch.stack((theta[:, :1] * q_cls, theta[:, 1:] * (1 - q_cls)), dim=-1)  # (1|B, H, Lq, 2)
        col_k = torch.stack((torch.ones_like(k_cls), k_cls), dim=-1).expand(-1, fk.shape[1], -1, -1)
        return torch.cat((fq, col_q), -1), torch.cat((fk, col_k), -1)

    @property
    def rank(self) -> int:
        return self.fq.shape[-1] + 2

    def parts(self) -> list[LogitTerm]:
        return self.per_forward("parts", self._parts)

    def _parts(self) -> list[LogitTerm]:
        theta = self.theta
        zero = theta.new_zeros(theta.shape[0])
        # float32, as the kernel reads it: cast once a forward, not per layer
        table = torch.stack((zero, theta[:, 1], theta[:, 0], theta[:, 0]), -1).view(-1, 2, 2).float()
        ids = [x.squeeze(1).to(torch.int32) for x in (self.q_cls, self.k_cls)]  # (1|B, L): 1 at [CLS]
        return [LowRankBias(self.fq, self.fk), SegmentBias(table, *ids)]


class TUPE(PositionMethod):
    # TUPE-R's relative buckets and [CLS] buckets; its table p and projections U_Q, U_K are in embedding units
    logit_parameters = ("bias", "cls_bias")
    #: TUPE-R: T5's relative buckets b_{j-i} besides the absolute correlation
    buckets: bool = False
    table_name = "TUPE's positional embeddings LN(p_i)"

    @classmethod
    def from_config(cls, c):
        return cls(c.hidden_size, c.num_attention_heads, c.max_position_embeddings, c.layer_norm_eps,
                   c.tupe_reset, cls.buckets, c.t5_num_buckets, t5_range(c), causal(c))

    def reference_logit(self, config, q, k, i, j, layer, head):
        dh = q.shape[-1]
        s2 = 1 / math.sqrt(2 * dh)
        proj = lambda u, x: u(self.norm(x)).view(-1, dh)[head]  # noqa: E731  (p U) of one head
        corr = lambda a, b: proj(self.u_q, a) @ proj(self.u_k, b) * s2  # noqa: E731
        v = corr(self.p[i], self.p[j])
        if self.relative:
            v = v + self.logit("bias")[head, t5_bucket_reference(j - i, config)]
        # the reset: θ, plus TUPE-R's learned [CLS] buckets (the authors' code)
        cls_b = self.logit("cls_bias")[head] if self.relative and config.tupe_reset else (0, 0)
        if config.tupe_reset and i == 0:
            v = corr(self.p_theta[0], self.p_theta[0]) + cls_b[0]
        elif config.tupe_reset and j == 0:
            v = corr(self.p_theta[1], self.p_theta[1]) + cls_b[1]
        return q @ k * s2 + v

    def __init__(self, hidden_size: int, num_heads: int, max_length: int, eps: float, reset: bool,
                 relative: bool, num_buckets: int, max_distance: int, causal: bool = False):
        super().__init__()
        self.max_length, self.num_heads, self.reset, self.relative = max_length, num_heads, reset, relative
        self.causal = causal  # T5's unidirectional buckets in causal self-attention
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.head_size = hidden_size // num_heads
        self.p = normal_parameter(max_length, hidden_size)  # p_i
        if reset:  # p_θ1, p_θ2 (without the reset, a parameter no loss reaches: DDP refuses it)
            self.p_theta = normal_parameter(2, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.u_q = nn.Linear(hidden_size, hidden_size)
        self.u_k = nn.Linear(hidden_size, hidden_size)
        if relative:
            self.bias = normal_parameter(num_heads, num_buckets)
            if reset:  # [CLS]-to-others and others-to-[CLS] buckets, added to θ_1, θ_2
                self.cls_bias = normal_parameter(num_heads, 2)

    def _heads(self, normed: Tensor, proj: nn.Linear) -> Tensor:
        # (1|B, n, D) -> (1|B, H, n, Dh)
        return proj(normed).unflatten(-1, (self.num_heads, self.head_size)).transpose(-2, -3)

    def _normed(self, pos: Tensor, start: int | None) -> Tensor:
        """LN(p) at positions (1|B, L): rows of a slice when the positions are known to be start, start + 1, ...
        (its gradient is a slice, not a scatter-add)."""
        return self.norm(self.p[pos] if start is None else self.p[start:start + pos.shape[-1]].unsqueeze(0))

    def correlation_factors(self, q_pos: Tensor, k_pos: Tensor,
                            starts: tuple[int | None, int | None] = (None, None)) -> tuple[Tensor, Tensor]:
        """(fq, fk), (1|B, H, Lq, r), (1|B, H, Lk, r): fq fkᵀ = reset_θ((p_i U_Q)(p_j U_K)ᵀ / √(2d)).
        Positions (L,) or per example (B, L); the reset applies where the position is 0 ([CLS]'s). starts:
        (q0, k0) where the positions are known to be the runs q0, q0 + 1, ... and k0, ... (`Context`)."""
        return self.correlation(q_pos, k_pos, starts).factors()

    def correlation(self, q_pos: Tensor, k_pos: Tensor,
                    starts: tuple[int | None, int | None] = (None, None)) -> LowRankBias:
        """The term reset_θ((p_i U_Q)(p_j U_K)ᵀ / √(2d)): `ResetCorrelation` with the reset, else the product."""
        scale = 1.0 / math.sqrt(2 * self.head_size)
        q_pos, k_pos = q_pos.view(-1, q_pos.shape[-1]), k_pos.view(-1, k_pos.shape[-1])  # (1|B, L)
        normed_q = self._normed(q_pos, starts[0])
        same = starts[0] is not None and starts[0] == starts[1] and q_pos.shape == k_pos.shape
        normed_k = normed_q if same else self._normed(k_pos, starts[1])  # self-attention: LN(p) once
        fq = self._heads(normed_q, self.u_q) * scale  # (1|B, H, Lq, Dh)
        fk = self._heads(normed_k, self.u_k)  # (1|B, H, Lk, Dh)
        if not self.reset:
            return LowRankBias(fq, fk)
        theta_p = self.norm(self.p_theta)
        tq, tk = self._heads(theta_p, self.u_q), self._heads(theta_p, self.u_k)  # (H, 2, Dh)
        theta = (tq * tk).sum(-1) * scale  # (H, 2): θ_1, θ_2
        if self.relative:
            theta = theta + self.logit("cls_bias")
        q_cls = (q_pos == 0).to(fq.dtype)[:, None, :]  # (1|B, 1, Lq)
        k_cls = (k_pos == 0).to(fk.dtype)[:, None, :]  # (1|B, 1, Lk)
        # the correlation no longer touches [CLS]
        return ResetCorrelation(fq * (1 - q_cls[..., None]), fk * (1 - k_cls[..., None]), theta, q_cls, k_cls)

    def position_table(self, length: int) -> Tensor:
        """LN(p_i): TUPE's positional embeddings as its attention uses them."""
        return self.norm(self.p[:length])

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        def correlation() -> tuple[LowRankBias, Tensor]:
            term = self.correlation(ctx.q_pos, ctx.k_pos, (ctx.q_start, ctx.k_start))
            fq, fk = term.factors()
            return term, fq @ fk.transpose(-1, -2)

        def build():
            # factors and product kept between inference forwards (DIET §3.1's cache; TUPE's term is also
            # position-only), else built once per forward
            kept = self.kept(ctx, "tupe", tuple(self.parameters()), self.num_heads * ctx.q_pos.shape[-1]
                             * ctx.k_pos.shape[-1], correlation)
            if kept is None:
                terms = [self.correlation(ctx.q_pos, ctx.k_pos, (ctx.q_start, ctx.k_start))]
            else:
                term, product = kept()
                term.kept = lambda: product
                terms = [term]
            if self.relative:
                # on [CLS]'s row and column b_{j-i} gives way to the [CLS] buckets in θ
                keep = off_cls if self.reset else None
                n, dist, causal = self.num_buckets, self.max_distance, self.causal
                terms.append(self.keep(ctx, "tupe_r", (self.bias,), TableBias(
                    self.logit("bias"), ctx.q_pos, ctx.k_pos, t5_offset_bucket(n, dist, causal),
                    lambda: t5_index(ctx, n, dist, causal), keep, t5_diagonals(ctx, n, dist, causal), reach=dist,
                    runs=ctx.runs())))
            return LayerTerms(logits=terms, score_scale=1.0 / math.sqrt(2))

        return ctx.cached(Built(self), build)  # shared by all layers: computed once per forward


class TupeA(TUPE):
    name = "tupe-a"
    traits = Traits(entry=("logits",), learned_table=True, key_positions=True, paper_row="tupe-a", cls_reset=True,
                    tile_terms=True)
    fields = (TUPE_RESET,)
    logit_parameters = ()  # no buckets: p, U_Q, U_K are in embedding units


class TupeR(TUPE):
    name = "tupe-r"
    traits = Traits(entry=("logits",), learned_table=True, key_positions=True, paper_row="tupe-r", cls_reset=True,
                    tile_terms=True)
    fields = (TUPE_RESET, T5_NUM_BUCKETS, T5_MAX_DISTANCE)  # T5's buckets, declared in t5.py
    buckets = True

    @classmethod
    def check_config(cls, c) -> None:
        check_t5_buckets(c)
