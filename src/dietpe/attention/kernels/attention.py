"""The one attention equation with its position-only logit terms computed inside the tile (Triton).

    S_ij = s · q_i·k_j + T[h, i - j + Lk - 1] · a_i · c_j + Ŝ[h, σ_i, τ_j] + M_ij,    O = softmax(S) · V

FlashAttention-2's tiling (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning", Algorithm 1 and 2): an online softmax over key blocks, the log-sum-exp saved, and a backward
that recomputes P from it, dK and dV by key block and dQ by query block, so no (Lq, Lk) tensor is ever in
memory. The position terms are read in the tile from small tables:

    T   one value per head and offset i - j, (H|1, Lq + Lk - 1): DIET-REL's R_{i-j} (DIET eq. 3, clipped or
        not), T5's and TUPE-R's bucket values b[bucket(j - i)] (Raffel et al. 2020 §2.1; TUPE eq. 11),
        ALiBi's -m·|i - j| (Press et al. 2022), KERPLE's -r1·log(1 + r2·|i - j|) (Chi et al. 2022); the
        caller builds T from the method's parameters and autograd carries dT back to them
    a, c  0/1 per query and key: TUPE's reset of [CLS]'s row and column (TUPE eq. 9), else 1
    Ŝ   DIET's per-head segment table (DIET eq. 2), read at the tokens' segments σ_i, τ_j
    M   the additive mask: padding (one value per key), a dense (Lq, Lk) one, or causality (a flag: blocks
        above the diagonal are skipped)

Attention dropout multiplies P by Z / (1 - p) before P·V, Z drawn by Philox at each pair's flat index from a
seed per call, so the backward draws the same Z again (FlashAttention's way; its normaliser counts dropped
weights too, as `F.dropout` after the softmax does).

Low-rank terms (DIET-ABS eq. 1, TUPE's correlation eq. 10) arrive folded into extra query/key channels, so
the query/key head size may differ from the values'. Head sizes are loaded in two power-of-two parts
(64 + 16 for 72), values padded to a power of two, both with masked loads.

Gradients without atomics: the dK/dV program of key block n (per batch row and head) owns one row of a
partial buffer. For each query block it sums its tile's dS along the tile's diagonals (a shear by
`tl.gather`, then a column sum), keeping the upper half as a carry for the next query block, whose offsets
overlap it, and writes each finished stretch once; a second kernel adds the rows of every program in a fixed
order. Segment-pair sums are per program as well, added by torch in a fixed order. So two runs give the same
bits. The partial buffer holds B·H·(Lk/BLK)·(Lq + BLK) float32: Lq·Lk·B·H/BLK, 1/64 of one (B, H, L, L)
float32 tensor with BLK = 64.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from dietpe.attention.kernels import interpreting

LOG2E = 1.4426950408889634
# Triton's interpreter multiplies bfloat16 dot operands wrongly (numpy has no bfloat16): it gets them as float32,
# which is what a GPU's bfloat16 dot computes (exact products, float32 sums)
UPCAST_DOT = tl.constexpr(interpreting())
# blocked entries of an additive mask are finfo.min, whose product with log2(e) overflows float32: clamped
MASK_FLOOR = tl.constexpr(-1e30)


@triton.jit
def _tile_bias(b, h, offs_m, offs_n, valid, LQ, LK, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks,
               MASK, smb, smh, smm, smn, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
               MASK_KIND: tl.constexpr):
    """Σ position terms + mask for one (BM, BN) tile, float32, natural units."""
    bias = tl.where(valid, 0.0, 0.0)
    if HAS_TAB:
        diag = offs_m[:, None] - offs_n[None, :] + (LK - 1)
        t = tl.load(TAB + h * stab + diag, mask=valid, other=0.0)
        if HAS_KEEP:
            t = t * _keep(offs_m, offs_n, valid, KEEPQ, KEEPK)
        bias += t
    if NSEG > 0:
        sq = tl.load(QSEG + b * sqs + offs_m, mask=offs_m < LQ, other=0)
        sk = tl.load(KSEG + b * sks + offs_n, mask=offs_n < LK, other=0)
        for c in tl.static_range(NSEG):
            row = tl.load(SEGT + h * sseg + sq * NSEG + c, mask=(sq >= 0) & (sq < NSEG), other=0.0)  # Ŝ[h, σ_i, c]
            bias += tl.where(sk[None, :] == c, row[:, None], 0.0)
    if MASK_KIND == 1:  # one additive value per key (padding)
        mv = tl.load(MASK + b * smb + h * smh + offs_n * smn, mask=offs_n < LK, other=0.0).to(tl.float32)
        bias += tl.maximum(mv, MASK_FLOOR)[None, :]
    if MASK_KIND == 2:  # a dense (Lq, Lk) additive mask
        mv = tl.load(MASK + b * smb + h * smh + offs_m[:, None] * smm + offs_n[None, :] * smn, mask=valid,
                     other=0.0).to(tl.float32)
        bias += tl.maximum(mv, MASK_FLOOR)
    return bias


@triton.jit
def _keep(offs_m, offs_n, valid, KEEPQ, KEEPK):
    """a_i · c_j for a tile: where the offset table applies (0 on TUPE's reset row and column)."""
    a = tl.load(KEEPQ + offs_m[:, None], mask=valid, other=0.0)
    c = tl.load(KEEPK + offs_n[None, :], mask=valid, other=0.0)
    return a * c


@triton.jit
def _kept(seed, bh, offs_m, offs_n, LQ, LK, p_drop):
    """Attention dropout's keep mask for a tile: Philox at the pair's flat index (b, h, i, j), so the backward
    draws the same mask again."""
    flat = (bh.to(tl.int64) * LQ + offs_m[:, None]) * LK + offs_n[None, :]
    return tl.rand(seed, flat) >= p_drop


@triton.jit
def _load_rows(base, rows, stride, n_rows, cols, n_cols):
    return tl.load(base + rows[:, None] * stride + cols[None, :], mask=(rows[:, None] < n_rows)
                   & (cols[None, :] < n_cols), other=0.0)


@triton.jit
def _store_rows(base, rows, stride, n_rows, cols, n_cols, x):
    tl.store(base + rows[:, None] * stride + cols[None, :], x, mask=(rows[:, None] < n_rows)
             & (cols[None, :] < n_cols))


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    """a @ b in float32."""
    if UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _scores(q1, q2, k1, k2, D2: tl.constexpr, PREC: tl.constexpr):
    """q·kᵀ over both parts of the head size, float32."""
    s = _dot(q1, tl.trans(k1), PREC)
    if D2 > 0:
        s += _dot(q2, tl.trans(k2), PREC)
    return s


@triton.jit(do_not_specialize=["seed"])
def _forward_kernel(Q, K, V, O, LSE, TAB, KEEPQ, KEEPK, SEGT, QSEG, KSEG, MASK,
                    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
                    stab, sseg, sqs, sks, smb, smh, smm, smn,
                    H, LQ, LK, DQ, DV_, qk_scale, seed, p_drop, inv_keep,
                    BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DVP: tl.constexpr,
                    HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
                    MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr):
    """One block of BM queries of one (batch row, head) against every key block: FlashAttention-2's forward."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = pid_m * BM + tl.arange(0, BM)
    d1 = tl.arange(0, D1)
    dv = tl.arange(0, DVP)
    q_base, k_base, v_base = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    q1 = _load_rows(q_base, offs_m, sqm, LQ, d1, DQ)
    q2 = q1
    if D2 > 0:
        d2 = D1 + tl.arange(0, D2)
        q2 = _load_rows(q_base, offs_m, sqm, LQ, d2, DQ)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DVP], tl.float32)
    hi = LK
    if CAUSAL:
        hi = tl.minimum(LK, (pid_m + 1) * BM)  # blocks above the diagonal are skipped
    for start in range(0, hi, BN):
        offs_n = start + tl.arange(0, BN)
        k1 = _load_rows(k_base, offs_n, skn, LK, d1, DQ)
        k2 = k1
        if D2 > 0:
            k2 = _load_rows(k_base, offs_n, skn, LK, d2, DQ)
        ok = (offs_m[:, None] < LQ) & (offs_n[None, :] < LK)
        s = _scores(q1, q2, k1, k2, D2, PREC) * qk_scale
        s += _tile_bias(b, h, offs_m, offs_n, ok, LQ, LK, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks,
                        MASK, smb, smh, smm, smn, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND) * 1.4426950408889634
        see = offs_n[None, :] < LK
        if CAUSAL:
            see = see & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(see, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_base, offs_n, svn, LK, dv, DV_)
        if DROPOUT:  # the normaliser l_i sums the kept and the dropped alike
            p = tl.where(_kept(seed, bh, offs_m, offs_n, LQ, LK, p_drop), p * inv_keep, 0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC)
        m_i = m_new
    acc = acc / l_i[:, None]
    _store_rows(O + b * sob + h * soh, offs_m, som, LQ, dv, DV_, acc.to(O.dtype.element_ty))
    tl.store(LSE + bh * LQ + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < LQ)


@triton.jit
def _probabilities(q1, q2, k1, k2, lse, b, h, offs_m, offs_n, ok, LQ, LK, qk_scale, TAB, stab, KEEPQ, KEEPK, SEGT,
                   sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, D2: tl.constexpr, HAS_TAB: tl.constexpr,
                   HAS_KEEP: tl.constexpr, NSEG: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
                   PREC: tl.constexpr):
    """P of one tile recomputed from the saved log-sum-exp (log2 units); 0 outside the tile's pairs."""
    s = _scores(q1, q2, k1, k2, D2, PREC) * qk_scale
    s += _tile_bias(b, h, offs_m, offs_n, ok, LQ, LK, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks,
                    MASK, smb, smh, smm, smn, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND) * 1.4426950408889634
    see = ok
    if CAUSAL:
        see = see & (offs_m[:, None] >= offs_n[None, :])
    return tl.where(see, tl.math.exp2(s - lse[:, None]), 0.0)


@triton.jit
def _diagonal_sums(x, BLK: tl.constexpr):
    """Sums of a (BLK, BLK) tile along its diagonals r - c: (lower, upper), lower[t] on r - c = t - BLK + 1 and
    upper[t] on r - c = t + 1 (the diagonals the next query block's tile continues). Each row is sheared by
    its index with a gather, so a diagonal becomes a column."""
    r = tl.arange(0, BLK)[:, None]
    t = tl.arange(0, BLK)[None, :]
    c_lo = r + (BLK - 1) - t
    lower = tl.sum(tl.where(c_lo < BLK, tl.gather(x, tl.minimum(c_lo, BLK - 1), 1), 0.0), 0)
    c_hi = r - 1 - t
    upper = tl.sum(tl.where(c_hi >= 0, tl.gather(x, tl.maximum(c_hi, 0), 1), 0.0), 0)
    return lower, upper


@triton.jit
def _segment_sums(ds, sq, sk, NSEG: tl.constexpr, NSEG2P: tl.constexpr):
    """Σ dS over each segment pair (a, c) of a tile, flattened a·NSEG + c into NSEG2P slots."""
    slot = tl.arange(0, NSEG2P)
    out = tl.zeros([NSEG2P], tl.float32)
    for c in tl.static_range(NSEG):
        per_query = tl.sum(tl.where(sk[None, :] == c, ds, 0.0), 1)
        for a in tl.static_range(NSEG):
            out += tl.where(slot == a * NSEG + c, tl.sum(tl.where(sq == a, per_query, 0.0), 0), 0.0)
    return out


@triton.jit(do_not_specialize=["seed"])
def _backward_kv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, PART, SPART, TAB, KEEPQ, KEEPK, SEGT, QSEG, KSEG, MASK,
                        sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm,
                        stab, sseg, sqs, sks, smb, smh, smm, smn,
                        H, LQ, LK, DQ, DV_, qk_scale, scale, seed, p_drop, inv_keep, NM, W,
                        BLK: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DVP: tl.constexpr,
                        HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr, NSEG2P: tl.constexpr,
                        MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                        PREC: tl.constexpr):
    """dK, dV of one key block of one (batch row, head), and its partial sums of dS per offset and segment pair."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    n_blocks = tl.num_programs(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_n = pid_n * BLK + tl.arange(0, BLK)
    d1 = tl.arange(0, D1)
    dv_cols = tl.arange(0, DVP)
    q_base, k_base, v_base = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    do_base = DO + b * sdb + h * sdh
    k1 = _load_rows(k_base, offs_n, skn, LK, d1, DQ)
    k2 = k1
    if D2 > 0:
        d2 = D1 + tl.arange(0, D2)
        k2 = _load_rows(k_base, offs_n, skn, LK, d2, DQ)
    v = _load_rows(v_base, offs_n, svn, LK, dv_cols, DV_)
    dk1 = tl.zeros([BLK, D1], tl.float32)
    dk2 = dk1
    if D2 > 0:
        dk2 = tl.zeros([BLK, D2], tl.float32)
    dv = tl.zeros([BLK, DVP], tl.float32)
    carry = tl.zeros([BLK], tl.float32)
    seg = tl.zeros([NSEG2P], tl.float32)
    part_row = PART + (bh.to(tl.int64) * n_blocks + pid_n) * W
    t = tl.arange(0, BLK)
    sk = offs_n
    if NSEG > 0:
        sk = tl.load(KSEG + b * sks + offs_n, mask=offs_n < LK, other=0)
    lo = 0
    if CAUSAL:
        lo = pid_n  # query blocks wholly above the diagonal see none of these keys (BM = BN)
    for mb in range(lo, NM):
        offs_m = mb * BLK + tl.arange(0, BLK)
        q1 = _load_rows(q_base, offs_m, sqm, LQ, d1, DQ)
        q2 = q1
        if D2 > 0:
            q2 = _load_rows(q_base, offs_m, sqm, LQ, d2, DQ)
        do = _load_rows(do_base, offs_m, sdm, LQ, dv_cols, DV_)
        lse = tl.load(LSE + bh * LQ + offs_m, mask=offs_m < LQ, other=float("inf"))  # rows past Lq: p = 0
        delta = tl.load(DELTA + bh * LQ + offs_m, mask=offs_m < LQ, other=0.0)
        ok = (offs_m[:, None] < LQ) & (offs_n[None, :] < LK)
        p = _probabilities(q1, q2, k1, k2, lse, b, h, offs_m, offs_n, ok, LQ, LK, qk_scale, TAB, stab, KEEPQ,
                           KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, D2, HAS_TAB,
                           HAS_KEEP, NSEG, MASK_KIND, CAUSAL, PREC)
        dp = _dot(do, tl.trans(v), PREC)
        if DROPOUT:  # O = (P ∘ Z / (1 - p)) V: dV sees the dropped P, dP the mask
            kept = _kept(seed, bh, offs_m, offs_n, LQ, LK, p_drop)
            dv += _dot(tl.trans(tl.where(kept, p * inv_keep, 0.0).to(v.dtype)), do, PREC)
            dp = tl.where(kept, dp * inv_keep, 0.0)
        else:
            dv += _dot(tl.trans(p.to(v.dtype)), do, PREC)
        ds = p * (dp - delta[:, None])  # dL/dS_ij
        dk1 += _dot(tl.trans(ds.to(q1.dtype)), q1, PREC)
        if D2 > 0:
            dk2 += _dot(tl.trans(ds.to(q2.dtype)), q2, PREC)
        if HAS_TAB:
            dt = ds
            if HAS_KEEP:
                dt = ds * _keep(offs_m, offs_n, ok, KEEPQ, KEEPK)
            lower, upper = _diagonal_sums(dt, BLK)
            tl.store(part_row + mb * BLK + t, lower + carry)  # finished: no later block reaches these offsets
            carry = upper
        if NSEG > 0:
            sq = tl.load(QSEG + b * sqs + offs_m, mask=offs_m < LQ, other=0)
            seg += _segment_sums(ds, sq, sk, NSEG, NSEG2P)
    if HAS_TAB:
        tl.store(part_row + NM * BLK + t, carry)
    _store_rows(DK + b * skb + h * skh, offs_n, skn, LK, d1, DQ, (dk1 * scale).to(DK.dtype.element_ty))
    if D2 > 0:
        _store_rows(DK + b * skb + h * skh, offs_n, skn, LK, d2, DQ, (dk2 * scale).to(DK.dtype.element_ty))
    _store_rows(DV + b * svb + h * svh, offs_n, svn, LK, dv_cols, DV_, dv.to(DV.dtype.element_ty))
    if NSEG > 0:
        tl.store(SPART + (bh.to(tl.int64) * n_blocks + pid_n) * NSEG2P + tl.arange(0, NSEG2P), seg)


@triton.jit(do_not_specialize=["seed"])
def _backward_q_kernel(Q, K, V, DO, LSE, DELTA, DQ_, TAB, KEEPQ, KEEPK, SEGT, QSEG, KSEG, MASK,
                       sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm,
                       stab, sseg, sqs, sks, smb, smh, smm, smn,
                       H, LQ, LK, DQ, DV_, qk_scale, scale, seed, p_drop, inv_keep,
                       BLK: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DVP: tl.constexpr,
                       HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
                       MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr):
    """dQ of one query block of one (batch row, head), by FlashAttention-2's second backward loop."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = pid_m * BLK + tl.arange(0, BLK)
    d1 = tl.arange(0, D1)
    dv_cols = tl.arange(0, DVP)
    q_base, k_base, v_base = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    q1 = _load_rows(q_base, offs_m, sqm, LQ, d1, DQ)
    q2 = q1
    if D2 > 0:
        d2 = D1 + tl.arange(0, D2)
        q2 = _load_rows(q_base, offs_m, sqm, LQ, d2, DQ)
    do = _load_rows(DO + b * sdb + h * sdh, offs_m, sdm, LQ, dv_cols, DV_)
    lse = tl.load(LSE + bh * LQ + offs_m, mask=offs_m < LQ, other=float("inf"))  # rows past Lq: p = 0
    delta = tl.load(DELTA + bh * LQ + offs_m, mask=offs_m < LQ, other=0.0)
    dq1 = tl.zeros([BLK, D1], tl.float32)
    dq2 = dq1
    if D2 > 0:
        dq2 = tl.zeros([BLK, D2], tl.float32)
    hi = LK
    if CAUSAL:
        hi = tl.minimum(LK, (pid_m + 1) * BLK)
    for start in range(0, hi, BLK):
        offs_n = start + tl.arange(0, BLK)
        k1 = _load_rows(k_base, offs_n, skn, LK, d1, DQ)
        k2 = k1
        if D2 > 0:
            k2 = _load_rows(k_base, offs_n, skn, LK, d2, DQ)
        v = _load_rows(v_base, offs_n, svn, LK, dv_cols, DV_)
        ok = (offs_m[:, None] < LQ) & (offs_n[None, :] < LK)
        p = _probabilities(q1, q2, k1, k2, lse, b, h, offs_m, offs_n, ok, LQ, LK, qk_scale, TAB, stab, KEEPQ,
                           KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, D2, HAS_TAB,
                           HAS_KEEP, NSEG, MASK_KIND, CAUSAL, PREC)
        dp = _dot(do, tl.trans(v), PREC)
        if DROPOUT:
            dp = tl.where(_kept(seed, bh, offs_m, offs_n, LQ, LK, p_drop), dp * inv_keep, 0.0)
        ds = p * (dp - delta[:, None])
        dq1 += _dot(ds.to(k1.dtype), k1, PREC)
        if D2 > 0:
            dq2 += _dot(ds.to(k2.dtype), k2, PREC)
    _store_rows(DQ_ + b * sqb + h * sqh, offs_m, sqm, LQ, d1, DQ, (dq1 * scale).to(DQ_.dtype.element_ty))
    if D2 > 0:
        _store_rows(DQ_ + b * sqb + h * sqh, offs_m, sqm, LQ, d2, DQ, (dq2 * scale).to(DQ_.dtype.element_ty))


