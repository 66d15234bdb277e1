"""The one attention equation and the backends that compute it.

    scores = (q'·k'ᵀ) · scale · score_scale + Σ logit terms + mask         (q', k' = qk terms applied to q, k)
    out    = dropout(softmax(scores)) · v + Σ value terms(dropout(softmax(scores)))

`eager` is the reference, written straight from the equation. `sdpa` (torch's scaled_dot_product_attention)
and `flex` (FlexAttention) compute the same thing; the tests hold them to the reference, gradients included.
Each is an `AttentionFunction`, registered by name in `dietpe.attention.registry`.
Low-rank logit terms (fq·fkᵀ) are folded into extra query/key channels for the fused kernels:
[q', fq / s]·[k', fk]ᵀ · s = q'·k'ᵀ · s + fq·fkᵀ, so no (B, H, Lq, Lk) bias is built for them.
Off the CPU the folded width is padded with zero channels to a multiple of 8, which the fused GPU kernels
need (else SDPA silently takes its math kernel and builds the scores).
Shapes: q (B, H, Lq, Dh), k and v (B, H, Lk, Dh), out (B, H, Lq, Dh), mask (B|1, 1|H, Lq|1, Lk) additive
(0 or finfo.min, as `dietpe.attention.masks` builds it), a `CausalMask` (causality alone: sdpa passes
`is_causal=True` when no bias is left to add, every other path builds it out), or None.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from dietpe.attention.masks import CausalMask, dense_mask
from dietpe.errors import ConfigError
from dietpe.positions.terms import LayerTerms, LogitTerm


def apply_qk(q: Tensor, k: Tensor, terms: LayerTerms) -> tuple[Tensor, Tensor]:
    for transform in terms.qk:
        q, k = transform(q, k)
    return q, k


@dataclass
class Logits:
    """The equation's logits, term by term (each (B|1, H|1, Lq, Lk)): what the eager backend adds up and what
    the analysis (DIET Fig. 2, 8) takes apart. `parts` pairs each logit term's kind ("position" or "segment")
    with its dense value."""

    content: Tensor
    parts: list[tuple[str, Tensor]]

    def of(self, kind: str) -> Tensor | None:
        """The sum of the parts of one kind, or None when there is none."""
        found = [t for k, t in self.parts if k == kind]
        return sum(found[1:], found[0]) if found else None

    @property
    def full(self) -> Tensor:
        """content + Σ parts: what the softmax sees before the mask."""
        out = self.content
        for _, term in self.parts:
            out = out + term.to(out.dtype)
        return out


def logits(q: Tensor, k: Tensor, terms: LayerTerms, scale: float) -> Logits:
    """The logits of the one equation before the mask: (q'·k'ᵀ) · scale · score_scale and every logit term."""
    q_raw = q
    q, k = apply_qk(q, k, terms)
    content = torch.matmul(q, k.transpose(-1, -2)).mul_(scale * terms.score_scale)  # (B, H, Lq, Lk)
    return Logits(content, [(term.kind, term.dense(q_raw)) for term in terms.logits])


def fit_mask(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """The additive mask in `dtype`, its blocked entries at `dtype`'s own minimum: float32's minimum cast to
    bfloat16 or float16 is -inf, and a row with every key blocked would give NaN instead of a finite value."""
    if mask is None or mask.dtype == dtype or not dtype.is_floating_point:
        return mask
    return mask.clamp_min(torch.finfo(dtype).min).to(dtype)


def eager(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | CausalMask | None, scale: float,
          dropout_p: float, need_probs: bool = True) -> tuple[Tensor, Tensor]:
    """The reference: every term built densely and added to the logits."""
    mask = dense_mask(mask)
    parts = logits(q, k, terms, scale)
    scores = parts.content  # a fresh (B, H, Lq, Lk): the terms and the mask are added into it in place
    for _, term in parts.parts:
        scores = scores.add_(term.to(scores.dtype))
    if mask is not None:
        scores = scores.add_(fit_mask(mask, scores.dtype))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    dropped = F.dropout(probs, p=dropout_p) if dropout_p > 0 else probs
    out = dropped @ v
    for term in terms.values:
        out = out + term(dropped)
    return out, probs


# Head sizes the fused GPU kernels take (the memory-efficient kernel in half precision, flash): multiples of 8
GPU_WIDTH_MULTIPLE = 8


def fold_low_rank(q: Tensor, k: Tensor, terms: list[LogitTerm], s: float, multiple: int = 1) -> tuple[Tensor, Tensor]:
    """Fold low-rank logit terms fq·fkᵀ into extra query/key channels, for the fused kernels (sdpa, flex):
    [q', fq / s]·[k', fk]ᵀ · s = q'·k'ᵀ · s + fq·fkᵀ, so no (B, H, Lq, Lk) bias is built for them. The width
    is padded with zero channels (which add nothing to q·kᵀ) up to a multiple of `multiple`."""
    if not terms:
        return q, k
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    extra_q, extra_k = [], []
    for term in terms:
        fq, fk = term.factors()
        extra_q.append((fq / s).to(q.dtype).expand(b, h, lq, -1))
        extra_k.append(fk.to(k.dtype).expand(b, h, lk, -1))
    width = q.shape[-1] + sum(e.shape[-1] for e in extra_q)
    pad = -width % multiple
    if pad:
        extra_q.append(q.new_zeros(b, h, lq, pad))
        extra_k.append(k.new_zeros(b, h, lk, pad))
    return torch.cat([q, *extra_q], dim=-1), torch.cat([k, *extra_k], dim=-1)


# Low-rank terms up to this rank are folded into extra q/k channels; wider ones (DIET-ABS's d_p = Dh, TUPE's
# Dh + 2) are multiplied out once per forward into the dense bias on CPU: shared by the batch, the (1, H, Lq, Lk)
# product costs less than widening every q·k dot product (and, when inference runs the fused CPU kernel,
# than padding v to the widened head size), measured by `dietpe bench`.
FOLD_MAX_RANK = 8
# At inference on CPU, low-rank terms with at most this many keys (per-head segments at 128 tokens) are added to
# the bias instead: folding copies q, k, v into the widened head size and the output back, which costs more
# than writing a (B, H, Lq, Lk) bias below about 256 keys and less above it (docs/bench.md, "Fold or multiply out")
ADD_LOW_RANK_KEYS = 256
# A dense bias of more than LONG_ELEMENTS elements (256 MiB in float32: never at 512 tokens, always at 8,192)
# is built one block of at most BLOCK_ELEMENTS at a time, each block of queries attended on its own, so long
# inputs never hold an (B|1, H, Lq, Lk) bias (2 GiB per layer at 8,192 tokens and 8 heads). Below it, one
# call, with folding: blocks give up the fold (each block's terms are dense) and pay per call.
LONG_ELEMENTS = 1 << 26
BLOCK_ELEMENTS = 1 << 21


def _bias_batch(term: LogitTerm, b: int) -> int:
    """The batch size of a term's dense form: 1 for position-only terms."""
    return b if term.query_dependent else term.batch


