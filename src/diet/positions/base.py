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

from diet.positions.functional import consecutive_offsets, relative_gather, relative_scatter, toeplitz


@dataclass
class Context:
    """What the position methods need to build their terms, computed once per forward.

    q_pos, k_pos: (Lq,), (Lk,) integer positions of queries and keys shared by the batch (k_pos covers cached
        keys when decoding), or (B, Lq), (B, Lk) when each example has its own (`position_ids` of shape (B, L):
        packed documents, left padding). Terms built from per-example positions have batch B, else 1.
    q_segments, k_segments: (B, Lq), (B, Lk) segment ids, or None.
    projected_keys: the keys were projected along the length (Linformer); k_pos then indexes the k slots.
    q_start, k_start: set when the model knows, without reading the tensors, that q_pos and k_pos are the runs
        q_start, q_start + 1, ... and k_start, ... (its default positions): the relative terms then take their
        Toeplitz fast path with no data-dependent check, so a compiled forward has no graph break.
    """

    q_pos: Tensor
    k_pos: Tensor
    q_segments: Tensor | None = None
    k_segments: Tensor | None = None
    projected_keys: bool = False
    q_start: int | None = None
    k_start: int | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def diagonal_offsets(self) -> Tensor | None:
        """(Lq + Lk - 1,) offsets pos_i - pos_j along the diagonals of the (Lq, Lk) offsets (see `toeplitz`), or
        None when they are no Toeplitz matrix (positions with gaps, per example, or unknown while compiling)."""
        if self.q_start is not None and self.k_start is not None:
            lq, lk = self.q_pos.shape[-1], self.k_pos.shape[-1]
            first = self.q_start - (self.k_start + lk - 1)
            return torch.arange(first, first + lq + lk - 1, device=self.q_pos.device)
        if torch.compiler.is_compiling():
            return None  # reading the positions would break the graph: the general path serves any positions
        return consecutive_offsets(self.q_pos, self.k_pos)

    @property
    def batch(self) -> int:
        """Leading size of position-only terms: B for per-example positions, else 1."""
        return self.q_pos.shape[0] if self.q_pos.dim() == 2 else 1

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
    #: whether the dense form, once built, is kept for the other layers of the forward that share the term;
    #: off under activation checkpointing, where every layer must rebuild what it uses when it is recomputed
    reuse = True
    #: leading size of `dense()` when the term does not depend on the query: 1, or B for per-example
    #: positions and segments
    batch = 1

    def dense(self, q: Tensor) -> Tensor:
        raise NotImplementedError

    def factors(self) -> tuple[Tensor, Tensor] | None:
        """(fq, fk) with fq (1|B, H|1, Lq, r) and fk (1|B, H|1, Lk, r) such that dense == fq @ fkᵀ, or None."""
        return None

    def dense_block(self, q: Tensor, rows: slice) -> Tensor:
        """dense(q)[..., rows, :] for the queries in `rows` (q is the full query), built for those rows only
        where the term can, so long inputs never hold a whole (H, Lq, Lk) term."""
        return self.dense(q)[..., rows, :]


class LowRankBias(LogitTerm):
    """fq · fkᵀ: DIET-ABS's P_Q P_Kᵀ, TUPE's positional correlation, DIET's segment table (one-hot keys)."""

    def __init__(self, fq: Tensor, fk: Tensor):
        self.fq, self.fk = fq, fk  # (1|B, H|1, Lq, r), (1|B, H|1, Lk, r)
        self.batch = max(fq.shape[0], fk.shape[0])
        self._dense: Tensor | None = None

    def dense(self, q: Tensor | None = None) -> Tensor:
        if not self.reuse:
            return self.fq @ self.fk.transpose(-1, -2)
        if self._dense is None:  # a term shared by layers is multiplied out once per forward
            self._dense = self.fq @ self.fk.transpose(-1, -2)
        return self._dense

    def dense_block(self, q: Tensor | None, rows: slice) -> Tensor:
        if self._dense is not None:
            return self._dense[..., rows, :]
        return self.fq[..., rows, :] @ self.fk.transpose(-1, -2)

    def factors(self) -> tuple[Tensor, Tensor]:
        return self.fq, self.fk