@triton.jit
def _offset_sum_kernel(PART, OUT, B, H, NN, W, NOFF, LK, BLK: tl.constexpr, RB: tl.constexpr):
    """dT[h, o] = Σ_b Σ_n PART[b, h, n, o - Lk + (n + 1)·BLK]: every key block's partial row, added in a fixed
    order (the key block n wrote offset o at o - Lk + (n + 1)·BLK)."""
    h = tl.program_id(0)
    o = tl.program_id(1) * RB + tl.arange(0, RB)
    acc = tl.zeros([RB], tl.float32)
    for b in range(B):
        for n in range(NN):
            p = o - LK + (n + 1) * BLK
            row = PART + ((b * H + h).to(tl.int64) * NN + n) * W
            acc += tl.load(row + p, mask=(p >= 0) & (p < W) & (o < NOFF), other=0.0)
    tl.store(OUT + h * NOFF + o, acc, mask=o < NOFF)


@triton.jit
def _keep_mask_kernel(OUT, seed, p_drop, LQ, LK, BM: tl.constexpr, BN: tl.constexpr):
    """The dropout mask the attention kernels draw, written out (for tests)."""
    bh = tl.program_id(2)
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = (offs_m[:, None] < LQ) & (offs_n[None, :] < LK)
    kept = _kept(seed, bh, offs_m, offs_n, LQ, LK, p_drop)
    tl.store(OUT + (bh.to(tl.int64) * LQ + offs_m[:, None]) * LK + offs_n[None, :], kept.to(tl.int8), mask=ok)


