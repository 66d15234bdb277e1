"""Low-rank logit terms fq · fkᵀ, which sdpa and flex fold into extra query and key channels instead of
building (B, H, Lq, Lk): DIET-ABS's P_Q P_Kᵀ (DIET eq. 1), TUPE's positional correlation (TUPE eq. 10), DIET's
per-head segment table (DIET eq. 2, one-hot keys)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from dietpe.positions.terms.logit import LogitTerm, ScoreMod, SegmentTable, head_at


def segment_pair(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor, table: Tensor, q_segments: Tensor,
                 k_segments: Tensor) -> Tensor:
    """score_mod: Ŝ[h, S(i), S(j)] of a per-head k×k table (H|1, k, k)."""
    return table[head_at(table, h), q_segments[b, qi], k_segments[b, ki]]


class LowRankBias(LogitTerm):
    """fq · fkᵀ with fq (1|B, H|1, Lq, r), fk (1|B, H|1, Lk, r); `kept` as in `LogitTerm`."""

    def __init__(self, fq: Tensor, fk: Tensor, kept: Callable[[], Tensor] | None = None):
        super().__init__((fq.shape[-2], fk.shape[-2]), max(fq.shape[0], fk.shape[0]), max(fq.shape[1], fk.shape[1]))
        self.fq, self.fk = fq, fk
        self.kept = kept

    def build(self, q: Tensor | None, rows: tuple[int, int] | None) -> Tensor:
        fq, fk = self.factors()
        fq = fq if rows is None else fq[..., rows[0]:rows[1], :]
        return fq @ fk.transpose(-1, -2)

    def factors(self) -> tuple[Tensor, Tensor]:
        return self.fq, self.fk

    def has_factors(self) -> bool:
        return True

    @property
    def rank(self) -> int:
        """r, the factors' width."""
        return self.fq.shape[-1]


class ScaledLowRank(LowRankBias):
    """(c·fq)·(c·fk)ᵀ, with fq, fk a logit-unit table's rows as stored (views of its parameters) and c its
    logit_scale (DIET-ABS's P_Q P_Kᵀ). `factors` scales both sides, as the equation reads them; `folded` puts c²
    and the kernel's 1/s on the query side alone, so that the key side the fused kernel reads, and keeps for
    its backward, is the stored rows themselves: no copy the size of the table per forward (P_K at 8,192
    positions is as large as a layer's keys)."""

    def __init__(self, fq: Tensor, fk: Tensor, scale: float, kept: Callable[[], Tensor] | None = None):
        super().__init__(fq, fk, kept)
        self.scale = scale

    def factors(self) -> tuple[Tensor, Tensor]:
        if self.scale == 1:
            return self.fq, self.fk
        return self.per_forward("factors", lambda: (self.fq * self.scale, self.fk * self.scale))

    def folded(self, s: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        c = self.scale * self.scale / s
        return self.per_forward(f"folded {s} {dtype}", lambda: ((self.fq * c).to(dtype), self.fk.to(dtype)))


def one_hot_keys(segments: Tensor, k: int, dtype: torch.dtype) -> Tensor:
    """(B, 1, Lk, k) one-hot rows of the keys' segments, by comparison: `F.one_hot` reads the ids' range back to
    the host (two syncs on a GPU; the ids are checked once per forward where they may be read)."""
    return (segments[:, None, :, None] == torch.arange(k, device=segments.device)).to(dtype)


class SegmentBias(LowRankBias):
    """DIET eq. 2: Ŝ[h, S(i), S(j)], a k×k table per head read at the two tokens' segments. As a product
    Ŝ[S(i), :] · onehot(S(j))ᵀ it is low rank (folded by sdpa); FlexAttention reads the table directly.
    table: (H|1, k, k); q_segments (B, Lq), k_segments (B, Lk)."""

    kind = "segment"

    def __init__(self, table: Tensor, q_segments: Tensor, k_segments: Tensor,
                 key_one_hot: Callable[[], Tensor] | None = None):
        LogitTerm.__init__(self, (q_segments.shape[-1], k_segments.shape[-1]),
                           max(q_segments.shape[0], k_segments.shape[0]), table.shape[0])
        self.kept = None
        self.table, self.q_segments, self.k_segments = table, q_segments, k_segments
        # onehot(S(j)) (B, 1, Lk, k), which every layer's term shares: the caller's, built once per forward
        self.key_one_hot = key_one_hot if key_one_hot is not None else (
            lambda: one_hot_keys(k_segments, table.shape[-1], table.dtype))
        self._factors = None

    def factors(self) -> tuple[Tensor, Tensor]:
        """(fq (B, H|1, Lq, k): row S(i) of Ŝ; fk (B, 1, Lk, k): one-hot S(j)), built when first read (the fused
        kernel reads the table instead: four launches a layer saved) and kept while `reuse` is on; off (a
        checkpointed layer), each read builds them, so a recomputed layer saves what its first pass saved."""
        if self._factors is not None:
            return self._factors
        fq = self.table[:, self.q_segments].transpose(0, 1)
        fk = self.key_one_hot()
        if self.reuse:
            self._factors = fq, fk
        return fq, fk

    @property
    def rank(self) -> int:
        return self.table.shape[-1]

    def renew(self, keep: tuple[str, ...] = (), ids: tuple[Tensor, Tensor] | None = None,
              key_one_hot: Callable[[], Tensor] | None = None) -> None:
        """`LogitTerm.renew`, with a forward's segment ids (q, k) and its keys' one-hot (None: none until the
        next renew)."""
        super().renew(keep)
        self._factors, self.key_one_hot = None, key_one_hot
        self.q_segments, self.k_segments = ids if ids is not None else (None, None)
        if ids is not None:
            self.batch = max(ids[0].shape[0], ids[1].shape[0])

    def segment_table(self) -> SegmentTable:
        return SegmentTable(self.table, self.q_segments, self.k_segments)

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        return ScoreMod(segment_pair, (self.table, self.q_segments, self.k_segments))
