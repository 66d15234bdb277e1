"""Attention masks as the models take them, turned once per forward into the additive mask the backends add to
the logits (`dietpe.attention.backends`: scores + mask).

    (B, Lk)               1 / True = attend to key j (padding)                     -> (B, 1, 1, Lk), as before
    (B|1, 1|H, Lq, Lk)    bool (True = attend), integer (1 = attend, 0 = not), or    -> (B|1, 1|H, Lq, Lk)
                          additive float as Hugging Face builds it (0 = attend, a large negative value =
                          blocked: finfo.min, -inf, or -1e4 as older models use)

A 4-D mask keeps packed documents apart: block-diagonal, True within a document (`document_mask`). Every
backend reads the same additive form (0 or finfo.min), so FlexAttention's mask_mod (`== 0`) and the banded
Shaw path see exactly what the reference adds. Lq is the number of new queries and Lk every key, cached ones
included, as in Hugging Face's cached decoding. A 4-D mask with a query that sees no key is refused: its
softmax would average every key (or give NaN); give padding tokens a document of their own.

Causality alone (L new tokens, nothing cached, no padding) is a `CausalMask`, not a tensor: the sdpa backend
then calls SDPA with `is_causal=True` and no mask, which lets a GPU take flash attention's causal mode; every
other reader (a bias to add it to, the eager reference, flex, Shaw's banded paths) takes `dense_mask(mask)`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dietpe.errors import InputError, may_read

#: an additive float mask blocks a key with a value at or below this (HF: finfo.min or -inf; older models -1e4)
BLOCKED_AT_MOST = -1e4


def is_4d(attention_mask) -> bool:
    return isinstance(attention_mask, Tensor) and attention_mask.dim() == 4


def keep_of(mask: Tensor) -> Tensor:
    """A 4-D mask in any accepted dtype as booleans, True = attend (values not checked)."""
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype.is_floating_point:
        return mask == 0
    return mask != 0


def check_4d(mask: Tensor, batch: int, heads: int, lq: int, lk: int, name: str = "attention_mask") -> Tensor:
    """Refuse a malformed 4-D mask in one line; returns it as booleans (B|1, 1|H, Lq, Lk), True = attend."""
    shape = tuple(mask.shape)
    if shape[0] not in (1, batch) or shape[1] not in (1, heads) or shape[2:] != (lq, lk):
        raise InputError(f"{name} has shape {shape}, but a 4-D mask must be (batch|1, 1|heads, queries, keys) = "
                         f"({batch}|1, 1|{heads}, {lq}, {lk})")
    if mask.is_complex():
        raise InputError(f"{name} has dtype {mask.dtype}; give booleans (True = attend), integers (1 = attend) "
                         f"or an additive float mask (0 = attend, large negative = blocked)")
    if not may_read(mask):
        return keep_of(mask)  # the checks of values read the data (a graph break, a host sync on a GPU)
    if mask.dtype.is_floating_point:
        bad = ~((mask == 0) | (mask <= BLOCKED_AT_MOST))  # NaN, positive, or small negative values
        if bool(bad.any()):
            value = mask[bad][0].item()
            raise InputError(f"{name} is an additive float mask (0 = attend, <= {BLOCKED_AT_MOST:g} = blocked) but "
                             f"holds {value}; for a 0/1 mask give booleans (True = attend) or integers")
    elif mask.dtype != torch.bool:
        bad = (mask != 0) & (mask != 1)
        if bool(bad.any()):
            raise InputError(f"{name} is an integer mask (1 = attend, 0 = not) but holds {mask[bad][0].item()}")
    return keep_of(mask)


def refuse_empty_rows(keep: Tensor, name: str = "attention_mask") -> None:
    """A query that sees no key (after causality is applied) has no softmax: refused, naming the first one."""
    if not may_read(keep):
        return
    empty = ~keep.any(-1)  # (B|1, 1|H, Lq)
    if bool(empty.any()):
        b, h, i = (int(x) for x in empty.nonzero()[0])
        raise InputError(f"{name} lets query {i} (batch row {b}{f', head {h}' if keep.shape[1] > 1 else ''}) "
                         f"attend to no key; every query needs at least one (give padding a document of its own)")


def additive(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """Booleans (True = attend) as the additive mask the backends read: 0 or finfo(dtype).min."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, torch.finfo(dtype).min)


class CausalMask:
    """Query i sees keys j <= i, for `length` queries and as many keys (SDPA's `is_causal`, whose diagonal starts
    at the first key: so never with cached keys). `dense()` is the additive (1, 1, L, L) mask, built once."""

    def __init__(self, length: int, dtype: torch.dtype, device: torch.device):
        self.length, self.dtype, self.device = length, dtype, device
        self._dense: Tensor | None = None

    def dense(self) -> Tensor:
        if self._dense is None:  # one tensor for every layer: flex's block-mask cache goes by its identity
            keep = torch.ones(self.length, self.length, dtype=torch.bool, device=self.device).tril()
            self._dense = additive(keep[None, None], self.dtype)  # (1, 1, L, L)
        return self._dense


def attention_dtype(x: Tensor) -> torch.dtype:
    """The dtype of the scores the backends add a mask to, for hidden states `x`: autocast's where it is on for
    x's device (q and k come out of a Linear in it), else x's. A mask built in it once per forward is not cast
    again by every layer."""
    kind = x.device.type
    # `meta` has no autocast (nor may a custom device); dynamo before torch 2.13 cannot trace the question
    if kind == "meta" or not (torch.compiler.is_compiling() or torch.amp.is_autocast_available(kind)):
        return x.dtype
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def dense_mask(mask: "Tensor | CausalMask | None") -> Tensor | None:
    """The additive mask as a tensor (a `CausalMask` built out), or None."""
    return mask.dense() if isinstance(mask, CausalMask) else mask


def document_mask(doc_ids: Tensor) -> Tensor:
    """Block-diagonal attention for packed documents: doc_ids (B, L) (or (L,)) of any integers, one per
    document -> (B, 1, L, L) booleans, True where query and key belong to the same document. Give padding an
    id of its own (e.g. -1): padded tokens then see each other only, and no document sees them."""
    if doc_ids.dim() == 1:
        doc_ids = doc_ids[None]
    if doc_ids.dim() != 2 or doc_ids.dtype.is_floating_point:
        raise InputError(f"doc_ids must be integers (batch, length), got shape {tuple(doc_ids.shape)} "
                         f"{doc_ids.dtype}")
    return (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]  # (B, 1, L, L)


def documents_from_positions(position_ids: Tensor) -> Tensor:
    """Document ids (B, L) from position_ids (B, L) or (L,) that restart at 0 with each packed document: a new
    document starts wherever the position is 0 (a row's first token always starts one)."""
    if position_ids.dim() == 1:
        position_ids = position_ids[None]
    starts = position_ids == 0
    starts[:, 0] = True
    return starts.long().cumsum(-1)


def position_document_mask(position_ids: Tensor) -> Tensor:
    """`document_mask` of the documents that position_ids restarting at 0 mark: (B, 1, L, L) booleans."""
    return document_mask(documents_from_positions(position_ids))
