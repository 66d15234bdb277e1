"""The one attention equation with its position-only logit terms computed inside the tile (Triton).

    S_ij = s · q_i·k_j + T[h, i - j + Lk - 1] · a_i · c_j + Ŝ[h, σ_i, τ_j] + M_ij,    O = softmax(S) · V

FlashAttention-2's tiling (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning", Algorithm 1 and 2): an online softmax over key blocks in base 2 (log2(e) folded into the scale
and into the terms' one multiply-add), the log-sum-exp saved, and a backward that recomputes P from it, dK and
dV by key block and dQ by query block, so no (Lq, Lk) tensor is ever in memory. The position terms are read in
the tile from small tables:

    T   one value per head and offset i - j, (H|1, Lq + Lk - 1): DIET-REL's R_{i-j} (DIET eq. 3, clipped or
        not), T5's and TUPE-R's bucket values b[bucket(j - i)] (Raffel et al. 2020 §2.1; TUPE eq. 11),
        ALiBi's -m·|i - j| (Press et al. 2022), KERPLE's -r1·log(1 + r2·|i - j|) (Chi et al. 2022); the
        caller builds T from the method's parameters and autograd carries dT back to them
    a, c  0/1 per query and key: TUPE's reset of [CLS]'s row and column (TUPE eq. 9), else 1
    Ŝ   DIET's per-head segment table (DIET eq. 2), read at the tokens' segments σ_i, τ_j
    M   the additive mask: padding (one value per key), a dense (Lq, Lk) one, or causality (a flag: blocks
        above the diagonal are skipped, blocks below it run without a mask)

A tile's offsets i - j are one stretch of BM + BN - 1 values of T: it loads them as one vector and gathers the
tile from it (HAS_TAB == 2), where a load per score (HAS_TAB == 1) makes Triton's pipeliner copy a (BM, BN)
float32 tile of T into shared memory per stage.

In T's place a piecewise term (PIECES > 0): F_h(x) = slope[p, h]·x + intercept[p, h] with x = T[i - j + Lk - 1]
/ den_i and p the number of kinks below x, found by a binary search over the sorted kinks. That is FIRE's
f_θ(ψ(i - j) / ψ(max(L, i))) (Li et al. 2023, eq. 4-6): its ReLU MLP of a scalar is piecewise linear, T holds
ψ(|i - j|) per offset and den ψ(max(L, i)) per query. Its gradients: dT along the diagonals as for a table
(of dS·slope / den), d den per query row, and per piece Σ dS and Σ dS·x (a loop over the pieces the tile meets).

Tiles wholly inside the lengths (EVEN_M, EVEN_N, EVEN_D: constexpr) load and compute without bounds masks.
Work the mask wholly blocks is skipped where the result is the same: under padding the key loop spans a row's
open keys only, under a dense mask (packed documents) a wholly blocked tile is skipped; a query that sees no
open key gets the equation's softmax over its blocked scores all the same.

Attention dropout multiplies P by Z / (1 - p) before P·V, Z drawn by Philox4x32-10 (Salmon et al. 2011) with
32-bit counters (row b·H·Lq + h·Lq + i, key group j // 4) from a seed per call, read from device memory (drawn
there: a CUDA graph's replay draws anew): one call gives the uniforms of four neighbouring keys, and the
backward draws the same Z again (FlashAttention's way; its normaliser counts dropped weights too, as
`F.dropout` after the softmax does).

Low-rank terms (DIET-ABS eq. 1, TUPE's correlation eq. 10) arrive folded into extra query/key channels, so
the query/key head size may differ from the values'. Heads are loaded in two power-of-two parts, each from
its own tensor with its own strides: q's channels past the first part (64 + 16 for 72), or the factors
themselves (`folded`, shared by the batch: batch stride 0), so q and k are never concatenated with them and
the factors' gradients come back summed over what they are shared by. Values are padded to a power of two;
loads are masked where a part is narrower than its power of two.

Gradients without atomics. The dQ kernel runs first: one program per query block (per batch row and head)
computes its rows' rowsum(dO ∘ O) and loops over the key blocks for dQ (with segment-pair and piece sums per
program, each written to its own row of a partial buffer). The dK/dV kernel (one program per key block, the
tile held key-major as the FlashAttention tutorial does, so no operand is transposed in registers) has no
reduction. An offset table's gradient is summed along the diagonals i - j by a kernel of its own over block
diagonals (`_band_kernel`): every tile (m, n) with m - n = δ holds the offsets δ·BLK + (r - c), so a program
adds a run of such tiles' dS as they are (recomputing S and dP) and sums the total along its diagonals once,
by a shear (`tl.gather`) and a column sum, into its own 2·BLK slots; `_band_sum_kernel` adds the slots in a
fixed order. The alternative (DIETPE_FUSED_TABLE_GRAD=rows, and FIRE's piecewise term always) shears every dQ
tile instead, carrying the lower half to the next key block (square tiles), and `_offset_sum_kernel` adds its
rows. Either way two runs give the same bits. The band buffer holds B·H·(⌈Lq/BLK⌉ + ⌈Lk/BLK⌉ - 1)·
⌈min(⌈Lq/BLK⌉, ⌈Lk/BLK⌉) / BAND_TILES⌉·2·BLK float32, about 4·B·H·L²/(BLK·BAND_TILES) at Lq = Lk = L.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from dietpe.attention.kernels import interpreting
from dietpe.attention.kernels.launch import cdiv as _cdiv, launch as launch_kernel, launch_kept
from dietpe.errors import ConfigError

LOG2E = 1.4426950408889634
# Triton's interpreter multiplies bfloat16 dot operands wrongly (numpy has no bfloat16): it gets them as float32,
# which is what a GPU's bfloat16 dot computes (exact products, float32 sums)
UPCAST_DOT = tl.constexpr(interpreting())
# blocked entries of an additive mask are finfo.min, whose product with log2(e) overflows float32: clamped
MASK_FLOOR = tl.constexpr(-1e30)
# a mask value at or below this blocks its pair: exp of it is 0 in float32 beside any open score (fp16 masks are
# -65504, old BERT code's -10000); a tile of such values is skipped where its row sees some open key, whose
# log-sum-exp (log2 units) is then above LSE_OPEN
MASK_SKIP = tl.constexpr(-1e4)
LSE_OPEN = tl.constexpr(-5e3)
# below this a row's log-sum-exp is a blocked score's (MASK_FLOOR · log2 e): the row saw no open key
NO_OPEN_LSE = -1e20
LOG2E_C = tl.constexpr(LOG2E)


@triton.jit
def _load_2d(base, rows, stride, n_rows, cols, n_cols, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    at = base + rows[:, None] * stride + cols[None, :]
    if MASK_ROWS and MASK_COLS:
        x = tl.load(at, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
    elif MASK_ROWS:
        x = tl.load(at, mask=rows[:, None] < n_rows, other=0.0)
    elif MASK_COLS:
        x = tl.load(at, mask=cols[None, :] < n_cols, other=0.0)
    else:
        x = tl.load(at)
    return x


@triton.jit
def _load_halves(base, base2, rows, stride, stride2, n_rows, n_cols, n_cols2, D1: tl.constexpr, D2: tl.constexpr,
                 MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Rows of q or k as two parts: n_cols channels at `base` (D1 loaded) and n_cols2 at `base2` (D2 loaded; the
    channels past D1 of the same rows, or low-rank factors folded in); the first again if D2 = 0."""
    x1 = _load_2d(base, rows, stride, n_rows, tl.arange(0, D1), n_cols, MASK_ROWS, MASK_COLS)
    x2 = x1
    if D2 > 0:
        x2 = _load_2d(base2, rows, stride2, n_rows, tl.arange(0, D2), n_cols2, MASK_ROWS, MASK_COLS)
    return x1, x2


@triton.jit
def _store_2d(base, rows, stride, n_rows, cols, n_cols, x, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    at = base + rows[:, None] * stride + cols[None, :]
    if MASK_ROWS and MASK_COLS:
        tl.store(at, x, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
    elif MASK_ROWS:
        tl.store(at, x, mask=rows[:, None] < n_rows)
    elif MASK_COLS:
        tl.store(at, x, mask=cols[None, :] < n_cols)
    else:
        tl.store(at, x)


@triton.jit
def _load_1d(at, idx, n, MASK: tl.constexpr, other):
    if MASK:
        x = tl.load(at + idx, mask=idx < n, other=other)
    else:
        x = tl.load(at + idx)
    return x


@triton.jit
def _gather(values, idx):
    """values[idx] for a 1-D vector and an index tensor of any shape, by Triton's gather (through shared memory
    on a GPU: one copy of the vector per program, not a load from global memory per index)."""
    return tl.reshape(tl.gather(values, tl.reshape(idx, (idx.numel,)), 0), idx.shape)


@triton.jit
def _offset_values(TAB, stab, h, qi, kj, q0, k0, LQ, LK, QB: tl.constexpr, KB: tl.constexpr, HAS_TAB: tl.constexpr,
                   MASK_M: tl.constexpr, MASK_N: tl.constexpr):
    """T[h, i - j + Lk - 1] at the tile's pairs: queries qi (QB of them from q0), keys kj (KB from k0), as
    broadcastable index tensors. HAS_TAB == 2: the tile's QB + KB - 1 offsets are one stretch of T, loaded as
    one vector and expanded by a gather (one load per tile, not one per score); 1: a load per score (0 past
    the lengths)."""
    if HAS_TAB == 2:
        W: tl.constexpr = 2 * QB if QB > KB else 2 * KB  # a power of two >= QB + KB - 1
        at = (LK - 1) + q0 - k0 - (KB - 1) + tl.arange(0, W)
        window = tl.load(TAB + h * stab + at, mask=(at >= 0) & (at < LQ + LK - 1), other=0.0)
        t = _gather(window, (qi - q0) - (kj - k0) + (KB - 1))
    else:
        at = TAB + h * stab + (LK - 1) + qi - kj
        if MASK_M or MASK_N:
            t = tl.load(at, mask=(qi < LQ) & (kj < LK), other=0.0)
        else:
            t = tl.load(at)
    return t


@triton.jit
def _piecewise(n, qi, h, LQ, DEN, PW, MASK_M: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr,
               GATHER: tl.constexpr):
    """F_h(x) = slope[p, h]·x + intercept[p, h] at x = n / den_i, p the number of kinks below x: a binary search
    over PW's PIECES sorted kinks (+inf past the last real one). Returns (F, x, p, slope[p, h], den_i). GATHER:
    the kinks and the head's pieces read once per tile as vectors and gathered from (else a load per score)."""
    den = _load_1d(DEN, qi, LQ, MASK_M, 1.0)
    x = n / den
    p = tl.zeros_like(x).to(tl.int32)
    row = PW + PIECES + h * (4 * PIECES)  # per head: slopes, then intercepts, 2·PIECES slots each
    if GATHER:
        kinks = tl.load(PW + tl.arange(0, PIECES))
        for u in tl.static_range(LOGKP):
            p = tl.where(_gather(kinks, p + ((PIECES >> (u + 1)) - 1)) < x, p + (PIECES >> (u + 1)), p)
        p = tl.where(_gather(kinks, p) < x, p + 1, p)
        pieces = tl.load(row + tl.arange(0, 4 * PIECES))
        slope = _gather(pieces, p)
        intercept = _gather(pieces, p + 2 * PIECES)
    else:
        for u in tl.static_range(LOGKP):
            p = tl.where(tl.load(PW + p + ((PIECES >> (u + 1)) - 1)) < x, p + (PIECES >> (u + 1)), p)
        p = tl.where(tl.load(PW + p) < x, p + 1, p)
        slope = tl.load(row + p)
        intercept = tl.load(row + 2 * PIECES + p)
    return slope * x + intercept, x, p, slope, den


@triton.jit
def _piece_sums(acc, ds, x, p, PIECES: tl.constexpr):
    """The slopes' and intercepts' gradients, as `_piecewise` lays them out: acc[p] += Σ dS·x and
    acc[2·PIECES + p] += Σ dS over the tile's pairs in piece p, for the pieces the tile meets."""
    slot = tl.arange(0, 4 * PIECES)
    dsx = ds * x
    for piece in range(tl.min(p), tl.max(p) + 1):
        on = p == piece
        acc += tl.where(slot == piece, tl.sum(tl.where(on, dsx, 0.0)), 0.0)
        acc += tl.where(slot == 2 * PIECES + piece, tl.sum(tl.where(on, ds, 0.0)), 0.0)
    return acc


@triton.jit
def _store_piece_partials(PWPART, DPART, DEN, pw_acc, den_acc, bh, pid_m, offs_m, LQ, PIECES: tl.constexpr,
                          EVEN_M: tl.constexpr):
    """One dQ program's piece sums (its own row of PWPART) and d den of its queries (-Σ_j dx·x / den_i)."""
    tl.store(PWPART + (bh.to(tl.int64) * tl.num_programs(0) + pid_m) * (4 * PIECES) + tl.arange(0, 4 * PIECES),
             pw_acc)
    den = _load_1d(DEN, offs_m, LQ, not EVEN_M, 1.0)
    if EVEN_M:
        tl.store(DPART + bh * LQ + offs_m, -den_acc / den)
    else:
        tl.store(DPART + bh * LQ + offs_m, -den_acc / den, mask=offs_m < LQ)


@triton.jit
def _add_terms(s, qi, kj, q0, k0, b, h, LQ, LK, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb,
               smh, smm, smn, DEN, PW, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
               MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr, MASK_M: tl.constexpr,
               MASK_N: tl.constexpr, QB: tl.constexpr, KB: tl.constexpr):
    """s + log2(e) · (Σ position terms + mask) for one tile. qi, kj: the query and key indices, broadcastable
    to s's shape ((BM, 1) and (1, BN), or transposed for a key-major tile), QB queries from q0 and KB keys from
    k0; MASK_M / MASK_N: the tile reaches past Lq / Lk, so reads are bounded."""
    if HAS_TAB:
        t = _offset_values(TAB, stab, h, qi, kj, q0, k0, LQ, LK, QB, KB, HAS_TAB, MASK_M, MASK_N)
        if PIECES > 0:
            t, _x, _piece, _slope, _den = _piecewise(t, qi, h, LQ, DEN, PW, MASK_M, PIECES, LOGKP, HAS_TAB == 2)
        if HAS_KEEP:
            t = t * _load_1d(KEEPQ, qi, LQ, MASK_M, 0.0) * _load_1d(KEEPK, kj, LK, MASK_N, 0.0)
        s += t * LOG2E_C
    if NSEG > 0:
        sq = _load_1d(QSEG + b * sqs, qi, LQ, MASK_M, 0)
        sk = _load_1d(KSEG + b * sks, kj, LK, MASK_N, 0)
        ok = (sq >= 0) & (sq < NSEG)
        for c in tl.static_range(NSEG):
            row = tl.load(SEGT + h * sseg + sq * NSEG + c, mask=ok, other=0.0) * LOG2E_C  # Ŝ[h, σ_i, c]
            s += tl.where(sk == c, row, 0.0)
    if MASK_KIND == 1:  # one additive value per key (padding)
        at = MASK + b * smb + h * smh + kj * smn
        if MASK_N:
            mv = tl.load(at, mask=kj < LK, other=0.0).to(tl.float32)
        else:
            mv = tl.load(at).to(tl.float32)
        s += tl.maximum(mv, MASK_FLOOR) * LOG2E_C
    if MASK_KIND == 2:  # a dense (Lq, Lk) additive mask
        at = MASK + b * smb + h * smh + qi * smm + kj * smn
        if MASK_M or MASK_N:
            mv = tl.load(at, mask=(qi < LQ) & (kj < LK), other=0.0).to(tl.float32)
        else:
            mv = tl.load(at).to(tl.float32)
        s += tl.maximum(mv, MASK_FLOOR) * LOG2E_C
    return s


@triton.jit
def _kept(seed, bh, offs_m, start, LQ, p_drop, BM: tl.constexpr, BN: tl.constexpr):
    """Attention dropout's keep mask for a (BM, BN) tile of queries offs_m and keys start + [0, BN): Philox
    at 32-bit counters (row of (b, h, i), group of four keys); one call's four words are the four keys'
    uniforms, so the backward draws the same mask again."""
    rows = bh * LQ + offs_m
    groups = start // 4 + tl.arange(0, BN // 4)
    c0 = rows[:, None] + groups[None, :] * 0
    c1 = groups[None, :] + rows[:, None] * 0
    z = c0 * 0
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, z, z)
    r = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BM, BN))  # key 4g + w: word w
    return tl.uint_to_uniform_float(r) >= p_drop


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


