"""Shaw et al.'s relative attention at inference through the fused kernel: far keys in blocks, the band explicit.

Shaw et al. (2018), as DIET's companion paper writes it (eq. 3), with offsets clipped to ±k:

    A_ij = q_i·(k_j + a^K_c(i−j))/√d_h,     o_i = Σ_j p_ij (v_j + a^V_c(i−j)),     c(r) = clip(r, −k, k)

The value term needs the probabilities, so the reference (`backends.eager`) materialises them. But for a block
of queries [a, a+b) with consecutive positions (pos_i − pos_j = i + δ − j), every key j < a+δ−k has c = +k and
every key j ≥ a+b+δ+k has c = −k for all of the block's queries. There the key term is the row constant
q_i·a^K_{±k} and the value term the constant vector a^V_{±k}, so the fused kernel attends to those keys as
plain attention: the constant goes into its log-sum-exp, the vector onto its output. Only a window of b + 2k
keys per block is computed explicitly. The three parts (left, window, right) are merged through their
log-sum-exps, as flash attention merges key blocks:

    lse_i = log Σ_parts exp(lse_i^part),     o_i = Σ_parts exp(lse_i^part − lse_i) · o_i^part

Below MIN_KEYS keys the windows would cover most keys, and `dense` computes every pair explicitly, as the
reference does, in fewer passes over the scores. Both are the same equation as the reference
(tests/attention/test_banded.py holds them to eager); they need no gradient and no attention dropout, so
`band_or_eager`, the backend registered as "banded" (what `attn_backend="auto"` gives Shaw), runs them at
inference and the reference in training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from dietpe.attention.backends import eager, fold_low_rank
from dietpe.attention.masks import CausalMask, dense_mask
from dietpe.positions.terms import LayerTerms, QueryRelativeBias, ValueTerm

#: queries per block: each block makes two fused-kernel calls (its left and right keys) and one window of
#: BLOCK + 2k keys computed explicitly (the block size measured fastest: docs/bench.md)
BLOCK = 64
#: below this many keys the windows would cover most keys: every pair explicit (`dense`) is faster there
MIN_KEYS = 256


def _fused_cpu_kernel():
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def plan(q: Tensor, k: Tensor, terms: LayerTerms, dropout_p: float) -> tuple | None:
    """(path, key term, value term, low-rank terms to fold) when an inference path here computes this call
    exactly, else None: one banded key term and value term (Shaw with consecutive positions), other logit
    terms low rank (per-head segments), no dropout, no gradient, on CPU, in float32 (the reference takes its
    softmax in float32; these paths would take theirs in a half type), not while compiling (the paths write
    into strided outputs and pick blocks by looking at the data). The path is `banded` from MIN_KEYS keys on,
    else `dense` (which needs the offsets' one-hot)."""
    if dropout_p > 0 or q.device.type != "cpu" or q.dtype != torch.float32:
        return None
    if torch.compiler.is_compiling():
        return None
    if len(terms.values) != 1 or terms.values[0].band is None or terms.qk:
        return None
    value = terms.values[0]
    keys = [t for t in terms.logits if t.band is not None]
    others = [t for t in terms.logits if t.band is None]
    if len(keys) != 1 or keys[0].band != value.band or any(t.factors() is None for t in others):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or value.a.requires_grad or keys[0].r.requires_grad):
        return None
    if k.shape[2] >= MIN_KEYS:
        return (banded, keys[0], value, others) if _fused_cpu_kernel() is not None else None
    if value.onehot is None or keys[0].r.shape[1] != 1:
        return None
    return dense, keys[0], value, others


def band_or_eager(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | CausalMask | None,
                  scale: float, dropout_p: float, need_probs: bool = False) -> tuple[Tensor, Tensor | None]:
    """The "banded" backend: at inference on CPU with consecutive positions, this module's paths (`banded` from
    MIN_KEYS keys on, below it `dense`); else the reference, which training needs (the value term reads the
    dropped probabilities and their gradient)."""
    mask = dense_mask(mask)
    per_head_mask = mask is not None and mask.shape[1] > 1  # the banded paths read one mask for all heads
    found = None if need_probs or per_head_mask else plan(q, k, terms, dropout_p)
    if found is None:
        return eager(q, k, v, terms, mask, scale, dropout_p, need_probs)
    path, *rest = found
    return path(q, k, v, terms, mask, scale, *rest), None


