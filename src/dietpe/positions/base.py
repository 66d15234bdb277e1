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

The one attention equation (dietpe.attention.equation) is

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

from dietpe.positions.functional import (
    OneHot, consecutive_offsets, relative_gather, relative_offsets, relative_scatter, toeplitz,
)


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


class LazyIndex:
    """`index`: the (1|B, Lq, Lk) bucket of every pair, given as a tensor or as a function building it when
    first read (an (Lq, Lk) int64 index is 512 MiB at 8,192 tokens: built only where a path needs it);
    `onehot`: its `OneHot` from an optional function (None when not offered or too large)."""

    _index: Tensor | Callable[[], Tensor]
    _onehot: Callable[[], OneHot | None] | None = None

    @property
    def onehot(self) -> OneHot | None:
        return self._onehot() if self._onehot else None

    @property
    def index(self) -> Tensor:
        if not isinstance(self._index, Tensor):
            self._index = self._index()
        return self._index


@dataclass(frozen=True)
class Band:
    """Relative offsets of consecutive positions, clipped: pos_i - pos_j = i + delta - j, clipped to
    ±max_distance, bucket = clip + max_distance (Shaw's rows of a^K and a^V)."""

    delta: int
    max_distance: int


# ---------------------------------------------------------------------------------------------------
# logit terms
# ---------------------------------------------------------------------------------------------------
# A term's value at one query-key pair, from indices: (b, h, q_idx, kv_idx) -> bias, as FlexAttention's
# score_mod reads it (each argument a 0-dim integer tensor there; any broadcastable integer tensors here).
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def position_at(pos: Tensor, b: Tensor, idx: Tensor) -> Tensor:
    """The position of token `idx` of example `b`: pos (L,) is shared by the batch, pos (B, L) per example."""
    return pos[idx] if pos.dim() == 1 else pos[b, idx]


def head_at(values: Tensor, h: Tensor):
    """Row h of a per-head table (H, ...), or its one row when the heads share it (1, ...)."""
    return 0 if values.shape[0] == 1 else h


class LogitTerm:
    """A term added to the scaled attention logits.

    `dense(q)` returns (1|B, H|1, Lq, Lk); q is the projected query (B, H, Lq, Dh) before any qk term,
    which only query-dependent terms (Shaw's key term, XLNet) read. `score_mod(q)` gives the same values
    pair by pair from indices and the term's own parameters, so FlexAttention never builds the dense form.
    """

    query_dependent = False
    #: what the term carries, for the analysis's breakdown of the logits: "position" or "segment"
    kind = "position"
    #: whether the dense form, once built, is kept for the other layers of the forward that share the term;
    #: off under activation checkpointing, where every layer must rebuild what it uses when it is recomputed
    reuse = True
    #: leading size of `dense()` when the term does not depend on the query: 1, or B for per-example
    #: positions and segments
    batch = 1
    #: the whole dense form from the method's inference cache (`PositionMethod.kept`), when it keeps one
    product: Callable[[], Tensor] | None = None

    def dense(self, q: Tensor) -> Tensor:
        raise NotImplementedError

    def factors(self) -> tuple[Tensor, Tensor] | None:
        """(fq, fk) with fq (1|B, H|1, Lq, r) and fk (1|B, H|1, Lk, r) such that dense == fq @ fkᵀ, or None."""
        return None

    def dense_block(self, q: Tensor, rows: slice) -> Tensor:
        """dense(q)[..., rows, :] for the queries in `rows` (q is the full query), built for those rows only
        where the term can, so long inputs never hold a whole (H, Lq, Lk) term."""
        return self.dense(q)[..., rows, :]

    def score_mod(self, q: Tensor) -> ScoreMod | None:
        """The term as a function of (b, h, q_idx, kv_idx), or None: a low-rank term is then folded into
        queries and keys by the backend (see `factors`)."""
        return None


