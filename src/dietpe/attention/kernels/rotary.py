"""Rotary position embedding of queries and keys in one Triton kernel, forward and backward (RoFormer, Su et al.
2021, eq. 34, in the rotate-half layout of GPT-NeoX and HF Llama):

    x'[:d/2] = x[:d/2] · cos θ - x[d/2:] · sin θ,        x'[d/2:] = x[d/2:] · cos θ + x[:d/2] · sin θ

θ = pos · base^(-2m/d). The backward is the rotation by -θ, the same kernel with sin negated. One launch
rotates q's rows and k's rows (programs past q's blocks take k's), so rotary costs one read and one write of q
and k per direction, as a fused RoPE does elsewhere (Liger Kernel's `rope`). Arithmetic in float32, stored in
the input's dtype. The reference is `dietpe.positions.functional.apply_rotary`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dietpe.attention.kernels import interpreting
from dietpe.attention.kernels.launch import cdiv, launch as launch_kernel

#: elements of each half a program rotates (rows × Dh/2): 16 per thread at 4 warps, enough per program for the
#: memory system to stream (a program of 16 rows of 32 moved 4 values per thread)
ELEMENTS = 2048
#: rows of (B·H·L, Dh) per program at the smallest head size (Dh = 32 and below); tests and `resources` use it
ROWS = 64


def rows_per_program(half: int) -> int:
    return max(16, min(ROWS, ELEMENTS // half))


@triton.jit
def _rotate_rows(X, Y, COS, SIN, first, n_rows, H, L, sxb, sxh, sxl, scb, scl, half, sign,
                 ROWS: tl.constexpr, HALF: tl.constexpr):
    r = first + tl.arange(0, ROWS)
    bh = r // L
    pos = r % L
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    m = tl.arange(0, HALF)
    ok = (r[:, None] < n_rows) & (m[None, :] < half)
    x_at = X + b[:, None] * sxb + h[:, None] * sxh + pos[:, None] * sxl + m[None, :]
    c_at = b[:, None] * scb + pos[:, None] * scl + m[None, :]
    x1 = tl.load(x_at, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_at + half, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(COS + c_at, mask=ok, other=0.0)
    s = tl.load(SIN + c_at, mask=ok, other=0.0) * sign
    y_at = Y + r[:, None].to(tl.int64) * (2 * half) + m[None, :]  # Y: contiguous (B, H, L, Dh)
    tl.store(y_at, (x1 * c - x2 * s).to(Y.dtype.element_ty), mask=ok)
    tl.store(y_at + half, (x2 * c + x1 * s).to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _rotary_kernel(Q, K, QO, KO, CQ, SQ, CK, SK, H, LQ, LK, nq_rows, nk_rows, sqb, sqh, sql, skb, skh, skl,
                   scqb, scql, sckb, sckl, half, sign, ROWS: tl.constexpr, HALF: tl.constexpr):
    pid = tl.program_id(0)
    q_blocks = tl.cdiv(nq_rows, ROWS)
    if pid < q_blocks:
        _rotate_rows(Q, QO, CQ, SQ, pid * ROWS, nq_rows, H, LQ, sqb, sqh, sql, scqb, scql, half, sign, ROWS, HALF)
    else:
        _rotate_rows(K, KO, CK, SK, (pid - q_blocks) * ROWS, nk_rows, H, LK, skb, skh, skl, sckb, sckl, half,
                     sign, ROWS, HALF)


def _angle_strides(cos: Tensor) -> tuple[int, int]:
    """(per-example stride, per-position stride) of an (L, Dh) or (B, 1, L, Dh) angle table."""
    if cos.dim() == 2:
        return 0, cos.stride(0)
    return (cos.stride(0) if cos.shape[0] > 1 else 0), cos.stride(2)


def rotate(q: Tensor, k: Tensor, q_angles: tuple[Tensor, Tensor], k_angles: tuple[Tensor, Tensor],
           sign: float = 1.0) -> tuple[Tensor, Tensor]:
    """q (B, H, Lq, Dh), k (B, H, Lk, Dh) rotated by their angles (cos, sin each (L, Dh) or (B, 1, L, Dh));
    sign -1 rotates back (the backward). Returns new contiguous tensors."""
    b, h, lq, d = q.shape
    lk = k.shape[2]
    cq, sq, ck, sk = (a if a.dtype == torch.float32 and a.stride(-1) == 1 else a.float().contiguous()
                      for a in (*q_angles, *k_angles))
    qo, ko = torch.empty(b, h, lq, d, dtype=q.dtype, device=q.device), torch.empty(b, h, lk, d, dtype=k.dtype,
                                                                                    device=k.device)
    nq, nk = b * h * lq, b * h * lk
    half = d // 2
    half_p2 = max(16, 1 << (half - 1).bit_length())
    rows = rows_per_program(half_p2) if not interpreting() else 16
    grid = (cdiv(nq, rows) + cdiv(nk, rows),)
    launch_kernel(_rotary_kernel, grid,
                  (q, k, qo, ko, cq, sq, ck, sk, h, lq, lk, nq, nk, *q.stride()[:3], *k.stride()[:3],
                   *_angle_strides(cq), *_angle_strides(ck), half, sign),
                  dict(ROWS=rows, HALF=half_p2, num_warps=4 if not interpreting() else 1))
    return qo, ko


class RotaryQK(torch.autograd.Function):
    """(q, k) -> (q rotated by its positions' angles, k by theirs); gradients for q and k."""

    @staticmethod
    def forward(ctx, q, k, cos_q, sin_q, cos_k, sin_k):
        ctx.save_for_backward(cos_q, sin_q, cos_k, sin_k)
        return rotate(q, k, (cos_q, sin_q), (cos_k, sin_k))

    @staticmethod
    def backward(ctx, gq, gk):
        cos_q, sin_q, cos_k, sin_k = ctx.saved_tensors
        gq, gk = (g if g.stride(-1) == 1 else g.contiguous() for g in (gq, gk))
        dq, dk = rotate(gq, gk, (cos_q, sin_q), (cos_k, sin_k), sign=-1.0)
        return dq, dk, None, None, None, None


def rotary_qk(q: Tensor, k: Tensor, cos_q: Tensor, sin_q: Tensor, cos_k: Tensor,
              sin_k: Tensor) -> tuple[Tensor, Tensor]:
    """`apply_rotary` of q and of k in one kernel (last dimension contiguous; the head size even)."""
    q, k = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k))
    return RotaryQK.apply(q, k, cos_q, sin_q, cos_k, sin_k)