@triton.jit
def _tile_live(MASK, b, h, qi, kj, LQ, LK, smb, smh, smm, smn, MASK_KIND: tl.constexpr, MASK_M: tl.constexpr,
               MASK_N: tl.constexpr):
    """Whether the additive mask leaves a pair of the tile open (a value above MASK_SKIP): a tile wholly of
    padding, or of another packed document, is skipped. qi, kj as in `_add_terms`."""
    if MASK_KIND == 1:
        at = MASK + b * smb + h * smh + kj * smn
        if MASK_N:
            mv = tl.load(at, mask=kj < LK, other=float("-inf"))
        else:
            mv = tl.load(at)
    else:
        at = MASK + b * smb + h * smh + qi * smm + kj * smn
        if MASK_M or MASK_N:
            mv = tl.load(at, mask=(qi < LQ) & (kj < LK), other=float("-inf"))
        else:
            mv = tl.load(at)
    return tl.max(mv.to(tl.float32)) > MASK_SKIP


@triton.jit
def _open_keys(MASK, b, h, LK, smb, smh, smn, BN: tl.constexpr):
    """(first, last) key a per-key mask (padding) leaves open in row b, or (LK, -1) if it blocks every key."""
    first = LK
    last = -1
    for start in range(0, LK, BN):
        kj = start + tl.arange(0, BN)
        mv = tl.load(MASK + b * smb + h * smh + kj * smn, mask=kj < LK, other=float("-inf")).to(tl.float32)
        is_open = mv > MASK_SKIP
        first = tl.minimum(first, tl.min(tl.where(is_open, kj, LK)))
        last = tl.maximum(last, tl.max(tl.where(is_open, kj, -1)))
    return first, last


@triton.jit
def _query_block(LONGEST: tl.constexpr):
    """This program's query block. LONGEST (causal attention, where block m reads m + 1 key blocks): the last
    block first, so the grid's last wave holds the shortest programs, not the longest (FlashAttention-3's
    longest-processing-time-first order for causal attention); each block's results are the same bits."""
    pid = tl.program_id(0)
    if LONGEST:
        pid = tl.num_programs(0) - 1 - pid
    return pid


