"""Pure functions for the position math: sinusoids, relative offsets, T5 buckets (bidirectional and causal),
ALiBi slopes, KERPLE's log kernel, rotary.

No parameters live here; the method modules own parameters and call these.
Notation: L positions, D width, H heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


def sinusoids(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al. (2017) §3.5: P[k, 2i] = sin(k / base^(2i/d)), P[k, 2i+1] = cos(k / base^(2i/d)).

    positions: (...) integer or float positions (may be negative, for relative offsets).
    Returns (..., dim) float32, sines and cosines interleaved as in the paper's formula.
    """
    half = (dim + 1) // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float32, device=positions.device) * 2 / dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (..., half)
    out = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., 2*half)
    return out[..., :dim]


def relative_offsets(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(Lq, Lk) matrix of pos_i - pos_j, the query position minus the key position; (B, Lq, Lk) when the
    positions are per example, (B, Lq) and (B, Lk)."""
    return q_pos[..., :, None] - k_pos[..., None, :]


def clipped_offset_index(offsets: Tensor, max_distance: int) -> Tensor:
    """Shaw et al. (2018) eq. 3-4: clip(i - j, k) = max(-k, min(k, i - j)), shifted to [0, 2k] for table lookup."""
    return offsets.clamp(-max_distance, max_distance) + max_distance


def t5_bucket(offsets: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bidirectional log-bucketing of relative positions (Raffel et al. 2020, §2.1; HF/mesh-tf code).

    offsets: (...) of j - i (key minus query), as T5 defines relative_position = memory - query.
    Half the buckets for each sign; within a sign, exact buckets for |d| < num_buckets/4 and
    logarithmically spaced ones up to max_distance, beyond which all distances share the last bucket.
    """
    num_buckets //= 2
    bucket = (offsets > 0).long() * num_buckets
    n = offsets.abs()
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # log-spaced buckets; the clamp avoids log(0) for the small distances that `is_small` discards anyway
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, n, large)