def dropout_keep(seed: int, p: float, b: int, h: int, lq: int, lk: int, device) -> Tensor:
    """(B, H, Lq, Lk) booleans: which pairs the kernels keep under dropout p with this seed."""
    out = torch.empty(b, h, lq, lk, dtype=torch.int8, device=device)
    _keep_mask_kernel[(triton.cdiv(lq, 16), triton.cdiv(lk, 16), b * h)](out, seed, p, lq, lk, BM=16, BN=16)
    return out.bool()


# -- the host side ------------------------------------------------------------------------------------------


@dataclass
class Extras:
    """What the kernel reads beside q, k, v and the two learned tables, none of it with a gradient.

    q_keep (Lq,), k_keep (Lk,): 0/1 multipliers of the offset table (TUPE's reset), or None; q_segments (B, Lq),
    k_segments (B, Lk) int32, with the segment table; mask: additive (B|1, H|1, 1, Lk) per key or
    (B|1, H|1, Lq, Lk) dense, or None; causal: query i sees keys j <= i (Lq = Lk)."""

    q_keep: Tensor | None = None
    k_keep: Tensor | None = None
    q_segments: Tensor | None = None
    k_segments: Tensor | None = None
    mask: Tensor | None = None
    causal: bool = False
    #: attention dropout: the probability and the Philox seed (the backward draws the same mask)
    dropout: float = 0.0
    seed: int = 0


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def head_parts(d: int) -> tuple[int, int]:
    """(D1, D2): the query/key head size as two power-of-two parts of at least 16 (D2 = 0: one part)."""
    if d <= 16:
        return 16, 0
    d1 = 1 << (d.bit_length() - 1)
    rest = d - d1
    return d1, (0 if rest == 0 else max(16, _pow2(rest)))


