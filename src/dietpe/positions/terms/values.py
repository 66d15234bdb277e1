"""Value terms, added to the attention output: Σ_j p_ij · a_{bucket(pos_i - pos_j)} (Shaw et al. 2018, eq. 3,
relative value vectors)."""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from dietpe.positions.functional import OneHot, relative_scatter
from dietpe.positions.terms.logit import Band
from dietpe.positions.terms.relative import LazyIndex


class ValueTerm(LazyIndex):
    """probs (B, H, Lq, Lk) -> Σ_j p_ij · a_{index[i, j]} (B, H, Lq, Dh): Shaw et al.'s relative value vectors,
    a: (M, Dh), shared by heads; index (Lq, Lk) or per-example (B, Lq, Lk), a tensor or a function (built when
    first read); band and onehot as in QueryRelativeBias."""

    def __init__(self, a: Tensor, index: Tensor | Callable[[], Tensor], band: Band | None = None,
                 onehot: Callable[[], OneHot | None] | None = None):
        self.a, self._index, self.band, self._onehot = a, index, band, onehot

    def __call__(self, probs: Tensor) -> Tensor:
        per_offset = relative_scatter(probs, self.index, self.a.shape[0], self.onehot)  # (B, H, Lq, M)
        return per_offset @ self.a.to(probs.dtype)  # (B, H, Lq, Dh)
