"""The four places where position (and segment) information can enter a Transformer.

DIET (Chen et al. 2021) and TUPE (Ke et al. 2021) argue that *where* position enters matters more than
whether it is absolute or relative. diet makes each place a small typed interface, and an encoding is a set
of contributions to them, never a branch inside attention:

    input       InputTerm:  (1|B, L, D) added to the token embeddings         (BERT, sinusoids, token types)
    qk          QKTerm:     (q, k) -> (q', k') before the dot product          (rotary, XLNet's u)
    logit bias  LogitTerm:  (1|B, H|1, Lq, Lk) added to the scaled logits      (T5, DIET, TUPE, ALiBi, Shaw's key
                            term, segments); low-rank ones also expose factors so a backend may fold them into
                            queries and keys
    values      ValueTerm:  probs (B, H, Lq, Lk) -> (B, H, Lq, Dh) added to the attention output  (Shaw's value)

The one attention equation (diet.attention.equation) is

    scores = (q'·k'ᵀ) · scale · score_scale + Σ logit terms + mask
    out    = softmax(scores) · v + Σ value terms(softmax(scores))

Notation used everywhere: B batch, H heads, Lq / Lk query / key length, D hidden size, Dh head size,
r rank of a low-rank term, M number of distinct relative offsets or buckets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from torch import Tensor

from diet.positions.functional import relative_gather, relative_scatter


@dataclass
class Context:
    """What the position methods need to build their terms, computed once per forward.

    q_pos, k_pos: (Lq,), (Lk,) integer positions of queries and keys (k_pos covers cached keys when decoding).
    q_segments, k_segments: (B, Lq), (B, Lk) segment ids, or None.
    projected_keys: the keys were projected along the length (Linformer); k_pos then indexes the k slots.
    """

    q_pos: Tensor
    k_pos: Tensor
    q_segments: Tensor | None = None
    k_segments: Tensor | None = None
    projected_keys: bool = False
    _cache: dict = field(default_factory=dict, repr=False)

    def cached(self, key: str, fn: Callable[[], Tensor]) -> Tensor:
        """Compute a position-only tensor once per forward and share it between layers and methods."""
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]


# ---------------------------------------------------------------------------------------------------
# logit terms
# ---------------------------------------------------------------------------------------------------
class LogitTerm:
    """A term added to the scaled attention logits.

    `dense(q)` returns (1|B, H|1, Lq, Lk); q is the projected query (B, H, Lq, Dh) before any qk term,
    which only query-dependent terms (Shaw's key term, XLNet) read.
    """

    query_dependent = False

    def dense(self, q: Tensor) -> Tensor:
        raise NotImplementedError

    def factors(self) -> tuple[Tensor, Tensor] | None:
        """(fq, fk) with fq (1|B, H|1, Lq, r) and fk (1|B, H|1, Lk, r) such that dense == fq @ fkᵀ, or None."""
        return None


class LowRankBias(LogitTerm):
    """fq · fkᵀ: DIET-ABS's P_Q P_Kᵀ, TUPE's positional correlation, DIET's segment table (one-hot keys)."""

    def __init__(self, fq: Tensor, fk: Tensor):
        self.fq, self.fk = fq, fk  # (1|B, H|1, Lq, r), (1|B, H|1, Lk, r)
        self._dense: Tensor | None = None

    def dense(self, q: Tensor | None = None) -> Tensor:
        if self._dense is None:  # a term shared by layers is multiplied out once per forward
            self._dense = self.fq @ self.fk.transpose(-1, -2)
        return self._dense

    def factors(self) -> tuple[Tensor, Tensor]:
        return self.fq, self.fk


class TableBias(LogitTerm):
    """values[h, index[i, j]]: a per-head scalar for each (bucketed) offset. DIET-REL, T5, TUPE-R.

    values: (H|1, M); index: (Lq, Lk) into M, shared by every layer; keep: optional (Lq, Lk) 0/1 mask
    (TUPE's [CLS] reset zeroes the rows and columns it replaces).
    """

    def __init__(self, values: Tensor, index: Tensor, keep: Tensor | None = None):
        self.values, self.index, self.keep = values, index, keep
        self._dense: Tensor | None = None

    def dense(self, q: Tensor | None = None) -> Tensor:
        if self._dense is None:
            bias = self.values[:, self.index]  # (H, Lq, Lk)
            if self.keep is not None:
                bias = bias * self.keep
            self._dense = bias.unsqueeze(0)  # (1, H, Lq, Lk)
        return self._dense


class DenseBias(LogitTerm):
    """A bias given in full: (1|B, H|1, Lq, Lk). ALiBi."""

    def __init__(self, bias: Tensor):
        self.bias = bias

    def dense(self, q: Tensor | None = None) -> Tensor:
        return self.bias


class QueryRelativeBias(LogitTerm):
    """scale · ((q + u) · r_m)[index]: a query-dependent term over M relative vectors r.

    Shaw et al.'s key term (r = clipped a^K, u = 0) and XLNet's position terms (r = W_R R_{i-j}, u = v).
    r: (M, H|1, Dh); u: (H, Dh) or None; index: (Lq, Lk) into M.
    """

    query_dependent = True

    def __init__(self, r: Tensor, index: Tensor, scale: float, u: Tensor | None = None):
        self.r, self.index, self.scale, self.u = r, index, scale, u

    def dense(self, q: Tensor) -> Tensor:
        if self.u is not None:
            q = q + self.u[:, None, :].to(q.dtype)  # (H, 1, Dh) broadcast over B, Lq
        by_offset = torch.einsum("bhqd,mhd->bhqm", q, self.r.expand(-1, q.shape[1], -1).to(q.dtype))
        return relative_gather(by_offset, self.index) * self.scale


# ---------------------------------------------------------------------------------------------------
# qk and value terms
# ---------------------------------------------------------------------------------------------------
class QKTerm(Protocol):
    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]: ...


class ValueTerm:
    """Σ_j p_ij · a_{index[i, j]}: Shaw et al.'s relative value vectors, a: (M, Dh), shared by heads."""

    def __init__(self, a: Tensor, index: Tensor):
        self.a, self.index = a, index

    def __call__(self, probs: Tensor) -> Tensor:
        per_offset = relative_scatter(probs, self.index, self.a.shape[0])  # (B, H, Lq, M)
        return per_offset @ self.a.to(probs.dtype)  # (B, H, Lq, Dh)


@dataclass
class LayerTerms:
    """Everything position and segments contribute to one attention layer."""

    qk: list[QKTerm] = field(default_factory=list)
    logits: list[LogitTerm] = field(default_factory=list)
    values: list[ValueTerm] = field(default_factory=list)
    score_scale: float = 1.0  # TUPE's 1/√(2d) is the usual 1/√d times this

    def merge(self, other: "LayerTerms") -> "LayerTerms":
        return LayerTerms(self.qk + other.qk, self.logits + other.logits, self.values + other.values,
                          self.score_scale * other.score_scale)


EMPTY = LayerTerms()