# Tile configurations tried in order until one fits the GPU's shared memory, by the bytes of an element (2: bf16
# and fp16, 4: fp32) and the widest loaded head part: (BM, BN, warps, stages) for the forward, (BLK, warps,
# stages) for each backward kernel (dK/dV's diagonal carry needs square tiles). Chosen by compiling for sm_90
# (Hopper) and reading the cubins' registers and spills: the first of each list spills nothing, or a few bytes
# with every term on (dK/dV at 64 rows spills hundreds of bytes; fp32's exact dots spill in any tile).
FORWARD_CONFIGS = {2: {64: [(128, 64, 8, 2), (64, 64, 4, 2), (32, 32, 4, 1)],
                       128: [(64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 1)],
                       256: [(64, 32, 4, 2), (32, 32, 4, 1), (16, 16, 4, 1)]},
                   4: {64: [(32, 32, 4, 2), (16, 16, 4, 1)], 128: [(32, 32, 4, 2), (16, 16, 4, 1)],
                       256: [(16, 16, 4, 1)]}}
BACKWARD_KV_CONFIGS = {2: {64: [(32, 8, 2), (32, 4, 1), (16, 4, 1)], 128: [(32, 8, 2), (16, 4, 1)],
                           256: [(32, 8, 1), (16, 4, 1)]},
                       4: {64: [(16, 4, 2), (16, 4, 1)], 128: [(16, 4, 1)], 256: [(16, 4, 1)]}}