def by_blocks(q: Tensor, k: Tensor, terms: LayerTerms, mask) -> int:
    """The batch of the dense bias when sdpa attends these logit terms one block of queries at a time (the bias,
    with the mask's batch, would exceed LONG_ELEMENTS), else 0."""
    b, h, lq = q.shape[:3]
    if not terms.logits or lq <= 1:  # (an `if`, not bool(list): torch 2.11's dynamo cannot trace that)
        return 0
    bias_batch = max([_bias_batch(t, b) for t in terms.logits] + [b if mask is not None else 1])
    return bias_batch if bias_batch * h * lq * k.shape[2] > LONG_ELEMENTS else 0


def _fused_cpu_kernel_possible(q: Tensor, dropout_p: float, bias: Tensor | None) -> bool:
    """CPU SDPA runs its flash kernel only without dropout and with no gradient for the mask."""
    grad_for_bias = bias is not None and bias.requires_grad and torch.is_grad_enabled()
    return q.device.type == "cpu" and dropout_p == 0 and not grad_for_bias


def sdpa(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | CausalMask | None, scale: float,
         dropout_p: float, need_probs: bool = False) -> tuple[Tensor, None]:
    """torch's scaled_dot_product_attention, with the bias built the cheapest way the shapes allow."""
    if terms.values:
        raise ConfigError("the sdpa backend cannot add value terms (Shaw); use attn_backend='eager'")
    s = scale * terms.score_scale
    q_raw = q
    q, k = apply_qk(q, k, terms)
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    bias_batch = by_blocks(q, k, terms, mask)
    if bias_batch:
        return _sdpa_blocks(q, k, v, terms, dense_mask(mask), s, dropout_p, q_raw, bias_batch), None
    fold, dense = [], []
    for term in terms.logits:
        factors = term.factors()
        if factors is not None and (factors[0].shape[-1] <= FOLD_MAX_RANK or q.device.type != "cpu"):
            fold.append(term)
        else:
            dense.append(term)
    # causality alone, and no dense term to add it to: SDPA's is_causal (which takes no mask beside it)
    causal = isinstance(mask, CausalMask) and not dense
    mask = None if causal else dense_mask(mask)
    bias = _summed_bias(dense, fit_mask(mask, q.dtype), q_raw, q.dtype)
    if fold and not causal and lk <= ADD_LOW_RANK_KEYS and _fused_cpu_kernel_possible(q, dropout_p, bias) and not (
            torch.is_grad_enabled() and any(f.requires_grad for t in fold for f in t.factors())):
        bias, fold = _add_low_rank(bias, fold, q.dtype), []
    dv = v.shape[-1]
    if fold:
        on_cpu = q.device.type == "cpu"
        q, k = fold_low_rank(q, k, fold, s, 1 if on_cpu else GPU_WIDTH_MULTIPLE)
        # one head size for q, k and v: what the CPU kernel needs, and on a GPU what flash needs, which serves
        # only calls without a bias (with one, the memory-efficient kernel takes v at its own width)
        if _fused_cpu_kernel_possible(q, dropout_p, bias) or (not on_cpu and bias is None):
            v = F.pad(v, (0, q.shape[-1] - dv))
    if causal:
        out = run_sdpa(q, k, v, None, dropout_p, s, is_causal=True)
    else:
        out = run_sdpa(q, k, v, bias, dropout_p, s)
    return out[..., :dv], None