@triton.jit
def _key_range(MASK, b, h, LK, smb, smh, smn, lo_query, hi, full, BN: tl.constexpr, CAUSAL: tl.constexpr):
    """(lo, hi, full) of a query block's key loop under a padding mask: from the first open key's block to the
    last's, where every query of the block (from lo_query on) sees an open key; unchanged where one sees none."""
    first, last = _open_keys(MASK, b, h, LK, smb, smh, smn, BN)
    if CAUSAL:
        every_row = first <= lo_query  # query i sees keys <= i
    else:
        every_row = first < LK
    end = tl.where(every_row, tl.cdiv(last + 1, BN) * BN, hi)
    return tl.where(every_row, (first // BN) * BN, 0), tl.minimum(hi, end), tl.minimum(full, end)


@triton.jit
def _key_loop(MASK, b, h, LK, smb, smh, smn, pid_m, BM: tl.constexpr, BN: tl.constexpr, MASK_KIND: tl.constexpr,
              CAUSAL: tl.constexpr, EVEN_N: tl.constexpr):
    """(lo, full, hi): query block pid_m's key blocks run from lo to hi, those before `full` wholly inside Lk and
    below the causal diagonal (no masks); above the diagonal skipped; under padding, only the blocks between
    its first and last open key."""
    hi = LK
    if EVEN_N:
        full = LK
    else:
        full = (LK // BN) * BN  # key blocks inside Lk
    if CAUSAL:
        hi = tl.minimum(LK, (pid_m + 1) * BM)
        full = tl.minimum(full, ((pid_m * BM + 1) // BN) * BN)  # every key <= the block's first query
    lo = 0
    if MASK_KIND == 1:
        lo, hi, full = _key_range(MASK, b, h, LK, smb, smh, smn, pid_m * BM, hi, full, BN, CAUSAL)
    return lo, full, hi


@triton.jit
def _forward_tile(acc, l_i, m_i, q1, q2, start, offs_m, k_base, k2_base, v_base, skn, sk2n, svn, b, h, bh, LQ, LK, DQ,
                  DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks,
                  MASK, smb, smh, smm, smn, DEN, PW, BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr,
                  D2: tl.constexpr, DVP: tl.constexpr, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr,
                  NSEG: tl.constexpr, MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr,
                  DROPOUT: tl.constexpr, PREC: tl.constexpr, MASK_M: tl.constexpr, MASK_N: tl.constexpr,
                  MASK_D: tl.constexpr, DIAG: tl.constexpr):
    """One key block of the online softmax: (acc, l, m) updated."""
    offs_n = start + tl.arange(0, BN)
    k1, k2 = _load_halves(k_base, k2_base, offs_n, skn, sk2n, LK, DQ, DQ2, D1, D2, MASK_N, MASK_D)
    s = _scores(q1, q2, k1, k2, D2, PREC) * qk_scale
    s = _add_terms(s, offs_m[:, None], offs_n[None, :], tl.min(offs_m), start, b, h, LQ, LK, TAB, stab, KEEPQ,
                   KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, HAS_TAB, HAS_KEEP, NSEG,
                   MASK_KIND, PIECES, LOGKP, MASK_M, MASK_N, BM, BN)
    if MASK_N:
        s = tl.where(offs_n[None, :] < LK, s, float("-inf"))
    if DIAG:
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_2d(v_base, offs_n, svn, LK, tl.arange(0, DVP), DV_, MASK_N, MASK_D)
    if DROPOUT:  # the normaliser l_i sums the kept and the dropped alike
        p = tl.where(_kept(seed, bh, offs_m, start, LQ, p_drop, BM, BN), p * inv_keep, 0.0)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PREC)
    return acc, l_i, m_new


@triton.jit
def _forward_block(acc, l_i, m_i, q1, q2, start, offs_m, k_base, k2_base, v_base, skn, sk2n, svn, b, h, bh, LQ, LK, DQ,
                   DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG,
                   sks, MASK, smb, smh, smm, smn, DEN, PW, BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr,
                   D2: tl.constexpr, DVP: tl.constexpr, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr,
                   NSEG: tl.constexpr, MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr,
                   DROPOUT: tl.constexpr, PREC: tl.constexpr, MASK_M: tl.constexpr, MASK_N: tl.constexpr,
                   MASK_D: tl.constexpr, DIAG: tl.constexpr, SKIP: tl.constexpr):
    """`_forward_tile`, or nothing for a tile the mask wholly blocks (SKIP: a query block whose every query sees
    some key, where such a tile's weights are exactly 0)."""
    if SKIP:
        if _tile_live(MASK, b, h, offs_m[:, None], (start + tl.arange(0, BN))[None, :], LQ, LK, smb, smh, smm, smn,
                      MASK_KIND, MASK_M, MASK_N):
            acc, l_i, m_i = _forward_tile(acc, l_i, m_i, q1, q2, start, offs_m, k_base, k2_base, v_base, skn, sk2n, svn,
                                          b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab,
                                          KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN,
                                          PW, BM, BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP,
                                          DROPOUT, PREC, MASK_M, MASK_N, MASK_D, DIAG)
    else:
        acc, l_i, m_i = _forward_tile(acc, l_i, m_i, q1, q2, start, offs_m, k_base, k2_base, v_base, skn, sk2n, svn, b,
                                      h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ,
                                      KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM,
                                      BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, DROPOUT, PREC,
                                      MASK_M, MASK_N, MASK_D, DIAG)
    return acc, l_i, m_i


@triton.jit
def _forward_rows(q1, q2, offs_m, pid_m, k_base, k2_base, v_base, skn, sk2n, svn, b, h, bh, LQ, LK, DQ, DQ2, DV_,
                  qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK,
                  smb, smh, smm, smn, DEN, PW, BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr,
                  DVP: tl.constexpr, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
                  MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr, CAUSAL: tl.constexpr,
                  DROPOUT: tl.constexpr, PREC: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                  EVEN_D: tl.constexpr, SKIP: tl.constexpr):
    """(acc, l, m) of one query block over every key block: those wholly below the causal diagonal and inside Lk
    without masks, the rest with them; blocks above the diagonal skipped."""
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DVP], tl.float32)
    lo, full, hi = _key_loop(MASK, b, h, LK, smb, smh, smn, pid_m, BM, BN, MASK_KIND, CAUSAL, EVEN_N)
    for start in range(lo, full, BN):
        acc, l_i, m_i = _forward_block(acc, l_i, m_i, q1, q2, start, offs_m, k_base, k2_base, v_base, skn, sk2n, svn, b,
                                       h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ,
                                       KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM,
                                       BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, DROPOUT,
                                       PREC, not EVEN_M, False, not EVEN_D, False, SKIP)
    for start in range(tl.maximum(full, lo), hi, BN):
        acc, l_i, m_i = _forward_block(acc, l_i, m_i, q1, q2, start, offs_m, k_base, k2_base, v_base, skn, sk2n, svn, b,
                                       h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ,
                                       KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM,
                                       BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, DROPOUT,
                                       PREC, not EVEN_M, not EVEN_N, not EVEN_D, CAUSAL, SKIP)
    return acc, l_i, m_i


@triton.jit
def _forward_kernel(Q, K, V, O, LSE, TAB, KEEPQ, KEEPK, SEGT, QSEG, KSEG, MASK, DEN, PW, Q2, K2,
                    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, sq2b, sq2h, sq2m, sk2b, sk2h, sk2n,
                    stab, sseg, sqs, sks, smb, smh, smm, smn, skq, skk, sdn,
                    H, LQ, LK, DQ, DQ2, DV_, qk_scale, SEED, p_drop, inv_keep,
                    BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DVP: tl.constexpr,
                    HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
                    MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr, CAUSAL: tl.constexpr,
                    DROPOUT: tl.constexpr, PREC: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                    EVEN_D: tl.constexpr, LONGEST: tl.constexpr = False):
    """One block of BM queries of one (batch row, head) against every key block: FlashAttention-2's forward.
    With a mask, key blocks it wholly blocks are skipped; if a query then saw nothing (every key blocked), the
    block runs again without skipping, as the equation has it (softmax over the blocked scores)."""
    pid_m = _query_block(LONGEST)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    KEEPQ, KEEPK, DEN = KEEPQ + b * skq, KEEPK + b * skk, DEN + b * sdn  # per example, or shared (stride 0)
    seed = _seed(SEED, DROPOUT)
    offs_m = pid_m * BM + tl.arange(0, BM)
    q_base, k_base, v_base = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    q2_base, k2_base = Q2 + b * sq2b + h * sq2h, K2 + b * sk2b + h * sk2h
    q1, q2 = _load_halves(q_base, q2_base, offs_m, sqm, sq2m, LQ, DQ, DQ2, D1, D2, not EVEN_M, not EVEN_D)
    acc, l_i, m_i = _forward_rows(q1, q2, offs_m, pid_m, k_base, k2_base, v_base, skn, sk2n, svn, b, h, bh, LQ, LK, DQ,
                                  DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG,
                                  sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM, BN, D1, D2, DVP, HAS_TAB,
                                  HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, CAUSAL, DROPOUT, PREC, EVEN_M, EVEN_N,
                                  EVEN_D, MASK_KIND == 2)
    if MASK_KIND == 2:
        if tl.min(tl.where(offs_m < LQ, l_i, 1.0)) == 0.0:
            acc, l_i, m_i = _forward_rows(q1, q2, offs_m, pid_m, k_base, k2_base, v_base, skn, sk2n, svn, b, h, bh, LQ,
                                          LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK,
                                          SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM, BN,
                                          D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, CAUSAL,
                                          DROPOUT, PREC, EVEN_M, EVEN_N, EVEN_D, False)
    acc = acc / l_i[:, None]
    _store_2d(O + b * sob + h * soh, offs_m, som, LQ, tl.arange(0, DVP), DV_, acc.to(O.dtype.element_ty),
              not EVEN_M, not EVEN_D)
    lse = m_i + tl.math.log2(l_i)
    if EVEN_M:
        tl.store(LSE + bh * LQ + offs_m, lse)
    else:
        tl.store(LSE + bh * LQ + offs_m, lse, mask=offs_m < LQ)


@triton.jit
def _diagonal_sums(x, BLK: tl.constexpr):
    """Sums of a (BLK, BLK) tile along its diagonals r - c: (lower, upper), lower[t] on r - c = t - BLK + 1 and
    upper[t] on r - c = t + 1 (upper[BLK - 1] = 0). Each row is sheared by its index with a gather, so a
    diagonal becomes a column."""
    r = tl.arange(0, BLK)[:, None]
    t = tl.arange(0, BLK)[None, :]
    c_lo = r + (BLK - 1) - t
    lower = tl.sum(tl.where(c_lo < BLK, tl.gather(x, tl.minimum(c_lo, BLK - 1), 1), 0.0), 0)
    c_hi = r - 1 - t
    upper = tl.sum(tl.where(c_hi >= 0, tl.gather(x, tl.maximum(c_hi, 0), 1), 0.0), 0)
    return lower, upper


@triton.jit
def _segment_rows(seg, ds, sk, NSEG: tl.constexpr, NSEG2P: tl.constexpr):
    """seg[i, c] + Σ_j dS_ij over the tile's keys in segment c: sums along a row, within a warp; the sums over
    the queries' segments, across warps, wait for the end of the key loop (`_segment_pairs`)."""
    col = tl.arange(0, NSEG2P)[None, :]
    for c in tl.static_range(NSEG):
        seg += tl.where(col == c, tl.sum(tl.where(sk[None, :] == c, ds, 0.0), 1)[:, None], 0.0)
    return seg


@triton.jit
def _segment_pairs(seg, sq, NSEG: tl.constexpr, NSEG2P: tl.constexpr):
    """Σ dS over each segment pair (a, c) of the program's rows, flattened a·NSEG + c into NSEG2P slots, from
    `_segment_rows`' per-query sums."""
    slot = tl.arange(0, NSEG2P)
    out = tl.zeros([NSEG2P], tl.float32)
    for a in tl.static_range(NSEG):
        by_key = tl.sum(tl.where(sq[:, None] == a, seg, 0.0), 0)  # (NSEG2P,): column c holds pair (a, c)
        for c in tl.static_range(NSEG):
            out += tl.where(slot == a * NSEG + c, tl.sum(tl.where(slot == c, by_key, 0.0)), 0.0)
    return out


@triton.jit
def _dscores(s, lse, delta, do, v, offs_m, offs_n, start, bh, LQ, LK, seed, p_drop, inv_keep, BM: tl.constexpr,
             BN: tl.constexpr, MASK_N: tl.constexpr, DIAG: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr):
    """dL/dS of a (BM, BN) tile from its scores (log2 units, terms added): P recomputed from the log-sum-exp, keys
    past Lk (MASK_N) and above the causal diagonal (DIAG) zeroed, dP = dO·Vᵀ under dropout's mask."""
    p = tl.math.exp2(s - lse[:, None])  # rows past Lq: lse = inf, p = 0
    if MASK_N:
        p = tl.where(offs_n[None, :] < LK, p, 0.0)
    if DIAG:
        p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    dp = _dot(do, tl.trans(v), PREC)
    if DROPOUT:
        dp = tl.where(_kept(seed, bh, offs_m, start, LQ, p_drop, BM, BN), dp * inv_keep, 0.0)
    return p * (dp - delta[:, None])


@triton.jit
def _dq_tile_body(dq1, dq2, seg, pw_acc, den_acc, q1, q2, do, lse, delta, start, offs_m, k_base, k2_base, v_base,
                  skn, sk2n, svn, b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ,
                  KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM: tl.constexpr,
                  BN: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DVP: tl.constexpr, HAS_TAB: tl.constexpr,
                  HAS_KEEP: tl.constexpr, NSEG: tl.constexpr, NSEG2P: tl.constexpr, MASK_KIND: tl.constexpr,
                  PIECES: tl.constexpr, LOGKP: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
                  TAB_GRAD: tl.constexpr, SEG_GRAD: tl.constexpr, MASK_M: tl.constexpr, MASK_N: tl.constexpr,
                  MASK_D: tl.constexpr, DIAG: tl.constexpr):
    """One key block of the dQ loop: dQ, the tile's dS summed along its diagonals (lower, upper: see
    `_diagonal_sums`), segment pairs and pieces."""
    offs_n = start + tl.arange(0, BN)
    k1, k2 = _load_halves(k_base, k2_base, offs_n, skn, sk2n, LK, DQ, DQ2, D1, D2, MASK_N, MASK_D)
    v = _load_2d(v_base, offs_n, svn, LK, tl.arange(0, DVP), DV_, MASK_N, MASK_D)
    s = _scores(q1, q2, k1, k2, D2, PREC) * qk_scale
    if PIECES > 0:  # the piecewise term as `_add_terms` adds it, its x, piece and slope kept for the gradients
        n = _offset_values(TAB, stab, h, offs_m[:, None], offs_n[None, :], tl.min(offs_m), start, LQ, LK, BM, BN,
                           HAS_TAB, MASK_M, MASK_N)
        f, x, piece, slope, den = _piecewise(n, offs_m[:, None], h, LQ, DEN, PW, MASK_M, PIECES, LOGKP, False)
        if HAS_KEEP:
            f = f * _load_1d(KEEPQ, offs_m, LQ, MASK_M, 0.0)[:, None] \
                * _load_1d(KEEPK, offs_n, LK, MASK_N, 0.0)[None, :]
        s += f * LOG2E_C
    s = _add_terms(s, offs_m[:, None], offs_n[None, :], tl.min(offs_m), start, b, h, LQ, LK, TAB, stab, KEEPQ,
                   KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW,
                   HAS_TAB if PIECES == 0 else 0, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, MASK_M, MASK_N, BM, BN)
    ds = _dscores(s, lse, delta, do, v, offs_m, offs_n, start, bh, LQ, LK, seed, p_drop, inv_keep, BM, BN, MASK_N,
                  DIAG, DROPOUT, PREC)
    dq1 += _dot(ds.to(k1.dtype), k1, PREC)
    if D2 > 0:
        dq2 += _dot(ds.to(k2.dtype), k2, PREC)
    lower = tl.zeros([BN], tl.float32)
    upper = lower
    if TAB_GRAD:
        dt = ds
        if HAS_KEEP:
            dt = ds * _load_1d(KEEPQ, offs_m, LQ, MASK_M, 0.0)[:, None] \
                * _load_1d(KEEPK, offs_n, LK, MASK_N, 0.0)[None, :]
        if PIECES > 0:  # F_h(n / den): dF/dx = slope, dx/dn = 1/den, dx/dden = -x/den
            dx = dt * slope
            den_acc += tl.sum(dx * x, 1)
            pw_acc = _piece_sums(pw_acc, dt, x, piece, PIECES)
            dt = dx / den
        lower, upper = _diagonal_sums(dt, BN)
    if SEG_GRAD:
        sk = _load_1d(KSEG + b * sks, offs_n, LK, MASK_N, 0)
        seg = _segment_rows(seg, ds, sk, NSEG, NSEG2P)
    return dq1, dq2, lower, upper, seg, pw_acc, den_acc


@triton.jit
def _dq_tile(dq1, dq2, carry, seg, pw_acc, den_acc, open_rows, q1, q2, do, lse, delta, start, offs_m, k_base,
             k2_base, v_base, skn, sk2n, svn, part_row, NN, b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop,
             inv_keep, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW,
             BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DVP: tl.constexpr,
             HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr, NSEG2P: tl.constexpr,
             MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr, DROPOUT: tl.constexpr,
             PREC: tl.constexpr, TAB_GRAD: tl.constexpr, SEG_GRAD: tl.constexpr, MASK_M: tl.constexpr,
             MASK_N: tl.constexpr, MASK_D: tl.constexpr, DIAG: tl.constexpr):
    """`_dq_tile_body`, skipped where the mask wholly blocks the tile and every query of the block sees some open
    key (open_rows: its dS is then 0); the finished diagonals written, the lower ones carried (square tiles: the
    next key block's tile continues them)."""
    lower = tl.zeros([BN], tl.float32)
    upper = lower
    if MASK_KIND == 2:
        live = _tile_live(MASK, b, h, offs_m[:, None], (start + tl.arange(0, BN))[None, :], LQ, LK, smb, smh, smm,
                          smn, MASK_KIND, MASK_M, MASK_N).to(tl.int32)
        if live + 1 - open_rows > 0:
            dq1, dq2, lower, upper, seg, pw_acc, den_acc = _dq_tile_body(
                dq1, dq2, seg, pw_acc, den_acc, q1, q2, do, lse, delta, start, offs_m, k_base, k2_base, v_base, skn,
                sk2n, svn, b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK,
                SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM, BN, D1, D2, DVP, HAS_TAB,
                HAS_KEEP, NSEG, NSEG2P, MASK_KIND, PIECES, LOGKP, DROPOUT, PREC, TAB_GRAD, SEG_GRAD, MASK_M, MASK_N,
                MASK_D, DIAG)
    else:
        dq1, dq2, lower, upper, seg, pw_acc, den_acc = _dq_tile_body(
            dq1, dq2, seg, pw_acc, den_acc, q1, q2, do, lse, delta, start, offs_m, k_base, k2_base, v_base, skn,
            sk2n, svn, b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK, SEGT,
            sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM, BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG,
            NSEG2P, MASK_KIND, PIECES, LOGKP, DROPOUT, PREC, TAB_GRAD, SEG_GRAD, MASK_M, MASK_N, MASK_D, DIAG)
    if TAB_GRAD:
        tl.store(part_row + (NN - start // BN) * BN + tl.arange(0, BN), upper + carry)  # finished offsets
        carry = lower
    return dq1, dq2, carry, seg, pw_acc, den_acc


@triton.jit
def _backward_q_kernel(Q, K, V, O, DO, LSE, DELTA, DQ_, PART, SPART, DPART, PWPART, TAB, KEEPQ, KEEPK, SEGT, QSEG, KSEG,
                       MASK, DEN, PW, Q2, K2, DQ2_, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, sdb,
                       sdh, sdm, sgb, sgh, sgm, sq2b, sq2h, sq2m, sk2b, sk2h, sk2n, sg2b, sg2h, sg2m, stab, sseg, sqs,
                       sks, smb, smh, smm, smn, skq, skk, sdn, H, LQ, LK, DQ, DQ2, DV_, qk_scale, scale, SEED, p_drop,
                       inv_keep, NN, W, BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr,
                       DVP: tl.constexpr, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
                       NSEG2P: tl.constexpr, MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr,
                       CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr, TAB_GRAD: tl.constexpr,
                       SEG_GRAD: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                       LONGEST: tl.constexpr = False):
    """rowsum(dO ∘ O) and dQ of one query block of one (batch row, head) by FlashAttention-2's second backward
    loop, and its rows of the tables' partial sums. Runs before the dK/dV kernel, which reads the row sums."""
    pid_m = _query_block(LONGEST)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    KEEPQ, KEEPK, DEN = KEEPQ + b * skq, KEEPK + b * skk, DEN + b * sdn  # per example, or shared (stride 0)
    seed = _seed(SEED, DROPOUT)
    offs_m = pid_m * BM + tl.arange(0, BM)
    d1 = tl.arange(0, D1)
    dv_cols = tl.arange(0, DVP)
    q_base, k_base, v_base = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    q2_base, k2_base = Q2 + b * sq2b + h * sq2h, K2 + b * sk2b + h * sk2h
    q1, q2 = _load_halves(q_base, q2_base, offs_m, sqm, sq2m, LQ, DQ, DQ2, D1, D2, not EVEN_M, not EVEN_D)
    do = _load_2d(DO + b * sdb + h * sdh, offs_m, sdm, LQ, dv_cols, DV_, not EVEN_M, not EVEN_D)
    o = _load_2d(O + b * sob + h * soh, offs_m, som, LQ, dv_cols, DV_, not EVEN_M, not EVEN_D)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    lse = _load_1d(LSE + bh * LQ, offs_m, LQ, not EVEN_M, float("inf"))
    if EVEN_M:
        tl.store(DELTA + bh * LQ + offs_m, delta)
    else:
        tl.store(DELTA + bh * LQ + offs_m, delta, mask=offs_m < LQ)
    dq1 = tl.zeros([BM, D1], tl.float32)
    dq2 = dq1
    if D2 > 0:
        dq2 = tl.zeros([BM, D2], tl.float32)
    carry = tl.zeros([BN], tl.float32)
    seg = tl.zeros([BM, NSEG2P], tl.float32)  # per query and key segment (`_segment_rows`)
    pw_acc = tl.zeros([16], tl.float32)
    if PIECES > 0:
        pw_acc = tl.zeros([4 * PIECES], tl.float32)  # Σ dS and Σ dS·x per piece of F (FIRE's f_θ)
    den_acc = tl.zeros([BM], tl.float32)  # Σ_j dx·x per query
    # every query of the block sees some open key: a tile the mask wholly blocks has dS = 0 and is skipped
    open_rows = (tl.min(tl.where(offs_m < LQ, lse, float("inf"))) > LSE_OPEN).to(tl.int32)
    sq = offs_m
    if SEG_GRAD:
        sq = _load_1d(QSEG + b * sqs, offs_m, LQ, not EVEN_M, 0)
    part_row = PART + (bh.to(tl.int64) * tl.num_programs(0) + pid_m) * W
    # the forward's key loop (under padding the partial rows of the blocks outside it stay zero)
    lo, full, hi = _key_loop(MASK, b, h, LK, smb, smh, smn, pid_m, BM, BN, MASK_KIND, CAUSAL, EVEN_N)
    for start in range(lo, full, BN):
        dq1, dq2, carry, seg, pw_acc, den_acc = _dq_tile(dq1, dq2, carry, seg, pw_acc, den_acc, open_rows, q1, q2, do,
                                                         lse, delta, start, offs_m, k_base, k2_base, v_base, skn,
                                                         sk2n, svn, part_row, NN, b, h, bh, LQ, LK, DQ, DQ2, DV_,
                                                         qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK,
                                                         SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn,
                                                         DEN, PW, BM, BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, NSEG2P,
                                                         MASK_KIND, PIECES, LOGKP, DROPOUT, PREC, TAB_GRAD, SEG_GRAD,
                                                         not EVEN_M, False, not EVEN_D, False)
    for start in range(tl.maximum(full, lo), hi, BN):
        dq1, dq2, carry, seg, pw_acc, den_acc = _dq_tile(dq1, dq2, carry, seg, pw_acc, den_acc, open_rows, q1, q2, do,
                                                         lse, delta, start, offs_m, k_base, k2_base, v_base, skn,
                                                         sk2n, svn, part_row, NN, b, h, bh, LQ, LK, DQ, DQ2, DV_,
                                                         qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK,
                                                         SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn,
                                                         DEN, PW, BM, BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, NSEG2P,
                                                         MASK_KIND, PIECES, LOGKP, DROPOUT, PREC, TAB_GRAD, SEG_GRAD,
                                                         not EVEN_M, not EVEN_N, not EVEN_D, CAUSAL)
    if TAB_GRAD:  # the last tile's lower diagonals: nothing continues them
        tl.store(part_row + (NN - tl.cdiv(hi, BN)) * BN + tl.arange(0, BN), carry)
    dq_base = DQ_ + b * sgb + h * sgh  # dQ has its own strides: q may be a view with gaps (a split of q, k, v)
    _store_2d(dq_base, offs_m, sgm, LQ, d1, DQ, (dq1 * scale).to(DQ_.dtype.element_ty), not EVEN_M, not EVEN_D)
    if D2 > 0:
        _store_2d(DQ2_ + b * sg2b + h * sg2h, offs_m, sg2m, LQ, tl.arange(0, D2), DQ2,
                  (dq2 * scale).to(DQ2_.dtype.element_ty), not EVEN_M, not EVEN_D)
    if SEG_GRAD:
        tl.store(SPART + (bh.to(tl.int64) * tl.num_programs(0) + pid_m) * NSEG2P + tl.arange(0, NSEG2P),
                 _segment_pairs(seg, sq, NSEG, NSEG2P))
    if TAB_GRAD and PIECES > 0:
        _store_piece_partials(PWPART, DPART, DEN, pw_acc, den_acc, bh, pid_m, offs_m, LQ, PIECES, EVEN_M)


@triton.jit
def _kv_tile(dk1, dk2, dv, k1, k2, v, start, n0, offs_n, q_base, q2_base, do_base, sqm, sq2m, sdm, b, h, bh, LQ, LK, DQ,
             DQ2, DV_, qk_scale, seed, p_drop, inv_keep, LSE, DELTA, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs,
             KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr,
             D2: tl.constexpr, DVP: tl.constexpr, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
             MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr, DROPOUT: tl.constexpr,
             PREC: tl.constexpr, MASK_M: tl.constexpr, MASK_N: tl.constexpr, MASK_D: tl.constexpr, DIAG: tl.constexpr):
    """One query block of the dK/dV loop, the tile key-major: (BN keys, BM queries)."""
    offs_m = start + tl.arange(0, BM)
    q1, q2 = _load_halves(q_base, q2_base, offs_m, sqm, sq2m, LQ, DQ, DQ2, D1, D2, MASK_M, MASK_D)
    do = _load_2d(do_base, offs_m, sdm, LQ, tl.arange(0, DVP), DV_, MASK_M, MASK_D)
    lse = _load_1d(LSE + bh * LQ, offs_m, LQ, MASK_M, float("inf"))  # rows past Lq: p = 0
    delta = _load_1d(DELTA + bh * LQ, offs_m, LQ, MASK_M, 0.0)
    st = _scores(k1, k2, q1, q2, D2, PREC) * qk_scale  # Sᵀ
    st = _add_terms(st, offs_m[None, :], offs_n[:, None], start, n0, b, h, LQ, LK, TAB, stab, KEEPQ, KEEPK, SEGT,
                    sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND,
                    PIECES, LOGKP, MASK_M, MASK_N, BM, BN)
    pt = tl.math.exp2(st - lse[None, :])
    if DIAG:
        pt = tl.where(offs_m[None, :] >= offs_n[:, None], pt, 0.0)
    dpt = _dot(v, tl.trans(do), PREC)
    if DROPOUT:  # O = (P ∘ Z / (1 - p)) V: dV sees the dropped P, dP the mask
        kept = tl.trans(_kept(seed, bh, offs_m, n0, LQ, p_drop, BM, BN))
        dv += _dot(tl.where(kept, pt * inv_keep, 0.0).to(do.dtype), do, PREC)
        dpt = tl.where(kept, dpt * inv_keep, 0.0)
    else:
        dv += _dot(pt.to(do.dtype), do, PREC)
    dst = pt * (dpt - delta[None, :])
    dk1 += _dot(dst.to(q1.dtype), q1, PREC)
    if D2 > 0:
        dk2 += _dot(dst.to(q2.dtype), q2, PREC)
    return dk1, dk2, dv


@triton.jit
def _kv_block(dk1, dk2, dv, k1, k2, v, start, n0, offs_n, q_base, q2_base, do_base, sqm, sq2m, sdm, b, h, bh, LQ, LK,
              DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, LSE, DELTA, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG,
              sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr,
              D2: tl.constexpr, DVP: tl.constexpr, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr,
              MASK_KIND: tl.constexpr, PIECES: tl.constexpr, LOGKP: tl.constexpr, DROPOUT: tl.constexpr,
              PREC: tl.constexpr, MASK_M: tl.constexpr, MASK_N: tl.constexpr, MASK_D: tl.constexpr, DIAG: tl.constexpr):
    """`_kv_tile`, skipped where the mask wholly blocks the tile and every one of its queries sees some open key
    (its log-sum-exp above LSE_OPEN): P and dS are 0 there."""
    if MASK_KIND == 2:
        offs_m = start + tl.arange(0, BM)
        lse = _load_1d(LSE + bh * LQ, offs_m, LQ, MASK_M, float("inf"))
        open_rows = (tl.min(lse) > LSE_OPEN).to(tl.int32)
        live = _tile_live(MASK, b, h, offs_m[None, :], offs_n[:, None], LQ, LK, smb, smh, smm, smn, MASK_KIND,
                          MASK_M, MASK_N).to(tl.int32)
        if live + 1 - open_rows > 0:
            dk1, dk2, dv = _kv_tile(dk1, dk2, dv, k1, k2, v, start, n0, offs_n, q_base, q2_base, do_base, sqm, sq2m,
                                    sdm, b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, LSE, DELTA,
                                    TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn,
                                    DEN, PW, BM, BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP,
                                    DROPOUT, PREC, MASK_M, MASK_N, MASK_D, DIAG)
    else:
        dk1, dk2, dv = _kv_tile(dk1, dk2, dv, k1, k2, v, start, n0, offs_n, q_base, q2_base, do_base, sqm, sq2m, sdm, b,
                                h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, LSE, DELTA, TAB, stab,
                                KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN, PW, BM,
                                BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, DROPOUT, PREC,
                                MASK_M, MASK_N, MASK_D, DIAG)
    return dk1, dk2, dv


@triton.jit
def _backward_kv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, TAB, KEEPQ, KEEPK, SEGT, QSEG, KSEG, MASK, DEN, PW, Q2, K2,
                        DK2, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdb, sdh, sdm, sgkb, sgkh, sgkn, sgvb, sgvh,
                        sgvn, sq2b, sq2h, sq2m, sk2b, sk2h, sk2n, sgk2b, sgk2h, sgk2n, stab, sseg, sqs, sks, smb, smh,
                        smm, smn, skq, skk, sdn, H, LQ, LK, DQ, DQ2, DV_, qk_scale, scale, SEED, p_drop, inv_keep,
                        BM: tl.constexpr, BN: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DVP: tl.constexpr,
                        HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr, NSEG: tl.constexpr, MASK_KIND: tl.constexpr,
                        PIECES: tl.constexpr, LOGKP: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
                        PREC: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr):
    """dK, dV of one key block of one (batch row, head), by FlashAttention-2's first backward loop. Query
    blocks wholly above the causal diagonal are skipped, those below it and inside Lq run without masks."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    KEEPQ, KEEPK, DEN = KEEPQ + b * skq, KEEPK + b * skk, DEN + b * sdn  # per example, or shared (stride 0)
    seed = _seed(SEED, DROPOUT)
    n0 = pid_n * BN
    offs_n = n0 + tl.arange(0, BN)
    d1 = tl.arange(0, D1)
    dv_cols = tl.arange(0, DVP)
    q_base, k_base, v_base = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    q2_base, k2_base = Q2 + b * sq2b + h * sq2h, K2 + b * sk2b + h * sk2h
    do_base = DO + b * sdb + h * sdh
    k1, k2 = _load_halves(k_base, k2_base, offs_n, skn, sk2n, LK, DQ, DQ2, D1, D2, not EVEN_N, not EVEN_D)
    v = _load_2d(v_base, offs_n, svn, LK, dv_cols, DV_, not EVEN_N, not EVEN_D)
    dk1 = tl.zeros([BN, D1], tl.float32)
    dk2 = dk1
    if D2 > 0:
        dk2 = tl.zeros([BN, D2], tl.float32)
    dv = tl.zeros([BN, DVP], tl.float32)
    if EVEN_M:
        end = LQ
    else:
        end = (LQ // BM) * BM  # query blocks inside Lq
    lo = 0
    mid = 0
    stop = LQ
    if CAUSAL:
        lo = (n0 // BM) * BM  # query blocks before it see none of these keys
        mid = tl.minimum(tl.cdiv(n0 + BN - 1, BM) * BM, LQ)  # from here every query sees every key
    if MASK_KIND == 1:  # keys wholly padded, seen only by queries that see an open key: P = 0, nothing to add
        first, _last = _open_keys(MASK, b, h, LK, smb, smh, smn, BN)
        if CAUSAL:
            every_row = first <= n0  # each query that sees these keys (i >= n0) sees an open one
        else:
            every_row = first < LK
        own = tl.load(MASK + b * smb + h * smh + offs_n * smn, mask=offs_n < LK, other=float("-inf"))
        skip = every_row & (tl.max(own.to(tl.float32)) <= MASK_SKIP)
        lo, mid, end, stop = (tl.where(skip, 0, lo), tl.where(skip, 0, mid), tl.where(skip, 0, end),
                              tl.where(skip, 0, stop))
    for start in range(lo, mid, BM):
        dk1, dk2, dv = _kv_block(dk1, dk2, dv, k1, k2, v, start, n0, offs_n, q_base, q2_base, do_base, sqm, sq2m, sdm,
                                 b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, LSE, DELTA, TAB,
                                 stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN,
                                 PW, BM, BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, DROPOUT,
                                 PREC, not EVEN_M, not EVEN_N, not EVEN_D, True)
    for start in range(mid, end, BM):
        dk1, dk2, dv = _kv_block(dk1, dk2, dv, k1, k2, v, start, n0, offs_n, q_base, q2_base, do_base, sqm, sq2m, sdm,
                                 b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, LSE, DELTA, TAB,
                                 stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN,
                                 PW, BM, BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, DROPOUT,
                                 PREC, False, not EVEN_N, not EVEN_D, False)
    for start in range(tl.maximum(mid, end), stop, BM):
        dk1, dk2, dv = _kv_block(dk1, dk2, dv, k1, k2, v, start, n0, offs_n, q_base, q2_base, do_base, sqm, sq2m, sdm,
                                 b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, LSE, DELTA, TAB,
                                 stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, DEN,
                                 PW, BM, BN, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, PIECES, LOGKP, DROPOUT,
                                 PREC, True, not EVEN_N, not EVEN_D, False)
    _store_2d(DK + b * sgkb + h * sgkh, offs_n, sgkn, LK, d1, DQ, (dk1 * scale).to(DK.dtype.element_ty),
              not EVEN_N, not EVEN_D)
    if D2 > 0:
        _store_2d(DK2 + b * sgk2b + h * sgk2h, offs_n, sgk2n, LK, tl.arange(0, D2), DQ2,
                  (dk2 * scale).to(DK2.dtype.element_ty), not EVEN_N, not EVEN_D)
    _store_2d(DV + b * sgvb + h * sgvh, offs_n, sgvn, LK, dv_cols, DV_, dv.to(DV.dtype.element_ty), not EVEN_N,
              not EVEN_D)


@triton.jit
def _offset_sum_kernel(PART, OUT, B, H, NM, NN, W, NOFF, LK, BLK: tl.constexpr, RB: tl.constexpr,
                       CAUSAL: tl.constexpr):
    """dT[h, o] = Σ_b Σ_m PART[b, h, m, o - Lk + (NN - m)·BLK]: every query block's partial row, added in a
    fixed order (query block m wrote table index o at o - Lk + (NN - m)·BLK; under causality it wrote from
    (NN - min(NN, m + 1))·BLK on)."""
    h = tl.program_id(0)
    o = tl.program_id(1) * RB + tl.arange(0, RB)
    acc = tl.zeros([RB], tl.float32)
    for b in range(B):
        for m in range(NM):
            p = o - LK + (NN - m) * BLK
            lo = 0
            if CAUSAL:
                lo = (NN - tl.minimum(NN, m + 1)) * BLK
            row = PART + ((b * H + h).to(tl.int64) * NM + m) * W
            acc += tl.load(row + p, mask=(p >= lo) & (p < W) & (o < NOFF), other=0.0)
    tl.store(OUT + h * NOFF + o, acc, mask=o < NOFF)


@triton.jit
def _band_tile(acc, m, start, q_base, q2_base, k_base, k2_base, v_base, DO, LSE, DELTA, sqm, sq2m, skn, sk2n, svn, sdm,
               b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed, p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK, SEGT, sseg,
               QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, BLK: tl.constexpr, D1: tl.constexpr,
               D2: tl.constexpr, DVP: tl.constexpr, HAS_TAB: tl.constexpr, HAS_KEEP: tl.constexpr,
               NSEG: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
               PREC: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr):
    """acc + dS (times TUPE's keep) of the tile of query block m and the keys from `start`, recomputed as the
    dQ kernel computes it."""
    offs_m = m * BLK + tl.arange(0, BLK)
    offs_n = start + tl.arange(0, BLK)
    q1, q2 = _load_halves(q_base, q2_base, offs_m, sqm, sq2m, LQ, DQ, DQ2, D1, D2, not EVEN_M, not EVEN_D)
    k1, k2 = _load_halves(k_base, k2_base, offs_n, skn, sk2n, LK, DQ, DQ2, D1, D2, not EVEN_N, not EVEN_D)
    do = _load_2d(DO, offs_m, sdm, LQ, tl.arange(0, DVP), DV_, not EVEN_M, not EVEN_D)
    v = _load_2d(v_base, offs_n, svn, LK, tl.arange(0, DVP), DV_, not EVEN_N, not EVEN_D)
    lse = _load_1d(LSE + bh * LQ, offs_m, LQ, not EVEN_M, float("inf"))
    delta = _load_1d(DELTA + bh * LQ, offs_m, LQ, not EVEN_M, 0.0)
    s = _scores(q1, q2, k1, k2, D2, PREC) * qk_scale
    s = _add_terms(s, offs_m[:, None], offs_n[None, :], m * BLK, start, b, h, LQ, LK, TAB, stab, KEEPQ, KEEPK, SEGT,
                   sseg, QSEG, sqs, KSEG, sks, MASK, smb, smh, smm, smn, TAB, TAB, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND,
                   0, 0, not EVEN_M, not EVEN_N, BLK, BLK)
    ds = _dscores(s, lse, delta, do, v, offs_m, offs_n, start, bh, LQ, LK, seed, p_drop, inv_keep, BLK, BLK,
                  not EVEN_N, CAUSAL, DROPOUT, PREC)
    if HAS_KEEP:
        ds = ds * _load_1d(KEEPQ, offs_m, LQ, not EVEN_M, 0.0)[:, None] \
            * _load_1d(KEEPK, offs_n, LK, not EVEN_N, 0.0)[None, :]
    return acc + ds


@triton.jit
def _band_kernel(Q, K, V, DO, LSE, DELTA, PART, TAB, KEEPQ, KEEPK, SEGT, QSEG, KSEG, MASK, Q2, K2, sqb, sqh, sqm, skb,
                 skh, skn, svb, svh, svn, sdb, sdh, sdm, sq2b, sq2h, sq2m, sk2b, sk2h, sk2n, stab, sseg, sqs, sks, smb,
                 smh, smm, smn, skq, skk, H, LQ, LK, DQ, DQ2, DV_, qk_scale, SEED, p_drop, inv_keep, NM, NN, NCH, CH,
                 BLK: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DVP: tl.constexpr, HAS_TAB: tl.constexpr,
                 HAS_KEEP: tl.constexpr, NSEG: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
                 DROPOUT: tl.constexpr, PREC: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
                 EVEN_D: tl.constexpr):
    """The offset table's partial gradients by block diagonals: program (band·NCH + chunk, batch row·head)
    recomputes dS on up to CH tiles (m, n) of one block diagonal m - n = δ, whose pairs all lie on the
    offsets δ·BLK + (r - c), so it adds the tiles as they are and shears once, at the end (`_diagonal_sums`),
    where the dQ kernel's rows path shears every tile. Skips a tile the mask wholly blocks (padding, another
    packed document) where every query of its block sees some open key: its dS is 0, and its keys are never
    read. Writes (lower, upper) to its own slots."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    KEEPQ, KEEPK = KEEPQ + b * skq, KEEPK + b * skk
    seed = _seed(SEED, DROPOUT)
    diag = pid // NCH - (NN - 1)  # m - n
    first = tl.maximum(0, diag) + (pid % NCH) * CH
    last = tl.minimum(tl.minimum(NM, NN + diag), first + CH)
    if CAUSAL:  # blocks above the diagonal hold no open pair
        last = tl.where(diag < 0, first, last)
    q_base, k_base, v_base = Q + b * sqb + h * sqh, K + b * skb + h * skh, V + b * svb + h * svh
    q2_base, k2_base = Q2 + b * sq2b + h * sq2h, K2 + b * sk2b + h * sk2h
    acc = tl.zeros([BLK, BLK], tl.float32)
    for m in range(first, last):
        start = (m - diag) * BLK
        live = 1
        if MASK_KIND > 0:  # as the dQ kernel: a tile the mask wholly blocks, where every query sees an open key
            rows = m * BLK + tl.arange(0, BLK)
            lse = _load_1d(LSE + bh * LQ, rows, LQ, not EVEN_M, float("inf"))
            open_rows = (tl.min(tl.where(rows < LQ, lse, float("inf"))) > LSE_OPEN).to(tl.int32)
            live = _tile_live(MASK, b, h, rows[:, None], (start + tl.arange(0, BLK))[None, :], LQ, LK, smb, smh,
                              smm, smn, MASK_KIND, not EVEN_M, not EVEN_N).to(tl.int32) | (1 - open_rows)
        if live > 0:
            acc = _band_tile(acc, m, start, q_base, q2_base, k_base, k2_base, v_base, DO + b * sdb + h * sdh, LSE,
                             DELTA, sqm, sq2m, skn, sk2n, svn, sdm, b, h, bh, LQ, LK, DQ, DQ2, DV_, qk_scale, seed,
                             p_drop, inv_keep, TAB, stab, KEEPQ, KEEPK, SEGT, sseg, QSEG, sqs, KSEG, sks, MASK, smb,
                             smh, smm, smn, BLK, D1, D2, DVP, HAS_TAB, HAS_KEEP, NSEG, MASK_KIND, CAUSAL, DROPOUT,
                             PREC, EVEN_M, EVEN_N, EVEN_D)
    row = PART + (bh.to(tl.int64) * tl.num_programs(0) + pid) * (2 * BLK)
    lower = tl.zeros([BLK], tl.float32)
    upper = lower
    if last > first:  # a chunk past its diagonal's end (most of a short diagonal's) has nothing to shear
        lower, upper = _diagonal_sums(acc, BLK)
    tl.store(row + tl.arange(0, BLK), lower)
    tl.store(row + BLK + tl.arange(0, BLK), upper)


@triton.jit
def _band_sum_kernel(PART, OUT, B, H, NB, NCH, NN, NOFF, LK, BLK: tl.constexpr, RB: tl.constexpr):
    """dT[h, o] = Σ_b Σ_chunk (band δ's lower sums + band δ - 1's upper sums) at t, in a fixed order: the offset
    d = o - Lk + 1 lies in band δ = ⌈d / BLK⌉'s lower half at t = d - δ·BLK + BLK - 1, and at the same t in
    band δ - 1's upper half (band index δ + NN - 1; `_band_kernel`'s layout)."""
    h = tl.program_id(0)
    o = tl.program_id(1) * RB + tl.arange(0, RB)
    d = o - (LK - 1)
    band = (d + NN * BLK - 1) // BLK  # >= 0: d >= 1 - Lk >= 1 - NN·BLK
    t = d + (NN - band) * BLK - 1
    inside = o < NOFF
    acc = tl.zeros([RB], tl.float32)
    for b in range(B):
        for chunk in range(NCH):
            base = PART + (((b * H + h).to(tl.int64) * NB) * NCH + chunk) * (2 * BLK)
            acc += tl.load(base + band * NCH * (2 * BLK) + t, mask=inside & (band < NB), other=0.0)
            acc += tl.load(base + (band - 1) * NCH * (2 * BLK) + BLK + t, mask=inside & (band >= 1), other=0.0)
    tl.store(OUT + h * NOFF + o, acc, mask=inside)


@triton.jit
def _seed(SEED, DROPOUT: tl.constexpr):
    """Attention dropout's Philox seed, read from memory at each launch (a CUDA graph's replay reads the one its
    own draw wrote); 0 without dropout, where SEED is any pointer and is not read."""
    if DROPOUT:
        return tl.load(SEED)
    else:
        return 0


@triton.jit
def _keep_mask_kernel(OUT, SEED, p_drop, LQ, LK, BM: tl.constexpr, BN: tl.constexpr):
    """The dropout mask the attention kernels draw, written out (for tests)."""
    seed = tl.load(SEED)
    bh = tl.program_id(2)
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    start = tl.program_id(1) * BN
    offs_n = start + tl.arange(0, BN)
    ok = (offs_m[:, None] < LQ) & (offs_n[None, :] < LK)
    kept = _kept(seed, bh, offs_m, start, LQ, p_drop, BM, BN)
    tl.store(OUT + (bh.to(tl.int64) * LQ + offs_m[:, None]) * LK + offs_n[None, :], kept.to(tl.int8), mask=ok)


def dropout_keep(seed: int | Tensor, p: float, b: int, h: int, lq: int, lk: int, device) -> Tensor:
    """(B, H, Lq, Lk) booleans: which pairs the kernels keep under dropout p with this seed."""
    out = torch.empty(b, h, lq, lk, dtype=torch.int8, device=device)
    _keep_mask_kernel[(triton.cdiv(lq, 16), triton.cdiv(lk, 16), b * h)](out, _seed_tensor(seed, device), p, lq, lk,
                                                                          BM=16, BN=16)
    return out.bool()


# -- the host side ------------------------------------------------------------------------------------------


@dataclass
class Extras:
    """What the kernel reads beside q, k, v and the two learned tables, none of it with a gradient.

    q_keep (Lq,), k_keep (Lk,) or per example (B, Lq), (B, Lk): 0/1 multipliers of the offset table (TUPE's
    reset), or None; q_segments (B|1, Lq), k_segments (B|1, Lk) integers, with the segment table; mask:
    additive (B|1, H|1, 1, Lk) per key or (B|1, H|1, Lq, Lk) dense, or None; causal: query i sees keys j <= i
    (Lq = Lk)."""

    q_keep: Tensor | None = None
    k_keep: Tensor | None = None
    q_segments: Tensor | None = None
    k_segments: Tensor | None = None
    mask: Tensor | None = None
    causal: bool = False
    #: attention dropout: the probability and the Philox seed, an int or a 1-element int64 tensor (`dropout_seed`),
    #: which the kernels read at launch (the backward draws the same mask)
    dropout: float = 0.0
    seed: int | Tensor = 0
    #: a piecewise-linear F_h of x = T[h, i - j + Lk - 1] / den_i in place of T's value (see `fused_attention`):
    #: den (Lq,) or per example (B, Lq) float32; pieces, `pack_pieces`'s buffer of the sorted kinks and each
    #: head's slopes and intercepts; slots, its kink slots (a power of two); n_pieces, the pieces (kinks + 1)
    den: Tensor | None = None
    pieces: Tensor | None = None
    slots: int = 0
    n_pieces: int = 0
    #: low-rank factors folded in as a second head part read from their own tensors, (B|1, H|1, Lq, r) and
    #: (B|1, H|1, Lk, r): the scores gain q2·k2ᵀ·scale (set by `FusedAttention`, whose inputs they are)
    q2: Tensor | None = None
    k2: Tensor | None = None
    #: the output and q, k, v's gradients laid out token-major where their inputs are (`_merged`), or
    #: always (`token_major`: the compile operators, whose outputs must not depend on their inputs' strides,
    #: which torch 2.11's inductor may trace with other strides than it runs them with)
    token_major: bool = False


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def head_parts(d: int) -> tuple[int, int]:
    """(D1, D2): the query/key head size as two power-of-two parts of at least 16 (D2 = 0: one part)."""
    if d <= 16:
        return 16, 0
    d1 = 1 << (d.bit_length() - 1)
    rest = d - d1
    return d1, (0 if rest == 0 else max(16, _pow2(rest)))


# Tile configurations (BM queries, BN keys, warps, pipeline stages) by the bytes of an element (2: bf16 and
# fp16, 4: fp32) and the widest loaded head part. The first of each list is the fixed choice under
# torch.use_deterministic_algorithms (another tile adds in another order: other bits) or DIETPE_FUSED_AUTOTUNE=0;
# otherwise each call's first launch for a key (head sizes, dtype, length buckets, terms) times every
# configuration that fits the GPU's shared memory and keeps the fastest. Shapes after the FlashAttention
# tutorial's on Hopper (forward 128 queries × 64-128 keys; dK/dV 128 keys × 32 queries; dQ 128 queries × 32-64
# keys), 8 warps where 4 spilled: checked for shared memory, registers and spills by compiling for sm_90
# (`resources`; at head size 64 in bf16 the first of each list spills nothing with the table, with or without
# dropout, but dK/dV's 80 bytes with dropout). dQ's first is 128 × 64: 0.49 ms at 1 × 12 × 8,192 × 64 on the
# H200 against 1.1 at 64 × 64 (with a table read, no dropout). Summing a table's gradient in the dQ kernel
# (DIETPE_FUSED_TABLE_GRAD=rows, FIRE) carries diagonals between key blocks, which needs BM = BN: then only
# the square configurations are tried; at 64 × 64 that kernel needs 255 registers and spills, and 32 × 32
# with 4 warps (238, none spilled) was the tuner's choice in every table case measured on an H100 (bert-base,
# 512 × 8: 208-435 µs against 255-640; docs/gpu.md). fp32's exact dots take small tiles: fp32 is the accuracy
# path.
FORWARD_CONFIGS = {2: {64: [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
                       128: [(128, 64, 8, 3), (64, 64, 4, 3)],
                       256: [(64, 32, 4, 2), (32, 32, 4, 1)]},
                   4: {64: [(32, 32, 4, 2), (16, 16, 4, 1)], 128: [(32, 32, 4, 2), (16, 16, 4, 1)],
                       256: [(16, 16, 4, 1)]}}
BACKWARD_KV_CONFIGS = {2: {64: [(32, 128, 8, 3), (64, 64, 8, 3), (32, 64, 4, 3)],
                           128: [(32, 64, 8, 3), (32, 128, 8, 2)],
                           256: [(16, 32, 4, 1), (16, 16, 4, 1)]},
                       4: {64: [(16, 32, 4, 2), (16, 16, 4, 1)], 128: [(16, 32, 4, 1), (16, 16, 4, 1)],
                           256: [(16, 16, 4, 1)]}}
BACKWARD_Q_CONFIGS = {2: {64: [(128, 64, 8, 3), (64, 64, 8, 3), (128, 32, 8, 3), (32, 32, 4, 2)],
                          128: [(64, 64, 8, 2), (128, 32, 8, 2), (32, 32, 4, 1)],
                          256: [(32, 32, 8, 1), (16, 16, 4, 1)]},
                      4: {64: [(32, 32, 4, 2), (16, 16, 4, 1)], 128: [(32, 32, 4, 2), (16, 16, 4, 1)],
                          256: [(16, 16, 4, 1)]}}
#: the table-gradient kernel over block diagonals (`_band_kernel`): square tiles (BLK, BLK, warps, stages); it
#: holds dS's running sum beside S and dP. Compiled for sm_90 with the GPU image's Triton (3.6) at head size 64
#: in bf16 with dropout: 64 × 64 with 8 warps 254 registers, none spilled (with 4 warps, or 128 × 128, it spills)
BAND_CONFIGS = {2: {64: [(64, 64, 8, 3), (32, 32, 4, 2), (64, 64, 4, 2)], 128: [(64, 64, 8, 2), (32, 32, 4, 1)],
                    256: [(32, 32, 4, 1), (16, 16, 4, 1)]},
                4: {64: [(32, 32, 4, 1), (16, 16, 4, 1)], 128: [(32, 32, 4, 1), (16, 16, 4, 1)],
                    256: [(16, 16, 4, 1)]}}
#: tiles of one block diagonal a band program adds before it shears (longer diagonals: several programs)
BAND_TILES = 8
#: tiles under Triton's interpreter (the CPU tests): small, and rectangular where the kernel allows it
INTERPRETER_CONFIGS = {"fwd": (16, 32, 4, 1), "kv": (16, 32, 4, 1), "q": (32, 16, 4, 1), "q_square": (16, 16, 4, 1),
                       "band": (16, 16, 4, 1)}
#: launches timed per configuration while tuning (after one untimed launch, which compiles)
TUNE_REPEATS = 3
_chosen: dict[tuple, tuple] = {}
_timings: dict[tuple, dict] = {}
_forced: list[int] = []


class _Setting:
    """A choice between kernel variants: the environment's value (read at the first use, so a bad one is the
    CLI's one error line, not an import error), then that of the innermost `using` block."""

    def __init__(self, env: str, allowed: tuple[str, ...], default: str, name: str):
        self.env, self.allowed, self.default, self.name, self.stack = env, allowed, default, name, []

    def read(self) -> str:
        value = os.environ.get(self.env, self.default)
        if value not in self.allowed:
            raise ConfigError(f"{self.env}={value!r}: allowed values are {', '.join(self.allowed)}")
        return value

    def current(self) -> str:
        if not self.stack:
            self.stack.append(self.read())
        return self.stack[-1]

    @contextlib.contextmanager
    def using(self, value: str):
        if value not in self.allowed:
            raise ConfigError(f"{self.name}({value!r}): allowed values are {', '.join(self.allowed)}")
        self.current()
        self.stack.append(value)
        try:
            yield
        finally:
            self.stack.pop()


#: how the kernels read an offset table (their HAS_TAB): "window", the tile's QB + KB - 1 offsets as one vector
#: expanded by a gather; "score", one load per score, which Triton's pipeliner copies into shared memory tile by
#: tile (a (BM, BN) float32 buffer per stage: 90 against 27 KiB for the forward's first tile at head size 64 in
#: bf16, `resources`). DIETPE_FUSED_TABLE chooses; `table_read` within a block
TABLE_READS = {"window": 2, "score": 1}
TABLE_READ = _Setting("DIETPE_FUSED_TABLE", tuple(TABLE_READS), "window", "table_read")
#: how the backward sums an offset table's gradient: "bands", by a kernel of its own over block diagonals,
#: whose tiles share their offsets, so it adds dS tile by tile and shears once per program (`_band_kernel`: it
#: recomputes S and dP, two of the backward's five products, and leaves the dQ kernel its plain loop and any
#: tile); "rows", in the dQ kernel, shearing every tile (square tiles, a carry between key blocks). FIRE's
#: piecewise term always takes the rows path (its piece sums are the dQ kernel's). DIETPE_FUSED_TABLE_GRAD
#: chooses; `table_gradient` within a block
TABLE_GRAD = _Setting("DIETPE_FUSED_TABLE_GRAD", ("bands", "rows"), "bands", "table_gradient")


#: the order of a causal grid's query blocks in the forward and dQ kernels: "longest", the last block (the
#: longest key loop) first; "index", block 0 first. The dK/dV kernel's key block n reads the queries from n on,
#: so its index order is already the longest first. DIETPE_FUSED_ORDER chooses; `causal_order` within a block
ORDER = _Setting("DIETPE_FUSED_ORDER", ("longest", "index"), "longest", "causal_order")


def causal_order(name: str):
    """Within it a causal grid's query blocks run in the order `name` says ("longest" or "index"): for timing
    both. The results are the same bits."""
    return ORDER.using(name)


def _longest(flags: dict) -> bool:
    return flags["CAUSAL"] and ORDER.current() == "longest"


def current_table_read() -> str:
    """How the kernels read an offset table now (a key of TABLE_READS)."""
    return TABLE_READ.current()


def table_read(name: str):
    """Within it the kernels read offset tables the way `name` says (a key of TABLE_READS): for timing both."""
    return TABLE_READ.using(name)


def table_gradient(name: str):
    """Within it the backward sums offset tables' gradients the way `name` says ("bands" or "rows")."""
    return TABLE_GRAD.using(name)


@contextlib.contextmanager
def forcing(index: int):
    """Within it every launch takes configuration `index` of its list (the last where shorter; the next that
    fits where it exceeds the GPU's shared memory), remembering nothing: how the selftest checks each tile the
    autotuner may pick."""
    _forced.append(index)
    try:
        yield
    finally:
        _forced.pop()


def _configs(configs: dict, dtype: torch.dtype, width: int) -> list:
    by_width = configs[2 if dtype.itemsize <= 2 else 4]
    for bound in sorted(by_width):
        if width <= bound:
            return by_width[bound]
    return by_width[max(by_width)]


def chosen_configs() -> dict[tuple, tuple[tuple, dict]]:
    """{key: (configuration, {configuration: seconds per launch})} of every kernel launched so far (the
    timings are empty where none was tuned): what the autotuner picked, for benchmarks to print."""
    return {key: (config, _timings.get(key, {})) for key, config in _chosen.items()}


_AUTOTUNE: list[bool] = []  # DIETPE_FUSED_AUTOTUNE != "0", read at the first call


def _tuning() -> bool:
    """Whether to time the configurations: not under deterministic algorithms, nor with DIETPE_FUSED_AUTOTUNE=0
    (read once: every call's signature asks)."""
    if not _AUTOTUNE:
        _AUTOTUNE.append(os.environ.get("DIETPE_FUSED_AUTOTUNE", "1") != "0")
    return _AUTOTUNE[0] and not torch.are_deterministic_algorithms_enabled()


def _seconds(launch) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(TUNE_REPEATS):
        launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / TUNE_REPEATS


def _first_that_fits(configs: list, launch) -> None:
    from triton.runtime.errors import OutOfResources

    for config in configs:
        try:
            return launch(config)
        except OutOfResources:
            continue
    raise RuntimeError(f"attn_backend='fused': no tile configuration of {configs} fits this GPU")


def _launch(key: tuple, configs: list, launch, interpreter_config: tuple, meta: bool = False):
    """launch(config): under the interpreter its tile; on the meta device (nothing launched: shapes and memory)
    the first of `configs`; else the configuration remembered for `key`, or, at the key's first call, the
    fastest of `configs` that fit the GPU (the first that fits when not tuning). Returns what the launch whose
    results stand returned."""
    if meta:  # before the interpreter's tiles: the buffers are sized as on a GPU
        return launch(configs[0])
    if interpreting():
        return launch(interpreter_config)
    if _forced:  # that configuration, or the next one that fits this GPU's shared memory (as the tuner skips)
        start = min(_forced[-1], len(configs) - 1)
        return _first_that_fits(configs[start:] + configs[:start], launch)
    tune = _tuning() and len(configs) > 1
    key = (*key, "tuned" if tune else "fixed")
    config = _chosen.get(key)
    if config is not None:
        return launch(config)
    from triton.runtime.errors import OutOfResources

    times, result = {}, None
    for config in configs:
        try:
            result = launch(config)  # compiles at the first call
        except OutOfResources:
            continue
        if not tune:
            break
        times[config] = _seconds(lambda: launch(config))  # noqa: B023 (called here, in this iteration)
    else:
        if not times:
            raise RuntimeError(f"attn_backend='fused': no tile configuration of {configs} fits this GPU")
        config = min(times, key=times.get)
        result = launch(config)  # the results of the chosen configuration
    _chosen[key] = config
    if times:
        _timings[key] = times
    if os.environ.get("DIETPE_FUSED_VERBOSE", "0") == "1":
        tried = ", ".join(f"{c}: {t * 1e6:.0f} µs" for c, t in times.items())
        print(f"[fused] {key}: {config}{f' of {tried}' if tried else ''}", file=sys.stderr, flush=True)
    return result


def _precision(q: Tensor) -> str:
    """fp32 inputs: exact products unless torch allows TF32 matmuls; half precision: the native dot."""
    if q.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _pointers(table: Tensor | None, segments: Tensor | None, ex: Extras, dummy: Tensor) -> tuple:
    """The tables, keeps, segments, mask and piecewise buffers the kernels read (`dummy` where absent). Written
    out: every launch asks."""
    return (dummy if table is None else table, dummy if ex.q_keep is None else ex.q_keep,
            dummy if ex.k_keep is None else ex.k_keep, dummy if segments is None else segments,
            dummy if ex.q_segments is None else ex.q_segments, dummy if ex.k_segments is None else ex.k_segments,
            dummy if ex.mask is None else ex.mask, dummy if ex.den is None else ex.den,
            dummy if ex.pieces is None else ex.pieces)


def _aux_strides(table: Tensor | None, segments: Tensor | None, ex: Extras) -> tuple:
    """The strides of `_pointers`' tensors the kernels take (0 along a broadcast dimension)."""
    stab = table.stride(0) if table is not None and table.shape[0] > 1 else 0
    sseg = segments.stride(0) if segments is not None and segments.shape[0] > 1 else 0
    sqs, sks = _batch_stride(ex.q_segments), _batch_stride(ex.k_segments)
    # broadcast dimensions (size 1) read the same entries for every index
    ms = tuple(0 if n == 1 else st for n, st in zip(ex.mask.shape, ex.mask.stride())) if ex.mask is not None \
        else (0, 0, 0, 0)
    return (stab, sseg, sqs, sks, *ms, *(_batch_stride(x) for x in (ex.q_keep, ex.k_keep, ex.den)))


def _batch_stride(x: Tensor | None) -> int:
    """The stride between examples of a per-query or per-key vector: (L,) or (1, L) shared, (B, L) per example."""
    return x.stride(0) if x is not None and x.dim() == 2 and x.shape[0] > 1 else 0


def pack_pieces(kinks: Tensor, slope: Tensor, intercept: Tensor) -> tuple[Tensor, int]:
    """(buffer, slots): the W sorted kinks padded with +inf to `slots` (a power of two, at least 4), then per head
    its W + 1 slopes and intercepts, each padded to 2·slots: the layout `_piecewise` reads, float32."""
    w, heads = kinks.numel(), slope.shape[1]
    slots = max(4, _pow2(w))
    per_head = torch.zeros(heads, 2, 2 * slots, dtype=torch.float32, device=slope.device)
    per_head[:, 0, :w + 1] = slope.detach().T
    per_head[:, 1, :w + 1] = intercept.detach().T
    pad = torch.full((slots - w,), torch.inf, dtype=torch.float32, device=kinks.device)
    return torch.cat([kinks.detach().float(), pad, per_head.flatten()]), slots


def dropout_seed(dropout: float, q: Tensor) -> Tensor | int:
    """Attention dropout's Philox seed (0 without dropout): one int64 drawn on q's device by torch's generator
    there. Nothing waits for the GPU (the kernels read it from memory), a seeded run repeats, activation
    checkpointing restores the generator and draws it again, and inside a CUDA graph the draw is captured with
    the kernels, so each replay draws a new seed (a host value would be replayed as captured)."""
    if dropout <= 0:
        return 0
    return torch.randint(0, 2**62, (1,), device=q.device)


def _seed_tensor(seed: int | Tensor, device: torch.device) -> Tensor:
    if isinstance(seed, Tensor):
        return seed if seed.device == device else seed.to(device)
    return torch.full((1,), seed, dtype=torch.int64, device=device)


def _seed_arg(ex: Extras, q: Tensor) -> Tensor:
    """What the kernels' SEED points at: the seed, or q where no dropout reads it (no tensor made per call)."""
    return _seed_tensor(ex.seed, q.device) if ex.dropout > 0 else q


def _dropout_args(ex: Extras) -> tuple[float, float]:
    """(p, 1 / (1 - p))."""
    return ex.dropout, 1.0 / (1.0 - ex.dropout)


def _flags(table, segments, ex: Extras, q: Tensor) -> dict:
    nseg = segments.shape[-1] if segments is not None else 0
    kind = 0 if ex.mask is None else (1 if ex.mask.shape[2] == 1 else 2)
    table_read = TABLE_READS[current_table_read()] if table is not None else 0
    return dict(HAS_TAB=table_read, HAS_KEEP=ex.q_keep is not None, NSEG=nseg, MASK_KIND=kind,
                PIECES=ex.slots if ex.pieces is not None else 0,
                LOGKP=ex.slots.bit_length() - 1 if ex.pieces is not None else 0,
                CAUSAL=ex.causal, DROPOUT=ex.dropout > 0, PREC=_precision(q))


def _key(name: str, q: Tensor, lk: int, widths: tuple, flags: dict) -> tuple:
    """What a tuned configuration is remembered under: kernel, head widths, dtype, lengths rounded up to powers
    of two, batch × heads rounded likewise (the grid's size), the terms."""
    b, h, lq = q.shape[:3]
    return (name, *widths, q.dtype, _pow2(lq), _pow2(lk), _pow2(b * h), *flags.items())  # cheap: every call


class _Spec(NamedTuple):
    """One launch as its call's signature (`signature`) fixes it: everything but the tensors and the seed."""

    grid: tuple
    before: tuple  # the arguments after the tensors, up to the seed
    after: tuple  # those after the seed
    constants: dict
    token: int  # names this spec to the kept-kernel launcher
    sizes: dict | None = None  # the dQ kernel's: its partial sums' buffers and their layout


class _Backward(NamedTuple):
    """A backward's launches (dQ's, dK/dV's, the band kernel's or None) and which table gradients they sum."""

    specs: tuple
    bands: bool  # the offset table's gradient by the band kernel
    q_grads: dict  # what the dQ kernel sums (TAB_GRAD, SEG_GRAD)


class _Call:
    """What a call's signature fixes: how the second head part is read (`split`: q and k's channels from it on;
    0: q and k themselves; None: the folded factors `Extras.q2`, `k2`), the output's shape and strides and the
    q, k, v gradients' strides (`heads_strides`), and the launches once chosen: the forward's, the backward's by
    dO's strides and the gradients asked for. A call after the first computes none of it again (host work
    around each launch, in a step the host bounds: docs/kernels.md, "Where the time goes")."""

    __slots__ = ("split", "out", "grads", "forward", "backward")

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, ex: Extras):
        d1, d2 = head_parts(q.shape[3])
        self.split = None if ex.q2 is not None else (d1 if d2 else 0)
        shape = (*q.shape[:3], v.shape[3])
        self.out = (shape, heads_strides(shape, _merged(q, ex)))
        self.grads = tuple(heads_strides(x.shape, _merged(x, ex)) for x in (q, k, v))
        self.forward: _Spec | None = None
        self.backward: dict[tuple, _Backward] = {}


#: signature -> its `_Call`
_specs: dict[tuple, _Call] = {}
_tokens = itertools.count()
MAX_SPECS = 4096


def signature(q: Tensor, k: Tensor, v: Tensor, scale: float, table: Tensor | None, segments: Tensor | None,
              ex: Extras) -> tuple:
    """What a call's launches depend on besides the tensors' addresses and the dropout seed: shapes, strides and
    dtypes, which terms and masks are read and how, and the settings that choose tiles and dot precision."""
    optional = (table, segments, ex.q_keep, ex.k_keep, ex.q_segments, ex.k_segments, ex.mask, ex.den, ex.q2, ex.k2)
    return (q.shape, q.stride(), q.dtype, k.shape, k.stride(), k.dtype, v.shape, v.stride(), v.dtype, q.device,
            scale, tuple([None if x is None else (x.shape, x.stride(), x.dtype) for x in optional]),
            ex.pieces is not None, ex.slots, ex.n_pieces, ex.causal, ex.dropout, ex.token_major,
            TABLE_READ.current(), TABLE_GRAD.current(), ORDER.current(), _tuning(), _precision(q))


def _record(sig: tuple, q: Tensor, k: Tensor, v: Tensor, ex: Extras) -> _Call:
    """The signature's `_Call`, made at its first call."""
    call = _specs.get(sig)
    if call is None:
        if len(_specs) >= MAX_SPECS:  # lengths that change every call (decoding) add a signature each
            _specs.clear()
        call = _specs[sig] = _Call(q, k, v, ex)
    return call


def _run(kernel, spec: _Spec, tensors: tuple, seed: Tensor) -> _Spec:
    launch_kept(kernel, spec.grid, tensors, (*spec.before, seed, *spec.after), spec.constants, spec.token)
    return spec


def _second_parts(q: Tensor, k: Tensor, ex: Extras, split: int | None) -> tuple[Tensor, Tensor]:
    """(q2, k2): what the kernels read as the second head part (`_Call.split`)."""
    if split is None:
        return ex.q2, ex.k2
    return (q[..., split:], k[..., split:]) if split else (q, k)


class _Parts(NamedTuple):
    """The query/key head as the kernels load it: D1 channels of q and k (dq1 of them real), then D2 (dq2 real)
    of q2 and k2, which are q and k's channels past D1 or the folded factors (`Extras.q2`)."""

    q2: Tensor
    k2: Tensor
    d1: int
    d2: int
    dq1: int
    dq2: int
    dvp: int  # the value head, padded
    even_d: bool  # no head channel masked


def _parts(q: Tensor, k: Tensor, v: Tensor, ex: Extras) -> _Parts:
    dq, dv = q.shape[3], v.shape[3]
    dvp = max(16, _pow2(dv))
    d1, d2 = head_parts(dq)
    if ex.q2 is not None:
        r = ex.q2.shape[3]
        d2, q2, k2, dq1, dq2 = max(16, _pow2(r)), ex.q2, ex.k2, dq, r
    else:
        q2, k2 = (q[..., d1:], k[..., d1:]) if d2 else (q, k)
        dq1, dq2 = min(dq, d1), (dq - d1 if d2 else 0)
    return _Parts(q2, k2, d1, d2, dq1, dq2, dvp, dq1 == d1 and dq2 == d2 and dv == dvp)


def _token_major(x: Tensor) -> bool:
    """Whether x (B, H, L, D) lies in memory as (B, L, H, D): heads split from a (B, L, H·D) projection, as the
    models and transformers' attention make q, k and v. (Arithmetic on the strides: no view made per call.)"""
    b, h, n, d = x.shape
    sb, sh, sn, sd = x.stride()
    return (sd == 1 or d == 1) and (sh == d or h == 1) and (sn == h * d or n == 1) and (sb == n * h * d or b == 1)


def heads_strides(shape: tuple, token_major: bool) -> tuple[int, int, int, int]:
    """Strides of a new (B, H, L, D) tensor: laid out as (B, L, H, D) where `token_major`, else dense."""
    b, h, n, d = shape
    return (n * h * d, d, h * d, 1) if token_major else (h * n * d, n * d, d, 1)


def _merged(x: Tensor, ex: Extras) -> bool:
    """Whether an output or gradient of x's shape is laid out token-major: where x is (heads split from a
    projection), so the heads merge back into (B, L, H·D) by a view, as FlashAttention's (B, L, H, D) output
    does, or always (`Extras.token_major`); dense for any other layout (a split of a fused projection, an
    expanded view)."""
    return ex.token_major or _token_major(x)


def _row_strides(x: Tensor) -> tuple[int, int, int]:
    """Batch, head and row strides of a (B|1, H|1, L, D) tensor, 0 along a broadcast dimension."""
    return tuple(0 if n == 1 else st for n, st in zip(x.shape[:3], x.stride()[:3]))


def _forward_spec(config: tuple, q: Tensor, k: Tensor, v: Tensor, scale: float, table: Tensor | None,
                  segments: Tensor | None, ex: Extras, flags: dict) -> _Spec:
    b, h, lq = q.shape[:3]
    lk, dv = k.shape[2], v.shape[3]
    pt = _parts(q, k, v, ex)
    bm, bn, warps, stages = config
    bm = min(bm, max(16, _pow2(lq)))  # a few queries (a decoding step): no rows of padding
    out = heads_strides((b, h, lq, dv), _merged(q, ex))  # as `attention_forward` makes it
    before = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out[:3],
              *_row_strides(pt.q2), *_row_strides(pt.k2), *_aux_strides(table, segments, ex), h, lq, lk, pt.dq1,
              pt.dq2, dv, scale * LOG2E)
    return _Spec((_cdiv(lq, bm), b * h), before, _dropout_args(ex),
                 dict(BM=bm, BN=bn, D1=pt.d1, D2=pt.d2, DVP=pt.dvp, EVEN_M=lq % bm == 0, EVEN_N=lk % bn == 0,
                      EVEN_D=pt.even_d, LONGEST=_longest(flags), num_warps=warps, num_stages=stages, **flags),
                 next(_tokens))


def attention_forward(q: Tensor, k: Tensor, v: Tensor, scale: float, table: Tensor | None,
                      segments: Tensor | None, ex: Extras, sig: tuple | None = None) -> tuple[Tensor, Tensor]:
    """out (B, H, Lq, Dv) in v's dtype and the log-sum-exp (B, H, Lq) in log2 units, float32. sig: the call's
    `signature`, when the caller has it."""
    sig = sig or signature(q, k, v, scale, table, segments, ex)
    call = _record(sig, q, k, v, ex)
    shape, strides = call.out  # laid out as q: heads merge back by a view
    out = torch.empty_strided(shape, strides, dtype=v.dtype, device=q.device)
    lse = torch.empty(shape[:3], dtype=torch.float32, device=q.device)
    q2, k2 = _second_parts(q, k, ex, call.split)
    tensors = (q, k, v, out, lse, *_pointers(table, segments, ex, lse), q2, k2)
    seed = _seed_arg(ex, q)
    if call.forward is not None and not _forced:
        _run(_forward_kernel, call.forward, tensors, seed)
        return out, lse
    flags = _flags(table, segments, ex, q)
    pt = _parts(q, k, v, ex)
    spec = _launch(_key("fwd", q, k.shape[2], (pt.d1, pt.d2, pt.dvp), flags),
                   _configs(FORWARD_CONFIGS, q.dtype, max(pt.d1, pt.d2, pt.dvp)),
                   lambda config: _run(_forward_kernel, _forward_spec(config, q, k, v, scale, table, segments, ex,
                                                                      flags), tensors, seed),
                   INTERPRETER_CONFIGS["fwd"], q.is_meta)
    if not _forced:  # a forced tile is not the one later calls run
        call.forward = spec
    return out, lse


def _backward_specs(configs: tuple, q: Tensor, k: Tensor, v: Tensor, out: Tensor, do: Tensor, second: tuple,
                    scale: float, table: Tensor | None, segments: Tensor | None, ex: Extras, flags: dict, grads: dict
                    ) -> tuple[_Spec | None, _Spec | None]:
    """The dQ and dK/dV kernels' launches at configurations (dQ's, dK/dV's); None for a configuration not given.
    second: the gradients' buffers for the second head parts (`_second_gradients`)."""
    b, h, lq, dq_width = q.shape
    lk, dv_width = k.shape[2], v.shape[3]
    pt = _parts(q, k, v, ex)
    parts = (*_row_strides(pt.q2), *_row_strides(pt.k2))
    tail = (*_aux_strides(table, segments, ex), h, lq, lk, pt.dq1, pt.dq2, dv_width, scale * LOG2E, scale)
    after = _dropout_args(ex)
    # the gradients laid out as q, k and v are (`_Call.grads`)
    dense_q, dense_k, dense_v = (heads_strides(x.shape, _merged(x, ex))[:3] for x in (q, k, v))
    fixed = dict(D1=pt.d1, D2=pt.d2, DVP=pt.dvp, EVEN_D=pt.even_d, **flags)
    specs = [None, None]
    if configs[0] is not None:
        bm, bn, warps, stages = configs[0]
        nm, nn = _cdiv(lq, bm), _cdiv(lk, bn)
        w = (nn + 1) * bn
        nseg2p = _pow2(max(1, flags["NSEG"] ** 2))
        piece_grad = grads["TAB_GRAD"] and ex.pieces is not None
        # under padding a program skips the key blocks outside its rows' open keys: their partial rows stay 0
        sizes = dict(part=(b * h * nm, w) if grads["TAB_GRAD"] else None, zero=flags["MASK_KIND"] == 1,
                     spart=(b * h * nm, nseg2p) if grads["SEG_GRAD"] else None,
                     dpart=(b * h, lq) if piece_grad else None,
                     pwpart=(b * h * nm, 4 * ex.slots) if piece_grad else None, blk=bn, nm=nm, nn=nn, width=w,
                     nseg2p=nseg2p)
        before = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *do.stride()[:3], *dense_q,
                  *parts, *second[0].stride()[:3], *tail)
        specs[0] = _Spec((nm, b * h), before, (*after, nn, w),
                         dict(BM=bm, BN=bn, NSEG2P=nseg2p, EVEN_M=lq % bm == 0, EVEN_N=lk % bn == 0,
                              LONGEST=_longest(flags), num_warps=warps, num_stages=stages, **fixed, **grads),
                         next(_tokens), sizes)
    if configs[1] is not None:
        bm, bn, warps, stages = configs[1]
        before = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dense_k, *dense_v, *parts,
                  *second[1].stride()[:3], *tail)
        specs[1] = _Spec((_cdiv(lk, bn), b * h), before, after,
                         dict(BM=bm, BN=bn, EVEN_M=lq % bm == 0, EVEN_N=lk % bn == 0, num_warps=warps,
                              num_stages=stages, **fixed), next(_tokens))
    return specs[0], specs[1]