class TableBias(LogitTerm):
    """values[h, index[i, j]]: a per-head scalar for each (bucketed) offset. DIET-REL, T5, TUPE-R.

    values: (H|1, M); index: (Lq, Lk) into M, shared by every layer, or (B, Lq, Lk) for per-example positions;
    keep: optional 0/1 mask of the index's shape (TUPE's [CLS] reset zeroes the rows and columns it replaces).
    diagonals: optional (Lq + Lk - 1,) index into
    M of each offset i - j from -(Lk-1) to Lq-1, given when index[i, j] = diagonals[i - j + Lk - 1]
    (consecutive positions): the term is then a Toeplitz matrix, built from a strided view instead of a
    gather (and its gradient by diagonal sums instead of a scatter-add), several times faster on CPU.
    """

    def __init__(self, values: Tensor, index: Tensor | Callable[[], Tensor], keep: Tensor | None = None,
                 diagonals: Tensor | None = None, size: tuple[int, int] | None = None, batch: int = 1):
        # index may be a function building it, with size=(Lq, Lk) and batch: with diagonals it is then never
        # built, which matters at long lengths (an (Lq, Lk) int64 index is 512 MiB at 8,192 tokens)
        if not isinstance(index, Tensor) and size is None:
            raise ValueError("TableBias needs size=(Lq, Lk) when index is a function")
        self.values, self._index, self.keep, self.diagonals = values, index, keep, diagonals
        self.size = tuple(index.shape[-2:]) if isinstance(index, Tensor) else size
        # per-example positions: index (B, Lq, Lk) and no diagonals; a lazy index says its batch
        self.batch = index.shape[0] if isinstance(index, Tensor) and index.dim() == 3 else batch
        self._dense: Tensor | None = None

    @property
    def index(self) -> Tensor:
        if not isinstance(self._index, Tensor):
            self._index = self._index()
        return self._index

    def _rows(self, rows: slice) -> Tensor:
        lq, lk = self.size
        if self.diagonals is None and self.index.dim() == 3:
            bias = self.values[:, self.index[:, rows]].transpose(0, 1)  # (B, H, rows, Lk)
            if self.keep is not None:
                bias = bias * self.keep[:, None, rows]
            return bias
        if self.diagonals is None:
            bias = self.values[:, self.index[rows]]  # (H, rows, Lk)
        else:
            start, stop, _ = rows.indices(lq)  # rows i in [start, stop) read diagonals start .. stop-1 + Lk-1
            bias = toeplitz(self.values[:, self.diagonals[start:stop + lk - 1]], stop - start, lk)
        if self.keep is not None:
            bias = bias * self.keep[rows]
        return bias.unsqueeze(0)  # (1, H, rows, Lk)

    def dense(self, q: Tensor | None = None) -> Tensor:
        if not self.reuse:
            return self._rows(slice(None))
        if self._dense is None:
            self._dense = self._rows(slice(None))
        return self._dense

    def dense_block(self, q: Tensor | None, rows: slice) -> Tensor:
        return self._dense[..., rows, :] if self._dense is not None else self._rows(rows)


class DenseBias(LogitTerm):
    """A bias given in full: (1|B, H|1, Lq, Lk). ALiBi."""

    def __init__(self, bias: Tensor):
        self.bias = bias
        self.batch = bias.shape[0]

    def dense(self, q: Tensor | None = None) -> Tensor:
        return self.bias


class QueryRelativeBias(LogitTerm):
    """scale · ((q + u) · r_m)[index]: a query-dependent term over M relative vectors r.

    Shaw et al.'s key term (r = clipped a^K, u = 0) and XLNet's position terms (r = W_R R_{i-j}, u = v).
    r: (M, H|1, Dh); u: (H, Dh) or None; index: (Lq, Lk) or per-example (B, Lq, Lk) into M.
    """

    query_dependent = True

    def __init__(self, r: Tensor, index: Tensor, scale: float, u: Tensor | None = None):
        self.r, self.index, self.scale, self.u = r, index, scale, u

    def dense(self, q: Tensor) -> Tensor:
        return self._rows(q, self.index)

    def dense_block(self, q: Tensor, rows: slice) -> Tensor:
        return self._rows(q[..., rows, :], self.index[..., rows, :])

    def _rows(self, q: Tensor, index: Tensor) -> Tensor:
        if self.u is not None:
            q = q + self.u[:, None, :].to(q.dtype)  # (H, 1, Dh) broadcast over B, Lq
        by_offset = torch.einsum("bhqd,mhd->bhqm", q, self.r.expand(-1, q.shape[1], -1).to(q.dtype))
        return relative_gather(by_offset, index) * self.scale


# ---------------------------------------------------------------------------------------------------
# qk and value terms
# ---------------------------------------------------------------------------------------------------
class QKTerm(Protocol):
    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]: ...


class ValueTerm:
    """Σ_j p_ij · a_{index[i, j]}: Shaw et al.'s relative value vectors, a: (M, Dh), shared by heads;
    index (Lq, Lk) or per-example (B, Lq, Lk)."""

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
    # what a backend derives from these terms, kept for the forward: when every layer gets the same
    # LayerTerms (TUPE), their summed dense bias is built once, not once per layer
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def merge(self, other: "LayerTerms") -> "LayerTerms":
        return LayerTerms(self.qk + other.qk, self.logits + other.logits, self.values + other.values,
                          self.score_scale * other.score_scale)

    def for_checkpointing(self) -> "LayerTerms":
        """The same terms, built afresh by each layer that uses them: a checkpointed layer is recomputed in
        the backward pass and must redo (and save) exactly what it did the first time, not find it cached."""
        for term in self.logits:
            term.reuse = False
        return LayerTerms(self.qk, self.logits, self.values, self.score_scale)


EMPTY = LayerTerms()