BACKWARD_Q_CONFIGS = {2: {64: [(64, 8, 2), (32, 4, 1), (16, 4, 1)], 128: [(64, 8, 2), (32, 4, 1), (16, 4, 1)],
                          256: [(32, 8, 1), (16, 4, 1)]},
                      4: {64: [(32, 4, 2), (16, 4, 1)], 128: [(32, 4, 2), (16, 4, 1)], 256: [(16, 4, 1)]}}
#: tile size under Triton's interpreter (the CPU tests), where smaller tiles run faster
INTERPRETER_BLOCK = 16
_chosen: dict[tuple, int] = {}


def _configs(configs: dict, dtype: torch.dtype, width: int) -> list:
    by_width = configs[2 if dtype.itemsize <= 2 else 4]
    for bound in sorted(by_width):
        if width <= bound:
            return by_width[bound]
    return by_width[max(by_width)]


def _launch(key: tuple, configs: list, launch) -> None:
    """launch(config) with the first config of `configs` that fits the GPU (remembered under `key`)."""
    if interpreting():
        return launch(None)
    from triton.runtime.errors import OutOfResources

    start = _chosen.get(key, 0)
    for i in range(start, len(configs)):
        try:
            launch(configs[i])
            _chosen[key] = i
            return
        except OutOfResources:
            if i == len(configs) - 1:
                raise