def t5_causal_bucket(offsets: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's unidirectional log-bucketing, the one T5's decoder self-attention uses (HF/mesh-tf
    `_relative_position_bucket(..., bidirectional=False)`). offsets: (...) of j - i (key minus query).

    A causal query sees only keys j <= i, so all `num_buckets` buckets go to distances n = i - j >= 0 (a key
    after the query, n < 0, shares bucket 0 with n = 0; the causal mask hides it anyway): exact buckets for
    n < num_buckets/2, log-spaced ones up to max_distance, the last bucket beyond. The bidirectional
    `t5_bucket` would give a causal query only the half of its buckets that belong to j <= i.
    """
    n = (-offsets).clamp(min=0)
    max_exact = num_buckets // 2
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).long()
    return torch.where(n < max_exact, n, large.clamp(max=num_buckets - 1))


# ALiBi's penalty is floored here: a weight e^-50 (2e-22) times the row's largest is below float32's resolution
# of any output, while e^-87 .. e^-103 are denormal numbers, which make CPU matmuls with the probabilities
# 5-8x slower (bert-base, 12 heads, 512 tokens: a training step 1.38x `none` before the floor, measured).
ALIBI_FLOOR = -50.0


def alibi_bias(distance: Tensor, slope: Tensor) -> Tensor:
    """ALiBi's linear penalty (Press et al. 2022): -m · |i - j|, floored at ALIBI_FLOOR (above). distance (...);
    slope broadcastable to it."""
    return (-slope * distance.to(slope.dtype)).clamp_min(ALIBI_FLOOR)


def kerple_log_bias(distance: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
    """KERPLE's logarithmic kernel (Chi et al. 2022, the 'log' variant of its conditionally positive definite
    kernels): -r1 · log(1 + r2 · |i - j|), r1, r2 > 0.

    distance: (...) of |i - j| (any dtype, cast to r1's); r1, r2: broadcastable to it (per head).
    """
    return -r1 * torch.log1p(r2 * distance.to(r1.dtype))


def alibi_slopes(num_heads: int) -> Tensor:
    """Press et al. (2022) §3: geometric slopes 2^(-8/n), 2^(-16/n), ...; for a head count that is not a power
    of two, the slopes of the next lower power of two then every other slope of the next higher one."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = power_of_two(num_heads)
    else:
        low = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(low) + power_of_two(2 * low)[0::2][: num_heads - low]
    return torch.tensor(slopes, dtype=torch.float32)


def rotary_angles(positions: Tensor, dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """RoFormer (Su et al. 2021) eq. 34: θ_i = base^(-2i/d); returns cos, sin of shape (L, dim), each
    frequency repeated for the two halves (the rotate-half layout of GPT-NeoX and HF Llama).
    Per-example positions (B, L) give (B, 1, L, dim), broadcasting over the heads of (B, H, L, Dh)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (1|B, L, dim/2)
    angles = torch.cat((angles, angles), dim=-1)  # (L, dim) or (B, L, dim)
    if angles.dim() == 3:
        angles = angles[:, None]  # (B, 1, L, dim)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by the position's angle: x*cos + rotate_half(x)*sin. x: (B, H, L, Dh);
    cos, sin: (L, Dh) or (B, 1, L, Dh)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    # rotate_half(x) = (-x2, x1) added half by half: one product and two in-place updates of a fresh tensor
    # instead of a negation, a concatenation, two products and a sum over the whole (B, H, L, Dh)
    out = x * cos
    out[..., :half].addcmul_(x2, sin[..., :half], value=-1)
    out[..., half:].addcmul_(x1, sin[..., half:])
    return out


def _per_head(index: Tensor) -> Tensor:
    """An (Lq, Lk) or per-example (B, Lq, Lk) index, viewed so it broadcasts over (B, H, Lq, Lk)."""
    return index[:, None] if index.dim() == 3 else index


#: one-hot indices up to this many elements (64 MiB in float32 each) turn `relative_gather` and
#: `relative_scatter` into batched matmuls: Shaw's 33 offsets at 512 tokens take 8.7M; the gather is then
#: 1.1x and the scatter-add 3x faster on CPU, and their backward passes are matmuls too (docs/bench.md)
ONEHOT_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class OneHot:
    """The one-hot of a shared (Lq, Lk) index into M buckets, in the two layouts the two products read fast:
    by_pair (Lq, Lk, M) for the scatter (Σ_j p_ij [index_ij = m]) and by_offset (Lq, M, Lk) for the gather."""

    by_pair: Tensor
    by_offset: Tensor

    @classmethod
    def of(cls, index: Tensor, num_offsets: int, dtype: torch.dtype) -> "OneHot | None":
        """None when the index is per example (B, Lq, Lk) or the one-hot would exceed ONEHOT_ELEMENTS."""
        if index.dim() != 2 or index.numel() * num_offsets > ONEHOT_ELEMENTS:
            return None
        lq, lk = index.shape
        ones = torch.ones((), dtype=dtype, device=index.device)
        by_pair = torch.zeros(lq, lk, num_offsets, dtype=dtype, device=index.device)
        by_pair.scatter_(-1, index[..., None], ones.expand(lq, lk, 1))
        by_offset = torch.zeros(lq, num_offsets, lk, dtype=dtype, device=index.device)
        by_offset.scatter_(1, index[:, None, :], ones.expand(lq, 1, lk))
        return cls(by_pair, by_offset)


def relative_gather(scores_by_offset: Tensor, index: Tensor, onehot: OneHot | None = None) -> Tensor:
    """Turn per-offset scores (B, H, Lq, M) into per-pair scores (B, H, Lq, Lk) with index (1|B, Lq, Lk) into M
    (with its one-hot, a matmul: each pair picks its offset's score exactly, the other products are zeros)."""
    if onehot is not None:
        return torch.einsum("bhim,imj->bhij", scores_by_offset, onehot.by_offset.to(scores_by_offset.dtype))
    b, h, lq, _ = scores_by_offset.shape
    return scores_by_offset.gather(-1, _per_head(index).expand(b, h, lq, index.shape[-1]))


def relative_scatter(probs: Tensor, index: Tensor, num_offsets: int, onehot: OneHot | None = None) -> Tensor:
    """Sum probabilities (B, H, Lq, Lk) per offset bucket: (B, H, Lq, M). The adjoint of `relative_gather`."""
    if onehot is not None:
        return torch.einsum("bhij,ijm->bhim", probs, onehot.by_pair.to(probs.dtype))
    b, h, lq, lk = probs.shape
    out = probs.new_zeros(b, h, lq, num_offsets)
    return out.scatter_add_(-1, _per_head(index).expand(b, h, lq, lk), probs)


def _toeplitz_forward(diagonals: Tensor, lk: int) -> Tensor:
    # window s of the flipped diagonals is row lq-1-s of the result: e[s + j] = d[lq-1-s - j + lk-1]
    flipped = diagonals.flip(-1)  # a contiguous copy
    lq = flipped.shape[-1] - lk + 1
    # the windows as a strided view (unfold's, which takes no symbolic size: compiled, it fixed the length)
    windows = flipped.as_strided((*flipped.shape[:-1], lq, lk), (*flipped.stride()[:-1], 1, 1))
    return windows.flip(-2)  # (..., Lq, Lk), rows back in order


class _Toeplitz(torch.autograd.Function):
    """out[..., i, j] = diagonals[..., i - j + Lk - 1]: a strided view and one copy instead of a gather, and
    diagonal sums (a skewed copy and one reduction) instead of a scatter-add for the gradient."""

    @staticmethod
    def forward(ctx, diagonals: Tensor, lq: int, lk: int) -> Tensor:
        ctx.shape = (diagonals.shape, lq, lk)
        return _toeplitz_forward(diagonals, lk)

    @staticmethod
    def backward(ctx, grad: Tensor):
        shape, lq, lk = ctx.shape
        n = lq + lk - 1
        g = grad.reshape(-1, lq, lk).flip(-1)  # g'[i, j'] = grad[i, lk-1-j'] lies on diagonal c = i + j'
        out = grad.new_zeros(g.shape[0], n)
        # blocks of rows keep the skewed buffer in cache; compiled, one block (a loop over the rows would fix the
        # length, compiling again for each), the same sums in another order beyond _SKEW_ROWS rows
        compiling = torch.compiler.is_compiling()
        for a in (0,) if compiling else range(0, lq, _SKEW_ROWS):
            rows = lq if compiling else min(_SKEW_ROWS, lq - a)
            width = rows + lk - 1
            skew = grad.new_zeros(g.shape[0], rows, width)
            skew.as_strided((g.shape[0], rows, lk), (rows * width, width + 1, 1)).copy_(g[:, a:a + rows])
            out[:, a:a + width] += skew.sum(-2)  # row i shifted right by i: columns are diagonals
        return out.reshape(*grad.shape[:-2], n).sum_to_size(shape), None, None


_SKEW_ROWS = 128


def toeplitz(diagonals: Tensor, lq: int, lk: int) -> Tensor:
    """(..., Lq + Lk - 1) values per offset i - j, from -(Lk-1) to Lq-1  ->  (..., Lq, Lk) with
    out[..., i, j] = diagonals[..., i - j + Lk - 1]. The relative terms' dense form for consecutive positions."""
    if diagonals.shape[-1] != lq + lk - 1:
        raise ValueError(f"need Lq + Lk - 1 = {lq + lk - 1} diagonals, got {diagonals.shape[-1]}")
    if not (torch.is_grad_enabled() and diagonals.requires_grad):  # no graph to record: the Function's forward
        return _toeplitz_forward(diagonals, lk)
    return _Toeplitz.apply(diagonals, lq, lk)


def take_rows(table: Tensor, positions: Tensor, start: int | None = None) -> Tensor:
    """Rows of a per-head table (H, N, r) at positions (L,) or per example (B, L): (1, H, L, r) or (B, H, L, r).
    `start`: the positions are known to be start, start + 1, ...: a view of the table, no copy."""
    if start is not None:
        return table[:, start:start + positions.shape[-1]].unsqueeze(0)
    rows = table[:, positions]  # (H, L, r) or (H, B, L, r)
    return rows.unsqueeze(0) if positions.dim() == 1 else rows.transpose(0, 1)


def consecutive_offsets(q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
    """The (Lq + Lk - 1,) offsets i - j along the diagonals of `relative_offsets(q_pos, k_pos)` (see `toeplitz`),
    or None when the positions are not runs of consecutive integers (then the offsets are no Toeplitz matrix)
    or are per example (B, L): the general path then gathers."""
    if q_pos.dim() != 1 or k_pos.dim() != 1:
        return None
    lq, lk = len(q_pos), len(k_pos)
    if lq == 0 or lk == 0:
        return None
    for pos in (q_pos, k_pos):
        if len(pos) > 1 and not bool((pos[1:] - pos[:-1] == 1).all()):
            return None
    return torch.arange(lq + lk - 1, device=q_pos.device) + (q_pos[0] - k_pos[-1])