class LowRankBias(LogitTerm):
    """fq · fkᵀ: DIET-ABS's P_Q P_Kᵀ, TUPE's positional correlation, DIET's segment table (one-hot keys)."""

    def __init__(self, fq: Tensor, fk: Tensor, product: Callable[[], Tensor] | None = None):
        self.fq, self.fk = fq, fk  # (1|B, H|1, Lq, r), (1|B, H|1, Lk, r)
        self.batch = max(fq.shape[0], fk.shape[0])
        self._dense: Tensor | None = None
        self.product = product

    def dense(self, q: Tensor | None = None) -> Tensor:
        if not self.reuse:
            return self.fq @ self.fk.transpose(-1, -2)
        if self._dense is None:  # a term shared by layers is multiplied out once per forward
            self._dense = self.product() if self.product else self.fq @ self.fk.transpose(-1, -2)
        return self._dense

    def dense_block(self, q: Tensor | None, rows: slice) -> Tensor:
        if self._dense is not None:
            return self._dense[..., rows, :]
        return self.fq[..., rows, :] @ self.fk.transpose(-1, -2)

    def factors(self) -> tuple[Tensor, Tensor]:
        return self.fq, self.fk


class SegmentBias(LowRankBias):
    """DIET eq. 2: Ŝ[h, S(i), S(j)], a k×k table per head read at the two tokens' segments. As a product
    Ŝ[S(i), :] · onehot(S(j))ᵀ it is low rank (folded by sdpa); FlexAttention reads the table directly.
    table: (H|1, k, k); q_segments (B, Lq), k_segments (B, Lk)."""

    kind = "segment"

    def __init__(self, table: Tensor, q_segments: Tensor, k_segments: Tensor):
        fq = table[:, q_segments].transpose(0, 1)  # (B, H|1, Lq, k): row S(i) of Ŝ
        fk = torch.nn.functional.one_hot(k_segments, table.shape[-1]).to(table.dtype).unsqueeze(1)  # (B, 1, Lk, k)
        super().__init__(fq, fk)
        self.table, self.q_segments, self.k_segments = table, q_segments, k_segments

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        table, qs, ks = self.table, self.q_segments, self.k_segments
        return lambda b, h, qi, ki: table[head_at(table, h), qs[b, qi], ks[b, ki]]


class RowsTerm(LogitTerm):
    """A position-only term built row block by row block (`_rows`), so long inputs never hold it whole; its
    dense form is kept for the other layers that share it (unless `reuse` is off)."""

    _dense: Tensor | None = None

    def _rows(self, rows: slice) -> Tensor:
        raise NotImplementedError

    @property
    def heads(self) -> int:
        raise NotImplementedError

    def dense(self, q: Tensor | None = None) -> Tensor:
        if not self.reuse:
            return self._rows(slice(None))
        if self._dense is None:
            self._dense = self.product() if self.product else self._rows(slice(None))
        return self._dense

    def dense_block(self, q: Tensor | None, rows: slice) -> Tensor:
        return self._dense[..., rows, :] if self._dense is not None else self._rows(rows)