def _precision(q: Tensor) -> str:
    """fp32 inputs: exact products unless torch allows TF32 matmuls; half precision: the native dot."""
    if q.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _aux_args(table: Tensor | None, segments: Tensor | None, ex: Extras, dummy: Tensor):
    """Pointers and strides of the tables, keeps, segments and mask (a dummy tensor where absent)."""
    tab = table if table is not None else dummy
    seg_t = segments if segments is not None else dummy
    keep_q = ex.q_keep if ex.q_keep is not None else dummy
    keep_k = ex.k_keep if ex.k_keep is not None else dummy
    qs = ex.q_segments if ex.q_segments is not None else dummy
    ks = ex.k_segments if ex.k_segments is not None else dummy
    mask = ex.mask if ex.mask is not None else dummy
    stab = table.stride(0) if table is not None and table.shape[0] > 1 else 0
    sseg = segments.stride(0) if segments is not None and segments.shape[0] > 1 else 0
    sqs = ex.q_segments.stride(0) if ex.q_segments is not None else 0
    sks = ex.k_segments.stride(0) if ex.k_segments is not None else 0
    # broadcast dimensions (size 1) read the same entries for every index
    ms = tuple(0 if n == 1 else st for n, st in zip(ex.mask.shape, ex.mask.stride())) if ex.mask is not None \
        else (0, 0, 0, 0)
    pointers = (tab, keep_q, keep_k, seg_t, qs, ks, mask)
    strides = (stab, sseg, sqs, sks, *ms)
    return pointers, strides


