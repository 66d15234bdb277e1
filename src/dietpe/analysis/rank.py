"""Numerical rank of attention matrices: DIET (Chen et al. 2021) Fig. 2 and 8, and Theorem 1.

Theorem 1: with positions added at the input, every head's logits A = (X+P) W_Q W_Kᵀ (X+P)ᵀ have
rank(A) ≤ d_h; with a per-head position term A = X W_Q W_Kᵀ Xᵀ + P_Q P_Kᵀ the rank can reach d_h + d_p.

The rank of a float matrix is the number of singular values above a tolerance, stated here once:

    rank(A) = #{ σ_i(A) > rtol · σ_max(A) },   rtol = max(M, N) · ε,   ε = 1.19e-7 (float32 machine epsilon)

which is numpy's `matrix_rank` default for float32 data: the logits are computed in float32, so singular
values below that are rounding noise. The SVD itself runs in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

FLOAT32_EPS = torch.finfo(torch.float32).eps


def default_rtol(rows: int, cols: int, eps: float = FLOAT32_EPS) -> float:
    """numpy's matrix_rank tolerance relative to σ_max: max(M, N) · ε."""
    return max(rows, cols) * eps


def singular_values(matrix: Tensor) -> Tensor:
    """(..., M, N) -> (..., min(M, N)) singular values in descending order, computed in float64."""
    return torch.linalg.svdvals(matrix.detach().to(torch.float64))


def numerical_rank(matrix: Tensor, rtol: float | None = None) -> Tensor:
    """(..., M, N) -> (...) integer ranks: singular values above rtol · σ_max (default rtol: `default_rtol`).

    An all-zero matrix has rank 0.
    """
    m, n = matrix.shape[-2:]
    rtol = default_rtol(m, n) if rtol is None else rtol
    s = singular_values(matrix)
    tol = s[..., :1] * rtol  # (..., 1): relative to each matrix's own σ_max
    return ((s > tol) & (s > 0)).sum(-1)