def _second_gradients(split: int | None, dq: Tensor, dk: Tensor, ex: Extras) -> tuple[Tensor, Tensor]:
    """Where the kernels write the second head parts' gradients (split: `_Call.split`): dq and dk's channels
    from `split` on, or buffers for the folded factors (B, H, L, r), summed to their shapes afterwards
    (`_reduced`)."""
    if split is not None:
        return (dq[..., split:], dk[..., split:]) if split else (dq, dk)
    b, h, lq = dq.shape[:3]
    lk, r = dk.shape[2], ex.q2.shape[3]
    return (torch.empty(b, h, lq, r, dtype=ex.q2.dtype, device=dq.device),
            torch.empty(b, h, lk, r, dtype=ex.k2.dtype, device=dk.device))


def _reduced(grad: Tensor, like: Tensor) -> Tensor:
    """grad (B, H, L, r) summed over the dimensions `like` broadcasts (size 1), in a fixed order."""
    dims = tuple(d for d in (0, 1) if like.shape[d] == 1 and grad.shape[d] > 1)
    return grad.sum(dims, keepdim=True) if dims else grad


def _partials(spec: _Spec, dummy: Tensor) -> dict[str, Tensor]:
    """The dQ kernel's partial-sum buffers its spec names (`dummy` where none is written)."""
    sizes, out = spec.sizes, {}
    for name in ("part", "spart", "dpart", "pwpart"):
        shape = sizes[name]
        alloc = torch.zeros if name == "part" and sizes["zero"] else torch.empty
        out[name] = dummy if shape is None else alloc(shape, dtype=torch.float32, device=dummy.device)
    return out


def attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float,
                       table: Tensor | None, segments: Tensor | None, ex: Extras, table_grad: bool = True,
                       segments_grad: bool = True, sig: tuple | None = None):
    """(dq, dk, dv, d table, d segment table, d pieces, d folded factors): FlashAttention-2's backward, tables'
    gradients without atomics (None where not asked for, or absent). sig: the forward's `signature`, when the
    caller has it."""
    do = do if do.stride(-1) == 1 else do.contiguous()
    call = _record(sig or signature(q, k, v, scale, table, segments, ex), q, k, v, ex)
    # a query that sees no open key (a padded row) passes no gradient: its log-sum-exp, about -1.4e30, keeps no
    # digits to recompute its P from (exp2 would overflow); +inf makes that P 0, as for the rows past Lq
    lse = torch.where(lse < NO_OPEN_LSE, float("inf"), lse)
    delta = torch.empty_like(lse)  # rowsum(dO ∘ O), written by the dQ kernel, read by the dK/dV and band kernels
    # each gradient laid out as its input where that is token-major, else dense (a split or an expanded view
    # would make empty_like's differ): `_Call.grads`
    dq, dk, dv = [torch.empty_strided(x.shape, st, dtype=x.dtype, device=x.device) for x, st in zip((q, k, v),
                                                                                                   call.grads)]
    second = _second_gradients(call.split, dq, dk, ex)
    pointers = (*_pointers(table, segments, ex, lse), *_second_parts(q, k, ex, call.split))
    seed, key = _seed_arg(ex, q), (out.stride(), do.stride(), table_grad, segments_grad)
    kept = call.backward.get(key)
    if kept is not None and not _forced:
        parts = _partials(kept.specs[0], lse)
        _run(_backward_q_kernel, kept.specs[0], (q, k, v, out, do, lse, delta, dq, *parts.values(), *pointers,
                                                  second[0]), seed)
        _run(_backward_kv_kernel, kept.specs[1], (q, k, v, do, lse, delta, dk, dv, *pointers, second[1]), seed)
        if kept.bands:
            parts["band"] = torch.empty(kept.specs[2].sizes["part"], dtype=torch.float32, device=q.device)
            _run(_band_kernel, kept.specs[2], (q, k, v, do, lse, delta, parts["band"], *pointers[:7],
                                                *pointers[-2:]), seed)
        return _gradients((dq, dk, dv), second, parts, kept, q.shape, k.shape[2], table, segments, ex)
    grads = dict(TAB_GRAD=table is not None and table_grad, SEG_GRAD=segments is not None and segments_grad)
    bands = grads["TAB_GRAD"] and ex.pieces is None and TABLE_GRAD.current() == "bands"
    q_grads = dict(grads, TAB_GRAD=grads["TAB_GRAD"] and not bands)  # what the dQ kernel sums
    parts = {}

    def run_q(spec):
        parts.update(_partials(spec, lse))
        return _run(_backward_q_kernel, spec, (q, k, v, out, do, lse, delta, dq, *parts.values(), *pointers,
                                               second[0]), seed)

    def run_band(spec):
        parts["band"] = torch.empty(spec.sizes["part"], dtype=torch.float32, device=q.device)
        return _run(_band_kernel, spec, (q, k, v, do, lse, delta, parts["band"], *pointers[:7], *pointers[-2:]),
                    seed)

    kv_tensors = (q, k, v, do, lse, delta, dk, dv, *pointers, second[1])
    tuned = (q, k, v, out, do, second, scale, table, segments, ex)
    specs = _tuned_backward(tuned, q_grads, run_q, kv_tensors, seed)
    kept = _Backward((*specs, _tuned_band(tuned, run_band) if bands else None), bands, q_grads)
    if not _forced:  # a forced tile is not the one later calls run
        call.backward[key] = kept
    return _gradients((dq, dk, dv), second, parts, kept, q.shape, k.shape[2], table, segments, ex)