def dense(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | None, scale: float,
          key: QueryRelativeBias, value: ValueTerm, fold: list) -> Tensor:
    """Short inputs: every pair explicit, as in the reference, with fewer passes over the (B, H, Lq, Lk)
    scores: the key term is written by one matmul with the offsets' one-hot, q·kᵀ is added by the next
    (beta = 1), the softmax runs in place, and the output is written in the (B, Lq, H, Dv) layout the layer
    reads. q (B, H, Lq, Dh), k and v (B, H, Lk, Dh); returns (B, H, Lq, Dv)."""
    s = scale * terms.score_scale
    b, h, lq, _ = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    onehot = value.onehot
    q = q.contiguous()  # the layer's heads are a strided view: copied once here, not by each product
    by_offset = key.by_offset(q)  # (B, H, Lq, M)
    m = by_offset.shape[-1]
    q, k = fold_low_rank(q, k, fold, s)
    d = q.shape[-1]
    scores = q.new_empty(b * h, lq, lk)
    by_query = scores.transpose(0, 1)  # (Lq, B·H, Lk): one product per query
    torch.bmm(by_offset.reshape(b * h, lq, m).transpose(0, 1), onehot.by_offset.to(q.dtype), out=by_query)
    scores.baddbmm_(q.reshape(b * h, lq, d), k.reshape(b * h, lk, d).transpose(1, 2), alpha=s)
    scores = scores.view(b, h, lq, lk)
    if mask is not None:
        scores += mask
    probs = torch.softmax(scores, dim=-1, out=scores)
    per_offset = torch.bmm(by_query, onehot.by_pair.to(q.dtype))  # (Lq, B·H, M): Σ_j p_ij [index_ij = m]
    values = (per_offset @ value.a.to(q.dtype)).view(lq, b, h, dv).permute(1, 2, 0, 3)  # (B, H, Lq, Dv)
    out = q.new_empty(b, lq, h, dv).transpose(1, 2)  # the layout the layer reshapes without a copy
    return torch.add(torch.matmul(probs, v), values, out=out)


def banded(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | None, scale: float,
           key: QueryRelativeBias, value: ValueTerm, fold: list, block: int = BLOCK) -> Tensor:
    """The equation for a banded key and value term (see the module docstring). q (B, H, Lq, Dh), k and v
    (B, H, Lk, Dh), mask (B|1, 1, Lq|1, Lk) additive or None; returns (B, H, Lq, Dh)."""
    s = scale * terms.score_scale
    band = value.band
    kk, delta = band.max_distance, band.delta
    b, h, lq, _ = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    by_offset = key.by_offset(q)  # (B, H, Lq, 2k+1): the key term of each query at each clipped offset
    a_v = value.a.to(q.dtype)  # (2k+1, Dv)
    q, k = fold_low_rank(q, k, fold, s)
    if q.shape[-1] != dv:  # the fused kernel wants one head size for q, k and v
        v = F.pad(v, (0, q.shape[-1] - dv))
    if mask is not None:  # a fully masked part must get weight 0, which -inf would not give the kernel's lse
        mask = mask.clamp_min(torch.finfo(mask.dtype).min)

    lse_w, out_w = _window(q, k, v, by_offset, a_v, mask, s, kk, delta, block)
    kernel = _fused_cpu_kernel()
    for start in range(0, lq, block):
        rows = slice(start, min(start + block, lq))
        lo = min(max(start + delta - kk, 0), lk)  # keys [0, lo): offset > k for every query of the block
        hi = min(max(start + block + delta + kk, 0), lk)  # keys [hi, Lk): offset < −k for all of them
        parts = []
        for keys, bucket in ((slice(0, lo), 2 * kk), (slice(hi, lk), 0)):
            if keys.start >= keys.stop:
                continue
            m = None if mask is None else mask[..., rows if mask.shape[-2] > 1 else slice(None), keys]
            o, lse = kernel(q[:, :, rows], k[:, :, keys], v[:, :, keys], attn_mask=m, scale=s)
            parts.append((lse + by_offset[:, :, rows, bucket].float(), o[..., :dv], a_v[bucket]))
        if not parts:
            continue
        own = lse_w[:, :, rows]
        lse = own
        for part, _, _ in parts:
            lse = torch.logaddexp(lse, part)
        o = out_w[:, :, rows]
        o.mul_((own - lse).exp_().unsqueeze(-1).to(q.dtype))
        for part, o_far, a in parts:  # Σ_far p (v + a^V_{±k}) = weight · (o_far + a^V_{±k})
            w = (part - lse).exp_().unsqueeze(-1).to(q.dtype)
            o.addcmul_(o_far, w).addcmul_(w, a)
    return out_w