class TableBias(LazyIndex, RowsTerm):
    """values[h, bucket(pos_i - pos_j)]: a per-head scalar for each (bucketed) offset. DIET-REL, T5, TUPE-R.

    values: (H|1, M); q_pos, k_pos: (Lq,), (Lk,) or per example (B, Lq), (B, Lk); bucket: offsets -> index
    into M, elementwise (DIET-REL's clip, T5's log buckets); keep: optional elementwise (pos_i, pos_j) -> bool,
    False where the term is zeroed (TUPE's [CLS] reset). The dense form reads `index` (1|B, Lq, Lk), built
    lazily (shared by layers through `index`, a tensor or a function), or, when `diagonals` is given (the
    (Lq + Lk - 1,) index of each offset i - j from -(Lk-1) to Lq-1, for consecutive positions), a Toeplitz
    matrix from a strided view instead of a gather (and its gradient by diagonal sums instead of a
    scatter-add), several times faster on CPU. `score_mod` reads the same values pair by pair.
    """

    def __init__(self, values: Tensor, q_pos: Tensor, k_pos: Tensor, bucket: Callable[[Tensor], Tensor],
                 index: Tensor | Callable[[], Tensor] | None = None,
                 keep: Callable[[Tensor, Tensor], Tensor] | None = None, diagonals: Tensor | None = None):
        self.values, self.q_pos, self.k_pos, self.bucket = values, q_pos, k_pos, bucket
        # an (Lq, Lk) int64 index is 512 MiB at 8,192 tokens: never built when the diagonals serve
        self._index = index if index is not None else (lambda: bucket(relative_offsets(q_pos, k_pos)))
        self.keep, self.diagonals = keep, diagonals
        self.size = (q_pos.shape[-1], k_pos.shape[-1])
        self.batch = q_pos.shape[0] if q_pos.dim() == 2 else 1

    @property
    def heads(self) -> int:
        return self.values.shape[0]

    def _keep(self, rows: slice) -> Tensor | None:
        if self.keep is None:
            return None
        keep = self.keep(self.q_pos[..., rows, None], self.k_pos[..., None, :])  # (1|B, rows, Lk) bool
        return keep if keep.dim() == 2 else keep[:, None]  # (rows, Lk) or (B, 1, rows, Lk)

    def _rows(self, rows: slice) -> Tensor:
        lq, lk = self.size
        if self.diagonals is None and self.batch > 1:
            bias = self.values[:, self.index[:, rows]].transpose(0, 1)  # (B, H, rows, Lk)
        elif self.diagonals is None:
            bias = self.values[:, self.index[rows]].unsqueeze(0)  # (1, H, rows, Lk)
        else:
            start, stop, _ = rows.indices(lq)  # rows i in [start, stop) read diagonals start .. stop-1 + Lk-1
            bias = toeplitz(self.values[:, self.diagonals[start:stop + lk - 1]], stop - start, lk).unsqueeze(0)
        keep = self._keep(rows)
        return bias if keep is None else bias * keep.to(bias.dtype)

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        values, q_pos, k_pos, bucket, keep = self.values, self.q_pos, self.k_pos, self.bucket, self.keep
        diagonals, lk = self.diagonals, self.size[1]

        def mod(b, h, qi, ki):
            if diagonals is not None:  # consecutive positions: a 1-D table along the diagonals
                out = values[head_at(values, h), diagonals[qi - ki + lk - 1]]
            else:
                out = values[head_at(values, h), bucket(position_at(q_pos, b, qi) - position_at(k_pos, b, ki))]
            if keep is not None:
                out = torch.where(keep(position_at(q_pos, b, qi), position_at(k_pos, b, ki)), out, 0.0)
            return out

        return mod


class DistanceBias(RowsTerm):
    """f(|pos_i - pos_j|, params of head h): a per-head function of the distance. ALiBi (Press et al. 2022,
    -m_h · d), KERPLE (Chi et al. 2022, -r1_h · log(1 + r2_h · d)). `f(distance, *params)` is elementwise and
    broadcasts; params: (H,) tensors. q_pos, k_pos as in TableBias; diagonals: optional (Lq + Lk - 1,) offsets
    i - j for consecutive positions: then a Toeplitz matrix of Lq + Lk - 1 values per head, never a gather."""

    def __init__(self, f: Callable[..., Tensor], params: tuple[Tensor, ...], q_pos: Tensor, k_pos: Tensor,
                 diagonals: Tensor | None = None):
        self.f, self.params, self.q_pos, self.k_pos, self.diagonals = f, params, q_pos, k_pos, diagonals
        self.size = (q_pos.shape[-1], k_pos.shape[-1])
        self.batch = q_pos.shape[0] if q_pos.dim() == 2 else 1

    @property
    def heads(self) -> int:
        return self.params[0].shape[0]

    def _rows(self, rows: slice) -> Tensor:
        lq, lk = self.size
        if self.diagonals is not None:
            start, stop, _ = rows.indices(lq)
            dist = self.diagonals[start:stop + lk - 1].abs()  # (rows + Lk - 1,)
            per_diagonal = self.f(dist, *(p[:, None] for p in self.params))  # (H, rows + Lk - 1)
            return toeplitz(per_diagonal, stop - start, lk).unsqueeze(0)  # (1, H, rows, Lk)
        dist = relative_offsets(self.q_pos[..., rows], self.k_pos).abs()  # (1|B, rows, Lk)
        dist = dist.view(-1, 1, *dist.shape[-2:])  # (1|B, 1, rows, Lk)
        return self.f(dist, *(p[:, None, None] for p in self.params))  # (1|B, H, rows, Lk)

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        f, params, q_pos, k_pos = self.f, self.params, self.q_pos, self.k_pos
        return lambda b, h, qi, ki: f((position_at(q_pos, b, qi) - position_at(k_pos, b, ki)).abs(),
                                      *(p[h] for p in params))