def _gradients(dqkv: tuple, second: tuple, parts: dict, kept: _Backward, shape: tuple, lk: int,
               table: Tensor | None, segments: Tensor | None, ex: Extras) -> tuple:
    """The backward's results once its kernels are launched: dq, dk, dv, then the tables' and the folded
    factors' gradients from the partial sums and buffers."""
    d_second = None if ex.q2 is None else (_reduced(second[0], ex.q2), _reduced(second[1], ex.k2))
    d_table, d_segments, d_pieces = _table_gradients(kept.specs[0].sizes, parts, shape, lk, table, segments, ex,
                                                     kept.q_grads)
    if kept.bands:
        d_table = _band_sums(parts["band"], kept.specs[2], shape[0], shape[1], shape[2] + lk - 1, lk)
        d_table = d_table.sum(0, keepdim=True) if table.shape[0] == 1 else d_table
    return (*dqkv, d_table, d_segments, d_pieces, d_second)


def _tuned_backward(call: tuple, grads: dict, run_q, kv_tensors: tuple, seed: Tensor) -> tuple[_Spec, _Spec]:
    """The backward's launches at the tiles remembered for their keys (timed at a key's first call); call: (q, k,
    v, out, do, second, scale, table, segments, ex)."""
    q, k, v, table, segments, ex = *call[:3], *call[-3:]
    flags = _flags(table, segments, ex, q)
    pt = _parts(q, k, v, ex)
    d1, d2, dvp = pt.d1, pt.d2, pt.dvp
    width = max(d1, d2, dvp)
    q_configs = _configs(BACKWARD_Q_CONFIGS, q.dtype, width)
    if grads["TAB_GRAD"]:
        q_configs = [c for c in q_configs if c[0] == c[1]]
    lk = k.shape[2]
    args = (*call, flags, grads)
    q_spec = _launch(_key("dq", q, lk, (d1, d2, dvp), {**flags, **grads}), q_configs,
                     lambda config: run_q(_backward_specs((config, None), *args)[0]),
                     INTERPRETER_CONFIGS["q_square" if grads["TAB_GRAD"] else "q"], q.is_meta)
    kv_spec = _launch(_key("dkdv", q, lk, (d1, d2, dvp), flags), _configs(BACKWARD_KV_CONFIGS, q.dtype, width),
                      lambda config: _run(_backward_kv_kernel, _backward_specs((None, config), *args)[1], kv_tensors,
                                          seed),
                      INTERPRETER_CONFIGS["kv"], q.is_meta)
    return q_spec, kv_spec