def _dropout_args(ex: Extras) -> tuple[int, float, float]:
    """(seed, p, 1 / (1 - p))."""
    return ex.seed, ex.dropout, 1.0 / (1.0 - ex.dropout)


def _flags(table, segments, ex: Extras, q: Tensor) -> dict:
    nseg = segments.shape[-1] if segments is not None else 0
    kind = 0 if ex.mask is None else (1 if ex.mask.shape[2] == 1 else 2)
    return dict(HAS_TAB=table is not None, HAS_KEEP=ex.q_keep is not None, NSEG=nseg, MASK_KIND=kind,
                CAUSAL=ex.causal, DROPOUT=ex.dropout > 0, PREC=_precision(q))


def attention_forward(q: Tensor, k: Tensor, v: Tensor, scale: float, table: Tensor | None,
                      segments: Tensor | None, ex: Extras) -> tuple[Tensor, Tensor]:
    """out (B, H, Lq, Dv) in v's dtype and the log-sum-exp (B, H, Lq) in log2 units, float32."""
    b, h, lq, dq = q.shape
    lk, dv = k.shape[2], v.shape[3]
    out = torch.empty(b, h, lq, dv, dtype=v.dtype, device=q.device)
    lse = torch.empty(b, h, lq, dtype=torch.float32, device=q.device)
    d1, d2 = head_parts(dq)
    dvp = max(16, _pow2(dv))
    pointers, strides = _aux_args(table, segments, ex, lse)
    flags = _flags(table, segments, ex, q)

    def launch(config):
        bm, bn, warps, stages = config or (INTERPRETER_BLOCK, INTERPRETER_BLOCK, 4, 1)
        bm = min(bm, max(16, _pow2(lq)))  # a few queries (a decoding step): no rows of padding
        grid = (triton.cdiv(lq, bm), b * h)
        _forward_kernel[grid](q, k, v, out, lse, *pointers, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                              *out.stride()[:3], *strides, h, lq, lk, dq, dv, scale * LOG2E, *_dropout_args(ex),
                              BM=bm, BN=bn, D1=d1, D2=d2, DVP=dvp, num_warps=warps, num_stages=stages, **flags)

    _launch(("fwd", d1, d2, dvp, q.dtype, tuple(flags.items())), _configs(FORWARD_CONFIGS, q.dtype, max(d1, dvp)),
            launch)
    return out, lse


def attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float,
                       table: Tensor | None, segments: Tensor | None, ex: Extras):
    """(dq, dk, dv, d table, d segment table): FlashAttention-2's backward, tables' gradients without atomics."""
    b, h, lq, dq_width = q.shape
    lk, dv_width = k.shape[2], v.shape[3]
    do = do.contiguous()
    delta = (do.float() * out.float()).sum(-1)  # (B, H, Lq): rowsum(dO ∘ O)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    d1, d2 = head_parts(dq_width)
    dvp = max(16, _pow2(dv_width))
    pointers, strides = _aux_args(table, segments, ex, lse)
    flags = _flags(table, segments, ex, q)
    common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *strides, h, lq, lk, dq_width,
              dv_width, scale * LOG2E, scale, *_dropout_args(ex))
    key = (d1, d2, dvp, q.dtype, tuple(flags.items()))
    width = max(d1, dvp)
    nseg = flags["NSEG"]
    nseg2p = _pow2(max(1, nseg * nseg))
    result = {}

    def launch_kv(config):
        blk, warps, stages = config or (INTERPRETER_BLOCK, 4, 1)
        nm, nn = triton.cdiv(lq, blk), triton.cdiv(lk, blk)
        row = (nm + 1) * blk
        part = torch.zeros(b * h, nn, row, dtype=torch.float32, device=q.device) if table is not None else lse
        spart = torch.empty(b * h, nn, nseg2p, dtype=torch.float32, device=q.device) if nseg else lse
        _backward_kv_kernel[(nn, b * h)](q, k, v, do, lse, delta, dk, dv, part, spart, *pointers, *common, nm, row,
                                         BLK=blk, D1=d1, D2=d2, DVP=dvp, NSEG2P=nseg2p, num_warps=warps,
                                         num_stages=stages, **flags)
        result.update(part=part, spart=spart, blk=blk, nn=nn, width=row)

    def launch_q(config):
        blk, warps, stages = config or (INTERPRETER_BLOCK, 4, 1)
        _backward_q_kernel[(triton.cdiv(lq, blk), b * h)](q, k, v, do, lse, delta, dq, *pointers, *common, BLK=blk,
                                                          D1=d1, D2=d2, DVP=dvp, num_warps=warps,
                                                          num_stages=stages, **flags)

    _launch(("kv", *key), _configs(BACKWARD_KV_CONFIGS, q.dtype, width), launch_kv)
    _launch(("q", *key), _configs(BACKWARD_Q_CONFIGS, q.dtype, width), launch_q)
    d_table = d_segments = None
    if table is not None:
        d_table = _offset_sums(result["part"], b, h, result["nn"], result["width"], lq + lk - 1, lk, result["blk"])
        d_table = d_table.sum(0, keepdim=True) if table.shape[0] == 1 else d_table
    if nseg:
        pairs = result["spart"].view(b, h, result["nn"], nseg2p)[..., :nseg * nseg].sum((0, 2))  # (H, K·K)
        d_segments = pairs.view(h, nseg, nseg)
        d_segments = d_segments.sum(0, keepdim=True) if segments.shape[0] == 1 else d_segments
    return dq, dk, dv, d_table, d_segments


def _offset_sums(part: Tensor, b: int, h: int, nn: int, width: int, n_offsets: int, lk: int, blk: int) -> Tensor:
    out = torch.empty(h, n_offsets, dtype=torch.float32, device=part.device)
    rb = INTERPRETER_BLOCK * 4 if interpreting() else 256
    _offset_sum_kernel[(h, triton.cdiv(n_offsets, rb))](part, out, b, h, nn, width, n_offsets, lk, BLK=blk, RB=rb)
    return out


def _dense(x: Tensor) -> bool:
    """Whether x's elements fill its storage span with no gap or overlap (then `empty_like` keeps its strides)."""
    expected = 1
    for size, stride in sorted(((n, st) for n, st in zip(x.shape, x.stride()) if n != 1), key=lambda t: t[1]):
        if stride != expected:
            return False
        expected *= size
    return True


class FusedAttention(torch.autograd.Function):
    """out = softmax(s·q·kᵀ + T[h, i - j] · a_i · c_j + Ŝ[h, σ_i, τ_j] + mask) · v, by the kernels above;
    gradients for q, k, v, the offset table T and the segment table Ŝ."""

    @staticmethod
    def forward(ctx, q, k, v, table, segments, scale, extras):
        out, lse = attention_forward(q, k, v, scale, table, segments, extras)
        ctx.save_for_backward(q, k, v, out, lse, table, segments)
        ctx.scale, ctx.extras = scale, extras
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, table, segments = ctx.saved_tensors
        dq, dk, dv, d_table, d_segments = attention_backward(do, q, k, v, out, lse, ctx.scale, table, segments,
                                                             ctx.extras)
        return dq, dk, dv, d_table, d_segments, None, None


def fused_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, table: Tensor | None = None,
                    segments: Tensor | None = None, extras: Extras | None = None) -> Tensor:
    """The kernel on q (B, H, Lq, Dq), k (B, H, Lk, Dq), v (B, H, Lk, Dv): out (B, H, Lq, Dv).

    table (H|1, Lq + Lk - 1): the offset table T[h, i - j + Lk - 1]; segments (H|1, K, K): Ŝ; extras: see
    `Extras`. Tables are read as float32 (their gradients flow back through the cast)."""
    extras = extras or Extras()
    # the backward writes dq, dk, dv (`empty_like`) with the strides of q, k, v: those must be dense (a view
    # of a fused qkv projection is not, and empty_like would not keep its strides)
    q, k, v = (x if x.stride(-1) == 1 and _dense(x) else x.contiguous() for x in (q, k, v))
    if table is not None:
        table = table.float().contiguous()
    if segments is not None:
        segments = segments.float().contiguous()
    return FusedAttention.apply(q, k, v, table, segments, scale, extras)