def run_sdpa(q, k, v, bias, dropout_p, scale, is_causal=False):
    """The kernel call itself (a seam for tests that look at the widths and the bias the kernel gets)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale,
                                          is_causal=is_causal)


def _add_low_rank(bias: Tensor | None, terms: list[LogitTerm], dtype: torch.dtype) -> Tensor:
    """bias + Σ fq·fkᵀ as one fresh tensor (the bias may be kept or shared by layers: never written)."""
    out = None
    for term in terms:
        fq, fk = term.factors()
        product = torch.matmul(fq.to(dtype), fk.to(dtype).transpose(-1, -2))  # (1|B, H|1, Lq, Lk)
        out = product if out is None else out + product
    if bias is None:
        return out
    if torch.broadcast_shapes(out.shape, bias.shape) == out.shape:
        return out.add_(bias)
    return out + bias


def _summed_bias(dense: list[LogitTerm], mask: Tensor | None, q_raw: Tensor, dtype: torch.dtype) -> Tensor | None:
    """Σ dense terms + mask. Position-only terms give the same sum in every layer that shares them, kept on the
    first term for the forward (one entry a term: a new mask or dtype replaces it): at inference for any such
    terms (T5, ALiBi, KERPLE, FIRE: one term for all layers), in training only for several (TUPE's correlation
    and buckets): a single term's sum shared by the layers would add their bfloat16 gradients in bfloat16."""
    shared = len(dense) > 0 and all(not t.query_dependent and t.reuse for t in dense) and (
        len(dense) > 1 or not torch.is_grad_enabled()) and not torch.compiler.is_compiling()  # compiled: one graph
    if not shared:
        return _sum(dense, mask, q_raw, dtype)
    slot = dense[0].per_forward("sdpa sum", lambda: [None])
    hit = slot[0]
    if hit is not None and hit[0] == dtype and hit[1] is mask and len(hit[2]) == len(dense) - 1 and all(
            a is b for a, b in zip(hit[2], dense[1:])):
        return hit[3]
    bias = _sum(dense, mask, q_raw, dtype)
    slot[0] = (dtype, mask, tuple(dense[1:]), bias)
    return bias


def _sum(dense: list[LogitTerm], mask: Tensor | None, q_raw: Tensor, dtype: torch.dtype) -> Tensor | None:
    bias = None
    for term in dense:
        d = term.dense(q_raw).to(dtype)
        bias = d if bias is None else bias + d
    if mask is not None:
        bias = mask if bias is None else bias + mask
    return bias