_BAND_FLAGS = ("HAS_TAB", "HAS_KEEP", "NSEG", "MASK_KIND", "CAUSAL", "DROPOUT", "PREC")


def _band_spec(config: tuple, q: Tensor, k: Tensor, v: Tensor, do: Tensor, scale: float, table: Tensor,
               segments: Tensor | None, ex: Extras, flags: dict) -> _Spec:
    b, h, lq = q.shape[:3]
    lk, dv = k.shape[2], v.shape[3]
    blk, _, warps, stages = config
    nm, nn = _cdiv(lq, blk), _cdiv(lk, blk)
    nb, nch = nm + nn - 1, _cdiv(min(nm, nn), BAND_TILES)  # block diagonals, programs per diagonal
    pt = _parts(q, k, v, ex)
    before = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *_row_strides(pt.q2),
              *_row_strides(pt.k2), *_aux_strides(table, segments, ex)[:10], h, lq, lk, pt.dq1, pt.dq2, dv,
              scale * LOG2E)
    constants = dict(BLK=blk, D1=pt.d1, D2=pt.d2, DVP=pt.dvp, EVEN_M=lq % blk == 0, EVEN_N=lk % blk == 0,
                     EVEN_D=pt.even_d, num_warps=warps, num_stages=stages, **{f: flags[f] for f in _BAND_FLAGS})
    return _Spec((nb * nch, b * h), before, (*_dropout_args(ex), nm, nn, nch, BAND_TILES), constants, next(_tokens),
                 dict(part=(b * h * nb * nch, 2 * blk), blk=blk, nb=nb, nch=nch, nn=nn))


