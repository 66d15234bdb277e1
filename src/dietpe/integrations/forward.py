"""The positions of one forward of an attached model, and the terms the method builds from them.

A forward pre-hook on the base model (`pre_hook`) reads the queries' positions (`position_ids`, or the cache's
length plus 0, 1, ...) and, when the caller gives positions of its own, records every token's position on the
cache, so that later steps know the positions of the cached keys. The layers' terms are built lazily, in the
attention function, from the key length Lk the layer actually receives: a dynamic cache hands attention the
past and new keys, a static cache its whole preallocated buffer (unfilled slots masked), a sliding-window cache
the last keys only. In every case the key slot j holds the token of cumulative index j + max(0, n - Lk), n the
tokens seen so far (past and new), which is what `key_positions` reads.

Everything lives on the attached module (`AttachedPositions.state`) or on the cache object, and the hook is a
plain function finding the attached module through the module it is called on, so `copy.deepcopy(model)` gives
a model whose hook and state are its own. Nothing here reads tensor values (no host sync, no graph break), so a
full-graph `torch.compile` of the forward holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn

from dietpe.errors import InputError
from dietpe.positions.context import Context
from dietpe.positions.terms import EMPTY, LayerTerms

#: where the positions of the tokens a cache holds are kept (an attribute of the cache object)
RECORD = "_dietpe_positions"


@dataclass
class ForwardState:
    """One forward's positions. q_ids (1|B, Lq): the queries' positions; seen: the number of tokens the cache
    holds after this step (past + Lq; a tensor for a static cache); record: every seen token's position
    (1|B, ≥ seen) when the caller gave positions, else None (the default 0, 1, ...); contexts: the `Context`
    for each key length met in this forward."""

    q_ids: Tensor
    seen: int | Tensor
    record: Tensor | None
    segments: Tensor | None = None
    contexts: dict = field(default_factory=dict)
    masks: dict = field(default_factory=dict)


def _positions_of(value, batch: int, length: int) -> Tensor | None:
    if value is None:
        return None
    if not isinstance(value, Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool:
        raise InputError(f"position_ids must be an integer tensor, got {getattr(value, 'dtype', type(value).__name__)}")
    if tuple(value.shape) not in ((length,), (1, length), (batch, length)):
        raise InputError(f"position_ids has shape {tuple(value.shape)}, but the input is (batch={batch}, "
                         f"length={length}): give ({length},), (1, {length}) or ({batch}, {length})")
    return value.reshape(-1, length)


def _static_length(cache) -> int | None:
    """The preallocated length of a static cache (its longest layer), or None for a cache that grows."""
    lengths = [getattr(layer, "max_cache_len", None) for layer in getattr(cache, "layers", ())]
    lengths = [n for n in lengths if isinstance(n, int)]
    return max(lengths) if lengths and getattr(cache, "is_compileable", False) else None


def _record(cache, q_ids: Tensor, past, length: int) -> Tensor:
    """Every seen token's position, this step's included, kept on the cache: a growing tensor for a dynamic
    cache, a preallocated (1|B, max_cache_len) buffer written in place for a static one (compiled decoding)."""
    before = getattr(cache, RECORD, None)
    static = _static_length(cache)
    if static is not None and (isinstance(past, Tensor) or past + length <= static):
        rows = q_ids.shape[0]
        if before is None or before.shape[-1] != static or before.shape[0] not in (1, rows):
            old = before
            before = torch.arange(static, device=q_ids.device)[None].expand(rows, -1).clone()
            if old is not None and isinstance(past, int) and past:
                before[:, :past] = old[..., :past]
        elif before.shape[0] < rows:
            before = before.expand(rows, -1).clone()
        index = torch.arange(length, device=q_ids.device) + past
        before.index_copy_(1, index, q_ids.expand(before.shape[0], -1).to(before.dtype))
        setattr(cache, RECORD, before)
        return before
    if before is None:
        before = torch.arange(int(past), device=q_ids.device)[None]
    before = before[..., :int(past)]
    rows = max(before.shape[0], q_ids.shape[0])
    record = torch.cat((before.expand(rows, -1), q_ids.expand(rows, -1)), dim=-1)
    setattr(cache, RECORD, record)
    return record


def bind(names: tuple[str, ...], args: tuple, kwargs: dict) -> dict:
    """The forward's arguments by name (positional ones by the signature's order), without `inspect`."""
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


def _get(bound: dict, *names: str):
    for name in names:
        value = bound.get(name)
        if value is not None:
            return value
    return None


def pre_hook(module: nn.Module, args: tuple, kwargs: dict):
    """The base model's forward pre-hook: the forward's `ForwardState`, and input terms added to the embeddings
    for families without a learned table to route them through."""
    attached = module._modules.get("diet_positions")
    if attached is None:
        return None
    bound = bind(attached.forward_params, args, kwargs)
    input_ids, embeds = bound.get("input_ids"), bound.get("inputs_embeds")
    source = input_ids if input_ids is not None else embeds
    if source is None:
        attached.state = None
        return None
    b, length = source.shape[:2]
    device = source.device
    cache = _get(bound, "past_key_values", "cache")
    cache = getattr(cache, "self_attention_cache", cache)
    past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
    if isinstance(past, Tensor) and not torch.compiler.is_compiling():
        past = int(past)
    q_ids = _positions_of(bound.get("position_ids"), b, length)
    record = None
    if q_ids is None:
        q_ids = (torch.arange(length, device=device) + past)[None]  # (1, L)
    q_ids = q_ids.to(device)
    custom = bound.get("position_ids") is not None
    if cache is not None and (custom or getattr(cache, RECORD, None) is not None):
        record = _record(cache, q_ids, past, length)
    elif custom:
        record = q_ids  # no cache: the keys are the queries
    segments = bound.get("token_type_ids") if attached.family.segments else None
    attached.start(ForwardState(q_ids, past + length, record, segments), length, past)
    new = None
    if custom and bound["position_ids"].dim() == 1:  # (L,) as (1, L): the families' RoPE modules need a batch
        new = {**bound, "position_ids": q_ids}
    if attached.family.embed_in_hook:
        extra = attached.input_term(q_ids)
        if extra is not None:
            if embeds is None:
                embeds = module.get_input_embeddings()(input_ids)
            new = dict(new or bound)
            new.pop("input_ids", None)
            new["inputs_embeds"] = embeds + extra.to(embeds.dtype)
    return None if new is None else ((), new)


def key_positions(state: ForwardState, lk: int, device: torch.device) -> tuple[Tensor, int | None]:
    """(1|B, Lk) positions of the keys a layer receives, and the first one when they are the default run
    start, start + 1, ... (None otherwise): slot j holds the token of cumulative index j + max(0, seen - Lk)."""
    seen = state.seen
    if isinstance(seen, int):
        first = max(0, seen - lk)
        index = torch.arange(first, first + lk, device=device)
    else:
        first = None
        index = torch.arange(lk, device=device) + (seen - lk).clamp_min(0)
    if state.record is None:
        return index[None], first
    record = state.record
    if isinstance(seen, int) and first + lk > record.shape[-1]:  # unfilled slots of a static cache: masked
        extra = record[..., -1:] + torch.arange(1, first + lk - record.shape[-1] + 1, device=device)
        record = torch.cat((record, extra), dim=-1)
    return record.index_select(-1, index), None


def context(attached, lk: int, device: torch.device) -> Context:
    """The forward's `Context` for layers receiving Lk keys, built once per forward and key length."""
    state = attached.state
    ctx = state.contexts.get(lk)
    if ctx is not None:
        return ctx
    k_ids, k_first = key_positions(state, lk, device)
    q_ids = state.q_ids
    enc = attached.encoding
    if enc.max_length is not None and lk > enc.max_length:
        k_ids, k_first = k_ids.clamp_max(enc.max_length - 1), None  # unfilled static slots beyond the table
    if state.record is None and isinstance(state.seen, int):
        starts = (state.seen - q_ids.shape[-1], k_first)
    else:
        starts = None
    q_pos = q_ids[0] if q_ids.shape[0] == 1 else q_ids
    k_pos = k_ids[0] if k_ids.shape[0] == 1 else k_ids
    if q_pos.dim() != k_pos.dim():
        rows = max(q_ids.shape[0], k_ids.shape[0])
        q_pos, k_pos = q_ids.expand(rows, -1), k_ids.expand(rows, -1)
    segments = k_segments = None
    if enc.head_segments is not None:
        segments = state.segments
        if segments is None:
            segments = torch.zeros(q_ids.shape[0], q_ids.shape[-1], dtype=torch.long, device=device)
        k_segments = segments if lk == segments.shape[-1] else torch.cat(
            (segments.new_zeros(segments.shape[0], lk - segments.shape[-1]), segments), dim=1)
    ctx = enc.context(q_pos, k_pos, segments, k_segments, starts)
    if not torch.compiler.is_compiling():  # a compiled graph cannot hand a context's cache keys back to Python
        state.contexts[lk] = ctx
    return ctx


def layer_terms(attached, layer: int, lk: int, device: torch.device, recompute: bool) -> LayerTerms:
    """Layer `layer`'s terms for Lk keys. Under activation checkpointing (`recompute`) they are built inside
    the checkpointed layer from a context of their own, so the recomputation rebuilds them, reentrant or not,
    and no graph is shared between layers."""
    if attached.state is None or attached.native:
        return EMPTY
    ctx = context(attached, lk, device)
    if recompute:
        return attached.encoding.layer_terms(replace(ctx, _cache={}), layer).for_checkpointing()
    return attached.encoding.layer_terms(ctx, layer)