def _sdpa_blocks(q, k, v, terms: LayerTerms, mask, s, dropout_p, q_raw, bias_batch) -> Tensor:
    """Attention for blocks of queries, each with its own block of every term: rows of softmax are independent,
    so this is the same equation with at most BLOCK_ELEMENTS bias elements alive at a time."""
    b, h, lq, _ = q.shape
    lk = k.shape[2]
    step = max(1, BLOCK_ELEMENTS // (bias_batch * h * lk))
    keep_graph = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs = [] if keep_graph else None
    out = None if keep_graph else q.new_empty(b, h, lq, v.shape[-1])
    mask = fit_mask(mask, q.dtype)
    for start in range(0, lq, step):
        stop = min(start + step, lq)
        bias = None
        for term in terms.logits:
            block = term.dense(q_raw, (start, stop)).to(q.dtype)  # (1|B, H|1, rows, Lk)
            bias = block if bias is None else bias + block
        if mask is not None:
            m = mask[..., start:stop, :] if mask.shape[-2] > 1 else mask
            bias = m if bias is None else bias + m
        o = F.scaled_dot_product_attention(q[:, :, start:stop], k, v, attn_mask=bias, dropout_p=dropout_p, scale=s)
        if keep_graph:
            outs.append(o)
        else:
            out[:, :, start:stop] = o
    return torch.cat(outs, dim=2) if keep_graph else out


# Block masks of the masks alive now, by identity: a forward builds its mask once and hands the same tensor to
# every layer, so each forward builds one block mask per mask (an encoder-decoder: padding, causal, cross)
# whatever the layers' terms. A few slots, each holding a weak reference, so no mask is kept alive.
_BLOCK_MASKS: dict[int, tuple] = {}
BLOCK_MASK_SLOTS = 4


def _mask_mod(mask: Tensor):
    """The additive mask (B|1, 1|H, Lq|1, Lk) of 0 and finfo.min (padding, causality, packed documents) as a
    mask_mod: a pair is attended where the mask is 0."""
    per_batch, per_head, per_query = mask.shape[0] > 1, mask.shape[1] > 1, mask.shape[2] > 1
    return lambda b, h, qi, ki: mask[b if per_batch else 0, h if per_head else 0, qi if per_query else 0, ki] == 0


def _block_mask(mask: Tensor | None, b: int, lq: int, lk: int):
    """Padding and causality as FlexAttention's block mask (blocks with no key to see are skipped), built once
    per mask, so once per forward for every layer (compiled on CUDA, where the uncompiled builder materialises
    (Lq, Lk))."""
    if mask is None:
        return None
    key = (b, lq, lk, mask._version)  # the version: a mask written in place is a new mask
    hit = _BLOCK_MASKS.get(id(mask))
    if hit is not None and hit[0]() is mask and hit[1] == key:
        return hit[2]
    from torch.nn.attention.flex_attention import create_block_mask
    block_mask = create_block_mask(_mask_mod(mask), b if mask.shape[0] > 1 else None,
                                   mask.shape[1] if mask.shape[1] > 1 else None, lq, lk, device=mask.device,
                                   _compile=mask.is_cuda)
    for stale in [i for i, (ref, *_) in _BLOCK_MASKS.items() if ref() is None]:
        del _BLOCK_MASKS[stale]
    while len(_BLOCK_MASKS) >= BLOCK_MASK_SLOTS:
        del _BLOCK_MASKS[next(iter(_BLOCK_MASKS))]
    _BLOCK_MASKS[id(mask)] = (weakref.ref(mask), key, block_mask)
    return block_mask


def flex_plan(terms: LayerTerms, q_raw: Tensor) -> tuple[list, list[LogitTerm]]:
    """Split logit terms into score_mods (read pair by pair from indices and parameters) and low-rank terms to
    fold into q/k. A term that offers neither cannot be served: ConfigError."""
    mods, fold = [], []
    for term in terms.logits:
        mod = term.score_mod(q_raw)
        if mod is not None:
            mods.append(mod)
        elif term.factors() is not None:
            fold.append(term)
        else:
            raise ConfigError(f"the flex backend cannot serve the logit term {type(term).__name__}: it has neither "
                              f"a score_mod nor low-rank factors; use attn_backend='sdpa'")
    return mods, fold


def _call_flex(q, k, v, block_mask, scale, mods, kernel_options):
    """flex_attention with Σ mods as its score_mod (mods: ((fn, args), ...), see `ScoreMod`). The score_mod is
    made here, from functions and tensors passed in, so a compiled kernel of this function serves every call
    whose mods have the same functions: their tensors are its inputs."""
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, q_idx, kv_idx):
        for fn, args in mods:
            score = score + fn(b, h, q_idx, kv_idx, *args)
        return score

    return flex_attention(q, k, v, score_mod=score_mod if mods else None, block_mask=block_mask, scale=scale,
                          kernel_options=kernel_options)


# Bytes of one row of q, k or v (its head size rounded up to a power of two, as the kernel's tiles are) above
# which flex's default tile configurations ask for more shared memory than a GPU has: on an H200, float32
# rows of 128 channels (DIET-ABS folded) compiled, TUPE's folded 130 (256 in the tiles) asked for 378,624
# bytes of its 232,448 (pytorch #133254). Past it the tiles shrink.
FLEX_ROW_BYTES = 512
FLEX_SMALL_TILES = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_M1": 32, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 32,
                    "num_stages": 1}