def _tuned_band(call: tuple, run_band) -> _Spec:
    """The band kernel's launch at the tile remembered for its key; call as `_tuned_backward`'s."""
    q, k, v, _, do, _, scale, table, segments, ex = call
    flags = _flags(table, segments, ex, q)
    pt = _parts(q, k, v, ex)
    return _launch(_key("band", q, k.shape[2], (pt.d1, pt.d2, pt.dvp), flags),
                   _configs(BAND_CONFIGS, q.dtype, max(pt.d1, pt.d2, pt.dvp)),
                   lambda config: run_band(_band_spec(config, q, k, v, do, scale, table, segments, ex, flags)),
                   INTERPRETER_CONFIGS["band"], q.is_meta)


def _band_sums(part: Tensor, spec: _Spec, b: int, h: int, n_offsets: int, lk: int) -> Tensor:
    """dT (H, Lq + Lk - 1) from the band kernel's partial sums; b, h, n_offsets, lk are fixed by the call's
    signature, as `spec` is: its token names this launch's arguments after the two tensors."""
    sizes = spec.sizes
    out = torch.empty(h, n_offsets, dtype=torch.float32, device=part.device)
    rb = 64 if interpreting() else 256
    launch_kernel(_band_sum_kernel, (h, _cdiv(n_offsets, rb)),
                  (part, out, b, h, sizes["nb"], sizes["nch"], sizes["nn"], n_offsets, lk),
                  dict(BLK=sizes["blk"], RB=rb), token=(("sum", spec.token), 2))
    return out


def _table_gradients(sizes: dict, parts: dict, shape: tuple, lk: int, table: Tensor | None,
                     segments: Tensor | None, ex: Extras, grads: dict) -> tuple:
    """(d table, d segment table, d pieces) from the dQ kernel's partial sums, each summed in a fixed order."""
    b, h, lq = shape[:3]
    d_table = d_segments = d_pieces = None
    if grads["TAB_GRAD"]:
        d_table = _offset_sums(parts["part"], sizes, b, h, lq + lk - 1, lk, ex.causal)
        d_table = d_table.sum(0, keepdim=True) if table.shape[0] == 1 else d_table
    if grads["SEG_GRAD"]:
        nseg = segments.shape[-1]
        pairs = parts["spart"].view(b, h, sizes["nm"], sizes["nseg2p"])[..., :nseg * nseg].sum((0, 2))  # (H, K·K)
        d_segments = pairs.view(h, nseg, nseg)
        d_segments = d_segments.sum(0, keepdim=True) if segments.shape[0] == 1 else d_segments
    if grads["TAB_GRAD"] and ex.pieces is not None:  # (d den, d slope, d intercept)
        sums = parts["pwpart"].view(b, h, sizes["nm"], 4 * ex.slots).sum((0, 2))  # (H, 4·slots)
        n, at = ex.n_pieces, 2 * ex.slots
        dense = torch.contiguous_format  # copies, not views of one buffer (an operator returns no aliases)
        dpart = parts["dpart"].view(b, h, lq)
        shared = ex.den.dim() == 1 or ex.den.shape[0] == 1
        d_den = dpart.sum((0, 1)).view(ex.den.shape) if shared else dpart.sum(1)  # den (Lq,), (1, Lq) or (B, Lq)
        d_pieces = (d_den, sums[:, :n].T.clone(memory_format=dense),
                    sums[:, at:at + n].T.clone(memory_format=dense))
    return d_table, d_segments, d_pieces


def _offset_sums(part: Tensor, sizes: dict, b: int, h: int, n_offsets: int, lk: int, causal: bool) -> Tensor:
    out = torch.empty(h, n_offsets, dtype=torch.float32, device=part.device)
    rb = 64 if interpreting() else 256
    launch_kernel(_offset_sum_kernel, (h, _cdiv(n_offsets, rb)),
                  (part, out, b, h, sizes["nm"], sizes["nn"], sizes["width"], n_offsets, lk),
                  dict(BLK=sizes["blk"], RB=rb, CAUSAL=causal))
    return out


class FusedAttention(torch.autograd.Function):
    """out = softmax(s·q·kᵀ + T[h, i - j] · a_i · c_j + Ŝ[h, σ_i, τ_j] + mask) · v, by the kernels above;
    gradients for q, k, v, the offset table T, the segment table Ŝ, and a piecewise F's den, slopes and
    intercepts (their values reach the kernel packed in `extras`)."""

    @staticmethod
    def forward(ctx, q, k, v, table, segments, den, slope, intercept, q2, k2, scale, extras):
        extras.q2, extras.k2 = q2, k2
        sig = signature(q, k, v, scale, table, segments, extras)
        out, lse = attention_forward(q, k, v, scale, table, segments, extras, sig)
        ctx.save_for_backward(q, k, v, out, lse, table, segments)
        ctx.scale, ctx.extras, ctx.sig = scale, extras, sig
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse, table, segments = ctx.saved_tensors
        needs = ctx.needs_input_grad
        table_grad = needs[3] or (ctx.extras.pieces is not None and any(needs[5:8]))
        dq, dk, dv, d_table, d_segments, d_pieces, d_second = attention_backward(
            do, q, k, v, out, lse, ctx.scale, table, segments, ctx.extras, table_grad, needs[4], ctx.sig)
        d_den, d_slope, d_intercept = d_pieces if d_pieces is not None else (None, None, None)
        d_q2, d_k2 = d_second if d_second is not None else (None, None)
        return dq, dk, dv, d_table, d_segments, d_den, d_slope, d_intercept, d_q2, d_k2, None, None


def _float32(x: Tensor | None, rows: bool = False) -> Tensor | None:
    """x as float32 and contiguous; with `rows`, its rows may lie apart (the kernels take a row stride)."""
    if x is None or (x.dtype == torch.float32 and (x.stride(-1) == 1 if rows else x.is_contiguous())):
        return x
    return x.float().contiguous()


def kernel_inputs(q: Tensor, k: Tensor, v: Tensor, table: Tensor | None, segments: Tensor | None,
                  pieces: tuple[Tensor, Tensor, Tensor, Tensor] | None):
    """The inputs as the kernels read them: q, k, v with unit stride along the head, the tables (and a piecewise
    term's den, slopes and intercepts) float32 and contiguous; their gradients flow back through the casts."""
    q = q if q.stride(-1) == 1 else q.contiguous()  # written out, as below: every call of every layer asks
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    if pieces is not None:
        if table is None:
            raise ValueError("a piecewise term reads its numerator from the offset table: give `table`")
        pieces = (_float32(pieces[0]), pieces[1], _float32(pieces[2]), _float32(pieces[3]))
    if table is not None:
        table = _float32(table, rows=True)
    return q, k, v, table, None if segments is None else _float32(segments), pieces


def folded_inputs(q: Tensor, folded: tuple[Tensor, Tensor] | None) -> tuple[Tensor | None, Tensor | None]:
    """(q2, k2) as the kernels read them (unit stride along the head), checked against q's head size."""
    if folded is None:
        return None, None
    if head_parts(q.shape[-1])[1]:
        raise ValueError(f"folded channels are read as a second head part: the head size must be a power of two "
                         f"or at most 16, got {q.shape[-1]} (concatenate them to q and k instead)")
    q2, k2 = (x if x.stride(-1) == 1 else x.contiguous() for x in folded)
    return q2, k2


def fused_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, table: Tensor | None = None,
                    segments: Tensor | None = None, extras: Extras | None = None,
                    pieces: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
                    folded: tuple[Tensor, Tensor] | None = None, packed: tuple[Tensor, int] | None = None) -> Tensor:
    """The kernel on q (B, H, Lq, Dq), k (B, H, Lk, Dq), v (B, H, Lk, Dv): out (B, H, Lq, Dv).

    folded (q2 (B|1, H|1, Lq, r), k2 (B|1, H|1, Lk, r)): extra query/key channels read from their own tensors
    after q's and k's (a low-rank term folded in without copying q and k: the scores gain q2·k2ᵀ·scale; Dq a
    power of two or at most 16, so that q's head is loaded as one part), with gradients.

    table (H|1, Lq + Lk - 1): the offset table T[h, i - j + Lk - 1]; segments (H|1, K, K): Ŝ; extras: see
    `Extras`. pieces (den (Lq,) or per example (B, Lq), kinks (W,) sorted, slope (W + 1, H), intercept
    (W + 1, H)): the term at (i, j) is then slope[p, h]·x + intercept[p, h] with x = T[i - j + Lk - 1] / den_i
    and p the number of kinks below x (FIRE's f_θ, a ReLU layer of a scalar, as its linear pieces); no gradient
    reaches the kinks, which move only where a piece begins; packed: `pack_pieces(kinks, slope, intercept)` where
    the caller has it (once for the layers that share the pieces). Tables are read as float32 (their gradients
    flow back through the cast)."""
    extras = extras or Extras()
    q, k, v, table, segments, pieces = kernel_inputs(q, k, v, table, segments, pieces)
    q2, k2 = folded_inputs(q, folded)
    den = slope = intercept = None
    if pieces is not None:
        den, kinks, slope, intercept = pieces
        extras.den = den.detach()
        extras.pieces, extras.slots = packed or pack_pieces(kinks, slope, intercept)
        extras.n_pieces = slope.shape[0]
    inputs = (q, k, v, table, segments, den, slope, intercept, q2, k2)
    if not torch.is_grad_enabled() or not any(x is not None and x.requires_grad for x in inputs):
        # inference: the forward alone, without the autograd Function's bookkeeping (host time a layer)
        extras.q2, extras.k2 = q2, k2
        return attention_forward(q, k, v, scale, table, segments, extras)[0]
    return FusedAttention.apply(*inputs, scale, extras)
