"""The `fused` backend: the one attention equation in one Triton kernel, with every position-only logit term
read inside the tile (`dietpe.attention.kernels.attention`, FlashAttention-2's tiling, Dao 2023), so neither
the forward nor the backward holds an (Lq, Lk) tensor, and the tables' gradients are summed without atomics.

    scores = (q'·k'ᵀ) · scale · score_scale + T[h, i - j] · a_i · c_j + Ŝ[h, σ_i, τ_j] + mask
    (low-rank terms fq·fkᵀ folded in: q' = [q', fq / s], k' = [k', fk], the factors read from their own
    tensors as the head's second part where q's head is one power-of-two part: no copy of q and k per layer)

Each logit term says how it can be read (`dietpe.positions.terms.LogitTerm`): as an offset table T (DIET-REL,
T5 and TUPE-R's buckets, ALiBi, KERPLE, over consecutive positions; TUPE's reset as the 0/1 vectors a, c), a
piecewise table in T's place (FIRE: slope·x + intercept of its MLP's linear piece at x = ψ(|i - j|) /
ψ(max(L, i))), a segment table Ŝ (DIET's per-head segments), or low-rank factors folded into extra query/key
channels (DIET-ABS, TUPE's correlation). qk terms (rotary) are applied before. Masks: causality (a flag;
blocks above the diagonal skipped), padding (one value per key; key blocks outside a row's open keys skipped),
any other 4-D mask read tile by tile (tiles it wholly blocks skipped). While compiling, the kernel is called
through its custom operators (`kernels/op.py`).

Per-example or gapped `position_ids` (packed documents restarting at 0, left padding) are read as runs of
consecutive integers (`dietpe.positions.context.Runs`): the tables along the diagonals i - j are exact on the
pairs inside one run, so they are served where the mask opens no pair across runs (checked once per forward).

Served on CUDA, on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, the tests), and on the meta device
as shapes only (its buffers allocated, nothing launched: `dietpe.bench.footprint` models memory so). A call it
cannot serve raises `NotServed` (a ConfigError) naming why: a mask that opens pairs across runs, positions read
while compiling, a term of another kind, value terms. Attention dropout is drawn in the kernel (Philox, the same
mask again in the backward) from a seed drawn on the device per call, which the kernels read from memory: a
CUDA graph's replay draws anew. `attn_backend="auto"` gives it, on CUDA, the calls with logit terms whose dense
bias sdpa would build block by block (long inputs: `fused_long`), sdpa the rest; asked for by name, a method it
cannot serve is refused when the model is built.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from dietpe.attention import backends
from dietpe.attention.backends import apply_qk, fold_low_rank
from dietpe.attention.kernels import device_problem, triton_problem
from dietpe.attention.masks import CausalMask
from dietpe.errors import NotServed
from dietpe.positions.terms import LayerTerms, LogitTerm, OffsetTable, PiecewiseTable, SegmentTable

#: widest query/key head part the kernel's tiles are sized for (the folded width loads as two parts)
MAX_HEAD_PART = 256


def method_refusal(method) -> str | None:
    """Why a method (its registry entry's traits) cannot be served, or None: checked when a model is built."""
    if "logits" in method.entry and not method.tile_terms:
        return ("its logit term is not a per-offset, segment or piecewise table or low-rank factors, which the "
                "kernel reads in its tile")
    return None


def skip_call(q: Tensor) -> bool:
    """Calls the kernel never takes under "auto": off CUDA, and while compiling (the kernels are opaque to the
    compiler, which fuses sdpa's surroundings instead)."""
    return not q.is_cuda or torch.compiler.is_compiling()


def auto_skip(q: Tensor) -> bool:
    """Calls "auto" gives the next backend (sdpa) without trying the kernel: `skip_call`'s, and those too short
    for sdpa to go block by block even as self-attention with a bias per example (B·H·Lq² elements at most
    `backends.LONG_ELEMENTS`)."""
    b, h, lq = q.shape[:3]
    return skip_call(q) or b * h * lq * lq <= backends.LONG_ELEMENTS


def fused_long(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | CausalMask | None, scale: float,
               dropout_p: float, need_probs: bool = False) -> tuple[Tensor, None]:
    """`fused` where "auto" calls it: where sdpa would attend block by block (`backends.by_blocks`: logit terms
    whose dense bias would exceed `backends.LONG_ELEMENTS`), and in training keep every block for the backward,
    (B|1, H, Lq, Lk) a layer (18 GiB over 12 layers at 8,192 tokens in bf16), where the kernel keeps O(L);
    NotServed otherwise (no term, or short), which sends the call to sdpa, faster there (docs/gpu.md)."""
    if not backends.by_blocks(q, k, terms, mask):
        raise NotServed("short, or no logit term: sdpa's")
    return fused(q, k, v, terms, mask, scale, dropout_p, need_probs)


class Plan(NamedTuple):
    """A layer's logit terms as the kernel reads them."""

    table: OffsetTable | None
    segments: SegmentTable | None
    fold: list[LogitTerm]
    piecewise: PiecewiseTable | None = None


def _sort(term: LogitTerm, tables: list, segments: list, pieces: list, fold: list) -> None:
    for capability, into in ((term.offset_table, tables), (term.segment_table, segments),
                             (term.piecewise_table, pieces)):
        found = capability()
        if found is not None:
            into.append(found)
            return
    if not term.has_factors():
        raise NotServed(f"attn_backend='fused' cannot serve the logit term {type(term).__name__} here: it gives "
                        f"no offset, segment or piecewise table (position_ids that are no runs of consecutive "
                        f"integers, or positions read while compiling) or low-rank factors; use "
                        f"attn_backend='sdpa'")
    fold.append(term)


def _check_runs(found: list, mask: Tensor | CausalMask | None) -> None:
    """Tables read along per-example positions' runs are exact where the mask opens only pairs in one run."""
    for runs in {id(t.runs): t.runs for t in found if t.runs is not None}.values():
        causal = isinstance(mask, CausalMask)
        if not runs.hold(None if causal else mask, causal):
            raise NotServed("attn_backend='fused' reads relative terms along the diagonals i - j, but these "
                            "position_ids differ from i - j on pairs the attention mask leaves open (runs of "
                            "consecutive positions are served: packed documents restarting at 0 with a "
                            "block-diagonal mask, or a shift; strided or reversed positions are not); use "
                            "attn_backend='sdpa'")


def plan(terms: list[LogitTerm], mask: Tensor | CausalMask | None = None) -> Plan:
    """The logit terms as an offset table, a segment table, a piecewise table and low-rank terms to fold;
    NotServed for any other, for a combination the kernel has no slot for, or for tables read along
    per-example positions' runs where `mask` opens a pair across runs."""
    quick = _quick_plan(terms)
    if quick is not None:
        return quick
    tables, segments, pieces, fold = [], [], [], []
    for term in terms:
        for part in term.parts() or (term,):
            _sort(part, tables, segments, pieces, fold)
    _check_runs(tables + pieces, mask)
    if len(segments) > 1 or (len(tables) > 1 and any(t.q_keep is not None for t in tables)):
        raise NotServed("attn_backend='fused' reads one segment table and one offset table with a keep; use "
                        "attn_backend='sdpa'")
    if len(pieces) > 1 or (pieces and tables):
        raise NotServed("attn_backend='fused' reads a piecewise table's numerator where an offset table goes: it "
                        "serves one piecewise table and no offset table beside it; use attn_backend='sdpa'")
    table = None
    if tables:
        table = OffsetTable(sum((t.values for t in tables[1:]), tables[0].values), tables[0].q_keep,
                            tables[0].k_keep, tables[0].runs)
    return Plan(table, segments[0] if segments else None, fold, pieces[0] if pieces else None)


def _quick_plan(terms: list[LogitTerm]) -> Plan | None:
    """The usual cases, an offset table at consecutive positions and a segment table, at most one of each,
    sorted without `plan`'s lists and checks (every layer asks); None for any other."""
    table = segments = None
    for term in terms:
        found = term.offset_table() if table is None else None
        if found is not None and found.runs is None:
            table = found
            continue
        found = term.segment_table() if segments is None else None
        if found is None:
            return None
        segments = found
    return Plan(table, segments, [])


_NO_TERMS = Plan(None, None, [])
_KERNELS: list[tuple] = []  # imported when a model that may call them is built (`prepare`), then kept


def _kernel_module() -> tuple:
    if not _KERNELS:
        from dietpe.attention.kernels import attention
        from dietpe.attention.kernels.op import fused_attention_op

        _KERNELS.append((attention, fused_attention_op))
    return _KERNELS[0]


def prepare(auto: bool) -> None:
    """Import the kernels (Triton with them) when a model that may call them is built (by name, or through
    "auto" where CUDA is), not at its first call: a forward compiled before their import guards on it and
    compiles again at its second call (a whole model's graphs: minutes with inductor)."""
    if (not auto or torch.cuda.is_available()) and triton_problem() is None:
        _kernel_module()


def fused(q: Tensor, k: Tensor, v: Tensor, terms: LayerTerms, mask: Tensor | CausalMask | None, scale: float,
          dropout_p: float, need_probs: bool = False) -> tuple[Tensor, None]:
    """The equation by the fused kernel; NotServed (before any work) for a call it cannot serve."""
    problem = triton_problem() if q.is_meta else device_problem(q)  # meta: nothing launched (shapes, memory)
    if problem:
        raise NotServed(f"attn_backend='fused': {problem}; use attn_backend='auto' or 'sdpa'")
    if terms.values:
        raise NotServed("attn_backend='fused' cannot add value terms (Shaw's); use attn_backend='eager'")
    table, segments, fold, piecewise = plan(terms.logits, mask) if terms.logits else _NO_TERMS
    kernels, fused_attention_op = _kernel_module()
    s = scale * terms.score_scale
    if terms.qk:
        q, k = apply_qk(q, k, terms)
    folded = None
    if fold:
        folded = _folded(q, fold, s, kernels.head_parts)
        if folded is None:
            q, k = fold_low_rank(q, k, fold, s)
    widths = (q.shape[-1], v.shape[-1], 0 if folded is None else folded[0].shape[-1])
    # a head of at most MAX_HEAD_PART channels loads as parts of at most that
    if max(widths) > MAX_HEAD_PART and max(*kernels.head_parts(widths[0]), *widths[1:]) > MAX_HEAD_PART:
        raise NotServed(f"attn_backend='fused' takes head sizes up to {MAX_HEAD_PART} (+ folded channels), got "
                        f"{q.shape[-1]} and {v.shape[-1]}; use attn_backend='sdpa'")
    causal = isinstance(mask, CausalMask)
    compiling = torch.compiler.is_compiling()
    # compiled, the kernel's operator draws the seed itself
    seed = 0 if compiling or dropout_p <= 0 else kernels.dropout_seed(dropout_p, q)
    extras = kernels.Extras(causal=causal, mask=None if causal else mask, dropout=dropout_p, seed=seed)
    if table is not None and table.q_keep is not None:
        extras.q_keep, extras.k_keep = (x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()
                                        for x in (table.q_keep, table.k_keep))
    if segments is not None:
        # read in their own integer dtype: no cast per layer
        q_ids, k_ids = segments.q_ids, segments.k_ids
        extras.q_segments = q_ids if q_ids.stride(-1) == 1 else q_ids.contiguous()
        extras.k_segments = k_ids if k_ids.stride(-1) == 1 else k_ids.contiguous()
    values, pieces, packed = (table.values if table is not None else None), None, None
    if piecewise is not None:
        values = piecewise.numerator.unsqueeze(0)  # (1, Lq + Lk - 1): the heads share it
        pieces = (piecewise.den, piecewise.kinks, piecewise.slope, piecewise.intercept)
        if not compiling:  # packed once for the layers that share the table (the operator packs its own)
            packed = piecewise.derived.get("packed")
            if packed is None:
                packed = piecewise.derived["packed"] = kernels.pack_pieces(*pieces[1:])
    # compiling: the kernel as custom operators (dynamo cannot trace Triton's launcher)
    args = (q, k, v, s, values, segments.table if segments is not None else None, extras, pieces, folded)
    if compiling:
        return fused_attention_op(*args), None
    return kernels.fused_attention(*args, packed=packed), None


def _folded(q: Tensor, fold: list[LogitTerm], s: float, head_parts) -> tuple[Tensor, Tensor] | None:
    """A low-rank term's factors (fq / s, fk) for the kernel to read as a second head part from their own tensors
    (shared by the batch: no copy of q and k per layer, no slices of their gradients), or None where they are
    concatenated to q and k instead: several terms, a head size the kernel loads in two parts already, or more
    loaded channels than the concatenation (a rank just past a power of two)."""
    if len(fold) != 1 or head_parts(q.shape[-1])[1]:
        return None
    term = fold[0]
    d, r = q.shape[-1], term.rank
    if max(16, 1 << (r - 1).bit_length()) > sum(head_parts(d + r)) - head_parts(d)[0]:
        return None
    # once per forward for the layers that share the term (DIET-ABS's sharing=layer)
    return term.folded(s, q.dtype)