def flex_kernel_options(width: int, dtype: torch.dtype) -> dict | None:
    """flex_attention's kernel_options for heads of `width` channels: small tiles for wide rows, else None (its
    own choice)."""
    padded = 1 << max(width - 1, 0).bit_length()
    return dict(FLEX_SMALL_TILES) if padded * dtype.itemsize > FLEX_ROW_BYTES else None


# Compiled `_call_flex`, one per kind of score_mod (its functions and the functions among their arguments).
# Dynamo keeps its compiled entries, and its limit of 8 recompiles, per code object: a process that meets
# many methods would run out of them with one shared code object, so each kind gets a copy of its own.
_FLEX_KERNELS: dict[tuple, Callable] = {}


def flex_kind(mods: list) -> tuple:
    """The kind of a list of score_mods: what their kernel is traced for (their tensors excluded)."""
    return tuple((m.fn, *[a for a in m.args if not isinstance(a, Tensor)]) for m in mods)


def flex_kind_name(kind: tuple) -> str:
    """A readable name of a kind (its kernel's name in dynamo's logs)."""
    names = [getattr(f, "__name__", type(f).__name__) for part in kind for f in part if callable(f)]
    return "flex_" + "_".join(names) if kind else "flex_plain"


def compiled_flex(kind: tuple, **compile_options) -> Callable:
    """The compiled `_call_flex` for score_mods of `kind`, made once per kind."""
    if kind not in _FLEX_KERNELS:
        name = flex_kind_name(kind)
        code = _call_flex.__code__.replace(co_name=name)
        fn = types.FunctionType(code, _call_flex.__globals__, name)
        # dynamic=None: the first length compiles static, a second one recompiles once with dynamic lengths
        # (padding, group_by_length, generate), not once per length
        _FLEX_KERNELS[kind] = torch.compile(fn, **{"dynamic": None, **compile_options})
    return _FLEX_KERNELS[kind]


def flex_compiled(q: Tensor) -> bool:
    """Whether flex runs compiled: on CUDA (uncompiled it materialises the scores)."""
    return q.is_cuda


def flex(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | CausalMask | None, scale: float,
         dropout_p: float, need_probs: bool = False) -> tuple[Tensor, None]:
    """FlexAttention: every relative, distance and segment term is a score_mod computed from indices and the
    term's own parameters (no (Lq, Lk) bias is built), low-rank terms are folded into q/k as for sdpa, and
    padding and causality are a block mask (built from the additive mask, or given as a `BlockMask`)."""
    if terms.values:
        raise ConfigError("the flex backend cannot add value terms (Shaw); use attn_backend='eager'")
    if dropout_p > 0:
        raise ConfigError("FlexAttention has no attention dropout; set attention_probs_dropout_prob=0 or use "
                          "attn_backend='sdpa'")
    if torch.is_grad_enabled() and q.requires_grad and not q.is_cuda:
        raise ConfigError("FlexAttention's backward needs CUDA; on CPU use attn_backend='sdpa' for training "
                          "(attach(..., backend='sdpa'); flex runs forward-only there, under torch.no_grad())")
    s = scale * terms.score_scale
    from torch.nn.attention.flex_attention import BlockMask

    given = mask if isinstance(mask, BlockMask) else None  # a block mask built by the caller (Hugging Face's)
    q_raw, mask = q, None if given is not None else dense_mask(mask)
    q, k = apply_qk(q, k, terms)
    mods, fold = flex_plan(terms, q_raw)
    q, k = fold_low_rank(q, k, fold, s)
    b, _, lq, _ = q.shape
    lk = k.shape[2]
    block_mask = given if given is not None else _block_mask(mask, b, lq, lk)
    dv = v.shape[-1]
    v_pad = F.pad(v, (0, q.shape[-1] - dv)) if q.shape[-1] != dv else v  # one head size for q, k and v
    fn, loud = _call_flex, contextlib.nullcontext()
    if flex_compiled(q):
        fn = compiled_flex(flex_kind(mods))
        # past the recompile limit dynamo would silently run flex uncompiled, which materialises the scores
        loud = torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
    with loud:
        out = run_flex(fn, q, k, v_pad, tuple((m.fn, m.args) for m in mods), block_mask, s)
    return out[..., :dv], None


def run_flex(fn, q, k, v, mods, block_mask, scale):
    """The kernel call itself (a seam for tests that watch what the backend builds around it)."""
    options = flex_kernel_options(q.shape[-1], q.dtype) if q.is_cuda else None  # the CPU's kernel has no tiles
    return fn(q, k, v, block_mask, scale, mods, options)
