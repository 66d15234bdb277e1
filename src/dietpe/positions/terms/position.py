"""Position-only logit terms b_h(pos_i, pos_j): any function of the two positions (`PositionBias`), and the
per-head functions of the distance (`DistanceBias`: ALiBi, KERPLE).

A new method whose bias is a function of (query position, key position), a small network's included, builds
a `PositionBias` from that function and is served by every backend: eager and sdpa read its dense form or
blocks of its rows (each built from the positions of those rows only), flex a score_mod reading the dense
form, activation checkpointing rebuilds it in every recomputed layer.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from dietpe.positions.context import Runs
from dietpe.positions.functional import toeplitz
from dietpe.positions.terms.logit import LogitTerm, OffsetTable, ScoreMod, position_at, row_span


def dense_pair(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor, dense: Tensor) -> Tensor:
    """score_mod: dense[b, h, qi, ki] of a (1|B, H|1, Lq, Lk) dense form."""
    return dense[b if dense.shape[0] > 1 else 0, h if dense.shape[1] > 1 else 0, qi, ki]


def distance_pair(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor, f: Callable[..., Tensor], q_pos: Tensor,
                  k_pos: Tensor, *params: Tensor) -> Tensor:
    """score_mod: f(|pos_i - pos_j|, params[h]...), f a module-level elementwise function."""
    return f((position_at(q_pos, b, qi) - position_at(k_pos, b, ki)).abs(), *[p[h] for p in params])


class PositionBias(LogitTerm):
    """f(pos_i, pos_j): a position-only term from any function of the two positions.

    f: (q_pos (1|B, 1, rows, 1), k_pos (1|B, 1, 1, Lk)) integer positions -> bias (1|B, H|1, rows, Lk).
    q_pos, k_pos: (Lq,), (Lk,), or per example (B, Lq), (B, Lk); heads: H, or 1 when f gives one row for
    every head. The score_mod reads the dense form (built once per forward, shared by the layers that share
    the term) at (b, h, q_idx, kv_idx).
    """

    def __init__(self, f: Callable[[Tensor, Tensor], Tensor] | None, q_pos: Tensor, k_pos: Tensor, heads: int):
        super().__init__((q_pos.shape[-1], k_pos.shape[-1]), q_pos.shape[0] if q_pos.dim() == 2 else 1, heads)
        self.f, self.q_pos, self.k_pos = f, q_pos, k_pos

    def build(self, q: Tensor | None, rows: tuple[int, int] | None) -> Tensor:
        start, stop = row_span(rows, self.size[0])
        q_pos = self.q_pos[..., start:stop]
        return self.pairs(q_pos.view(-1, 1, q_pos.shape[-1], 1), self.k_pos.view(-1, 1, 1, self.size[1]))

    def pairs(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """f at these positions (a subclass may define the function here instead of passing f)."""
        return self.f(q_pos, k_pos)

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        return ScoreMod(dense_pair, (self.dense(q),))  # (1|B, H|1, Lq, Lk)


class DistanceBias(PositionBias):
    """f(|pos_i - pos_j|, params of head h): a per-head function of the distance. ALiBi (Press et al. 2022,
    -m_h · d), KERPLE (Chi et al. 2022, -r1_h · log(1 + r2_h · d)). `f(distance, *params)` is elementwise and
    broadcasts; params: (H,) tensors. q_pos, k_pos as in PositionBias; diagonals: optional (Lq + Lk - 1,)
    offsets i - j for consecutive positions: then a Toeplitz matrix of Lq + Lk - 1 values per head, never a
    gather. runs: the per-example positions' `Runs` (where there are no diagonals), along which
    `offset_table` reads f for the fused kernel. `score_mod` computes the function pair by pair (f module-level,
    so one kernel per f)."""

    def __init__(self, f: Callable[..., Tensor], params: tuple[Tensor, ...], q_pos: Tensor, k_pos: Tensor,
                 diagonals: Tensor | None = None, runs: Runs | None = None):
        # the function is `pairs` (a bound method stored on the term would be a reference cycle)
        super().__init__(None, q_pos, k_pos, params[0].shape[0])
        self.distance_f, self.params, self.diagonals, self.runs = f, params, diagonals, runs

    def pairs(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dist = (q_pos - k_pos).abs()  # (1|B, 1, rows, Lk)
        return self.distance_f(dist, *(p[:, None, None] for p in self.params))  # (1|B, H, rows, Lk)

    def build(self, q: Tensor | None, rows: tuple[int, int] | None) -> Tensor:
        if self.diagonals is None:
            return super().build(q, rows)
        lq, lk = self.size
        start, stop = row_span(rows, lq)
        dist = self.diagonals[start:stop + lk - 1].abs()  # (rows + Lk - 1,)
        per_diagonal = self.distance_f(dist, *(p[:, None] for p in self.params))  # (H, rows + Lk - 1)
        return toeplitz(per_diagonal, stop - start, lk).unsqueeze(0)  # (1, H, rows, Lk)

    def offset_table(self) -> OffsetTable | None:
        """f of each diagonal's distance (or along the runs'), per head: (H, Lq + Lk - 1); None without either."""
        if self.diagonals is None and self.runs is None:
            return None
        along = self.diagonals if self.diagonals is not None else self.runs.diagonals
        return self.per_forward("offset_table", lambda: OffsetTable(
            self.distance_f(along.abs(), *(p[:, None] for p in self.params)), runs=self.runs))

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        return ScoreMod(distance_pair, (self.distance_f, self.q_pos, self.k_pos, *self.params))