class QueryRelativeBias(LazyIndex, LogitTerm):
    """scale · ((q + u) · r_m)[bucket(pos_i - pos_j)]: a query-dependent term over M relative vectors r.

    Shaw et al.'s key term (r = clipped a^K, u = 0) and XLNet's position terms (r = W_R R_{i-j}, u = v).
    r: (M, H|1, Dh); u: (H, Dh) or None; positions and bucket as in TableBias; index: optional (1|B, Lq, Lk)
    bucket of every pair (a tensor or a function, shared by layers); band: set when the buckets are clipped
    offsets of consecutive positions (Shaw), which `dietpe.attention.banded` serves with the fused kernel;
    onehot: optional function giving the index's `OneHot` (or None), which makes the dense form a matmul.
    """

    query_dependent = True

    def __init__(self, r: Tensor, q_pos: Tensor, k_pos: Tensor, bucket: Callable[[Tensor], Tensor], scale: float,
                 u: Tensor | None = None, index: Tensor | Callable[[], Tensor] | None = None,
                 band: Band | None = None, onehot: Callable[[], OneHot | None] | None = None):
        self.r, self.q_pos, self.k_pos, self.bucket, self.scale, self.u = r, q_pos, k_pos, bucket, scale, u
        self._index = index if index is not None else (lambda: bucket(relative_offsets(q_pos, k_pos)))
        self.band, self._onehot = band, onehot

    # scaled before the gather: M columns multiplied instead of Lk (the same products, so the same bits)
    def dense(self, q: Tensor) -> Tensor:
        return relative_gather(self.by_offset(q), self.index, self.onehot)

    def dense_block(self, q: Tensor, rows: slice) -> Tensor:
        return relative_gather(self.by_offset(q[..., rows, :]), self.index[..., rows, :])

    def by_offset(self, q: Tensor) -> Tensor:
        """(B, H, Lq, M): the term's value for each query at each bucket, scaled."""
        return self._by_offset(q) * self.scale

    def _by_offset(self, q: Tensor) -> Tensor:
        """(B, H, Lq, M): each query against each relative vector."""
        if self.u is not None:
            q = q + self.u[:, None, :].to(q.dtype)  # (H, 1, Dh) broadcast over B, Lq
        if self.r.shape[1] == 1:  # shared by the heads (Shaw): one (B·H·Lq, Dh) x (Dh, M) product
            return torch.matmul(q, self.r[:, 0].to(q.dtype).t())
        return torch.einsum("bhqd,mhd->bhqm", q, self.r.to(q.dtype))

    def score_mod(self, q: Tensor) -> ScoreMod:
        # (B, H, Lq, M) per layer: M = Lq + Lk - 1 offsets at most (2k + 1 for Shaw), never (Lq, Lk) pairs
        by_offset, q_pos, k_pos, bucket, scale = self._by_offset(q), self.q_pos, self.k_pos, self.bucket, self.scale
        return lambda b, h, qi, ki: by_offset[b, h, qi, bucket(position_at(q_pos, b, qi) - position_at(k_pos, b, ki))] * scale


# ---------------------------------------------------------------------------------------------------
# qk and value terms
# ---------------------------------------------------------------------------------------------------
class QKTerm(Protocol):
    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]: ...


class ValueTerm(LazyIndex):
    """Σ_j p_ij · a_{index[i, j]}: Shaw et al.'s relative value vectors, a: (M, Dh), shared by heads;
    index (Lq, Lk) or per-example (B, Lq, Lk), a tensor or a function (built when first read); band and
    onehot as in QueryRelativeBias."""

    def __init__(self, a: Tensor, index: Tensor | Callable[[], Tensor], band: Band | None = None,
                 onehot: Callable[[], OneHot | None] | None = None):
        self.a, self._index, self.band, self._onehot = a, index, band, onehot

    def __call__(self, probs: Tensor) -> Tensor:
        per_offset = relative_scatter(probs, self.index, self.a.shape[0], self.onehot)  # (B, H, Lq, M)
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