def _windows(x: Tensor, first: int, nb: int, block: int, width: int) -> Tensor:
    """(B, H, nb, W, D): window n holds keys first + n·block ... + W - 1 of x (B, H, Lk, D), zeros outside
    [0, Lk). Overlapping windows are a strided view of one zero-padded copy: each is contiguous in memory."""
    b, h, lk, d = x.shape
    pad_left = max(0, -first)
    pad_right = max(0, first + (nb - 1) * block + width - lk)
    if pad_left or pad_right:
        padded = x.new_empty(b, h, pad_left + lk + pad_right, d)
        padded[:, :, :pad_left].zero_()
        padded[:, :, pad_left + lk:].zero_()
        padded[:, :, pad_left:pad_left + lk].copy_(x)
        x, first = padded, first + pad_left
    elif not x.is_contiguous():
        x = x.contiguous()
    n = x.shape[2]
    return x.as_strided((b, h, nb, width, d), (h * n * d, n * d, block * d, d, 1), x.storage_offset() + first * d)


def _window(q, k, v, by_offset, a_v, mask, s, kk, delta, block) -> tuple[Tensor, Tensor]:
    """Each block's window of keys [a+δ−k, a+b+δ+k), every pair explicit: (lse (B, H, Lq) in float32, the
    window's output normalised by its own lse, value term included (B, H, Lq, Dv))."""
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], a_v.shape[-1]
    nb = -(-lq // block)
    width = block + 2 * kk
    first = delta - kk  # key index of the first window's first key
    if nb * block != lq:
        q = F.pad(q, (0, 0, 0, nb * block - lq))
        by_offset = F.pad(by_offset, (0, 0, 0, nb * block - lq))
    qp = q.reshape(b, h, nb, block, d)
    scores = torch.matmul(qp, _windows(k, first, nb, block, width).transpose(-1, -2)).mul_(s)  # (B, H, nb, b, W)
    r = torch.arange(block, device=q.device)[:, None]
    w = torch.arange(width, device=q.device)[None, :]
    bucket = (r + kk - w).clamp(-kk, kk) + kk  # (b, W): query a+r, key a+δ−k+w: offset r + k − w, any block
    by_block = by_offset.reshape(b, h, nb, block, -1)
    scores += by_block.gather(-1, bucket.expand(b, h, nb, block, width)).to(scores.dtype)
    key_index = torch.arange(nb, device=q.device)[:, None, None] * block + first + w  # (nb, 1, W)
    outside = (key_index < 0) | (key_index >= lk)
    edge = outside.flatten(1).any(1).nonzero().flatten().tolist()  # only the first and last windows reach out
    for n in edge:
        scores[:, :, n].masked_fill_(outside[n], float("-inf"))
    if mask is not None:
        scores += _mask_windows(mask, nb, block, lq, key_index.clamp(0, lk - 1))
    top = scores.amax(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).min)
    e = scores.sub_(top).exp_()
    total = e.sum(-1, keepdim=True)
    out = torch.matmul(e, _windows(v, first, nb, block, width))[..., :dv]  # (B, H, nb, b, Dv)
    out += torch.einsum("bhnrw,rwd->bhnrd", e, a_v[bucket])  # the value term: a^V of each pair's offset
    out = out.div_(total.to(out.dtype)).reshape(b, h, nb * block, dv)[:, :, :lq]
    lse = (top.float() + total.float().log()).reshape(b, h, nb * block)[:, :, :lq]
    return lse, out


def _mask_windows(mask: Tensor, nb: int, block: int, lq: int, key_index: Tensor) -> Tensor:
    """The additive mask (B|1, 1, Lq|1, Lk) read at each block's window: (B|1, 1, nb|1, b|1, W)."""
    mb = mask.shape[0]
    if mask.shape[-2] == 1:  # padding: the same for every query
        return mask[:, 0, 0][:, key_index.view(nb, -1)].view(mb, 1, nb, 1, -1)
    rows = F.pad(mask[:, 0], (0, 0, 0, nb * block - lq)).view(mb, nb, block, -1)
    return rows.gather(-1, key_index.expand(nb, block, -1).expand(mb, -1, -1, -1)).unsqueeze(1)
