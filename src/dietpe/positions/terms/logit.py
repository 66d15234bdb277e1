"""The logit-term contract: what every term added to the attention logits provides, and what it may offer.

Shapes (notation of `dietpe.positions.terms`): q (B, H, Lq, Dh) is the projected query before any qk term;
a term's dense form is (1|B, H|1, Lq, Lk), 1 where it is shared by the batch or the heads.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from dietpe.positions.context import Runs


def row_span(rows: tuple[int, int] | None, length: int) -> tuple[int, int]:
    """(start, stop) of `rows` among `length` query rows. Rows are (start, stop) ints or None (every row),
    never a slice object, which torch.compile cannot wrap as a constant on every torch version we support."""
    return (0, length) if rows is None else rows


class ScoreMod(NamedTuple):
    """A term's value at one query-key pair, from indices, as FlexAttention's score_mod reads it:
    fn(b, h, q_idx, kv_idx, *args) -> bias (each index a 0-dim integer tensor there; any broadcastable integer
    tensors here). `fn` is a module-level function, the same object for every layer and model of a kind, and
    `args` the tensors it reads (and module-level functions): compiled flex then traces one kernel per kind
    and takes the tensors as inputs, instead of a new closure, and a recompile, per forward. A tensor that
    requires grad is indexed once in `fn` (flex's backward allows no more)."""

    fn: Callable[..., Tensor]
    args: tuple

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return self.fn(b, h, q_idx, kv_idx, *self.args)


def position_at(pos: Tensor, b: Tensor, idx: Tensor) -> Tensor:
    """The position of token `idx` of example `b`: pos (L,) is shared by the batch, pos (B, L) per example."""
    return pos[idx] if pos.dim() == 1 else pos[b, idx]


def head_at(values: Tensor, h: Tensor):
    """Row h of a per-head table (H, ...), or its one row when the heads share it (1, ...)."""
    return 0 if values.shape[0] == 1 else h


@dataclass(frozen=True)
class OffsetTable:
    """A position-only term over consecutive positions as one value per head and offset, which a fused kernel
    reads inside its tile: term[h, i, j] = values[h, i - j + Lk - 1] · q_keep[i] · k_keep[j].

    values (H|1, Lq + Lk - 1), differentiable in the method's parameters; q_keep (Lq,), k_keep (Lk,), or per
    example (B, Lq), (B, Lk), 0/1 float (TUPE's reset of [CLS]'s row and column), or None: the table applies
    everywhere. runs: None, or the per-example positions' `Runs` the diagonals were read along: the table is
    then exact on the pairs whose runs agree only, and a backend serves it where the mask opens no other."""

    values: Tensor
    q_keep: Tensor | None = None
    k_keep: Tensor | None = None
    runs: Runs | None = None


@dataclass(frozen=True)
class PiecewiseTable:
    """A position-only term over consecutive positions as a piecewise-linear function per head of a ratio of a
    per-offset and a per-query value, which a fused kernel evaluates inside its tile (FIRE's f_θ(ψ(i - j) /
    ψ(max(L, i))), a ReLU layer of a scalar, as its linear pieces):

        term[h, i, j] = slope[p, h] · x + intercept[p, h],  x = numerator[i - j + Lk - 1] / den[i],
        p = the number of kinks below x.

    numerator (Lq + Lk - 1,), den (Lq,) or per example (B, Lq), slope and intercept (W + 1, H), differentiable in
    the method's parameters; kinks (W,) sorted (+inf for a piece that never begins), no gradient: a.e. the
    pieces do not move. runs: as `OffsetTable`'s. derived: what a backend makes of the table, kept with it for
    the layers of the forward that share it (the fused kernel's packed pieces)."""

    numerator: Tensor
    den: Tensor
    kinks: Tensor
    slope: Tensor
    intercept: Tensor
    runs: Runs | None = None
    derived: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class SegmentTable:
    """term[b, h, i, j] = table[h, q_ids[b, i], k_ids[b, j]]: table (H|1, K, K), ids (B, Lq) and (B, Lk)."""

    table: Tensor
    q_ids: Tensor
    k_ids: Tensor


@dataclass(frozen=True)
class Band:
    """Relative offsets of consecutive positions, clipped: pos_i - pos_j = i + delta - j, clipped to
    ±max_distance, bucket = clip + max_distance (Shaw's rows of a^K and a^V)."""

    delta: int
    max_distance: int


class LogitTerm(abc.ABC):
    """A term added to the scaled attention logits.

    Every term provides:
        size: (Lq, Lk)
        batch, heads: the leading sizes 1|B and H|1 of its dense form; None for a query-dependent term,
            whose dense form has the query's B and H
        kind: "position" or "segment" (the analysis's breakdown of the logits)
        query_dependent: whether the term reads q (Shaw's key term, XLNet); False: position-only
        reuse: whether the dense form, once built, is kept for the other layers of the forward that share
            the term; off under activation checkpointing, where a recomputed layer must rebuild what it used
        kept: None, or a function returning the whole dense form from the method's inference cache
            (`PositionMethod.keep`)
        build(q, rows) -> (1|B, H|1, len(rows), Lk): the term for the queries in `rows` ((start, stop), or
            None for all), built for those rows only where the term can (the one member a subclass must
            write); q may be None when not query_dependent
        dense(q, rows=None) -> (1|B, H|1, len(rows), Lk): what backends call. The whole term is built once
            per forward while `reuse` is on (from `kept` when given); a block of rows is sliced from it once
            built, else built for those rows alone, so long inputs never hold a whole (H, Lq, Lk) term

    Optional capabilities, each answering "not available" by default, which a backend asks for:
        factors() -> (fq (1|B, H|1, Lq, r), fk (1|B, H|1, Lk, r)) | None: dense == fq @ fkᵀ, so sdpa and
            flex may fold the term into extra query and key channels
        score_mod(q) -> ScoreMod | None: the term pair by pair from (b, h, q_idx, kv_idx), for FlexAttention
            (a module-level function and the tensors it reads)
        band: Band | None: Shaw's key term over consecutive positions, dense == by_offset(q) read at the
            clipped offset, which `dietpe.attention.banded` serves with the fused kernel
        offset_table() -> OffsetTable | None: the term as one value per head and offset i - j (consecutive
            positions), which the fused kernel reads in its tile (`dietpe.attention.kernels.attention`)
        segment_table() -> SegmentTable | None: the term as a per-head table read at two tokens' ids
        piecewise_table() -> PiecewiseTable | None: the term as a piecewise-linear function per head of
            numerator[i - j] / den[i] (consecutive positions), which the fused kernel evaluates in its tile
        parts() -> list[LogitTerm] | None: terms whose sum is this one, each of a form above, which the fused
            kernel reads more cheaply than the whole (TUPE's correlation: a product and its reset's table)
    """

    #: "position" or "segment"
    kind = "position"
    query_dependent = False
    band: Band | None = None

    def __init__(self, size: tuple[int, int], batch: int | None = 1, heads: int | None = 1):
        self.size, self.batch, self.heads = size, batch, heads
        self.reuse = True
        self.kept: Callable[[], Tensor] | None = None
        self._dense: Tensor | None = None
        self._per_forward: dict[str, object] = {}

    @abc.abstractmethod
    def build(self, q: Tensor | None, rows: tuple[int, int] | None) -> Tensor:
        """(1|B, H|1, len(rows), Lk): the term for the queries in `rows` (q is the full query)."""

    def dense(self, q: Tensor | None = None, rows: tuple[int, int] | None = None) -> Tensor:
        """(1|B, H|1, len(rows), Lk): the term, built once per forward for the layers that share it."""
        if rows is not None:
            return self._dense[..., rows[0]:rows[1], :] if self._dense is not None else self.build(q, rows)
        if self.query_dependent or not self.reuse:
            return self.build(q, None)
        if self._dense is None:
            self._dense = self.kept() if self.kept is not None else self.build(q, None)
        return self._dense

    def factors(self) -> tuple[Tensor, Tensor] | None:
        """(fq, fk) with dense == fq @ fkᵀ, or None: not low rank."""
        return None

    def has_factors(self) -> bool:
        """Whether `factors` gives the term's factors (asked without building them)."""
        return self.factors() is not None

    def folded(self, s: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(fq / s, fk) in `dtype`: the factors as the fused kernel reads them, as the head's second part (its
        scores are scaled by s after the product), built once per forward."""
        fq, fk = self.factors()
        return self.per_forward(f"folded {s} {dtype}", lambda: ((fq / s).to(dtype), fk.to(dtype)))

    def score_mod(self, q: Tensor | None) -> ScoreMod | None:
        """The term as a function of (b, h, q_idx, kv_idx), or None: a low-rank term is then folded into
        queries and keys by the backend (see `factors`)."""
        return None

    def by_offset(self, q: Tensor) -> Tensor:
        """(B, H, Lq, M): the term of each query at each of the M clipped offsets; only where `band` is set."""
        raise NotImplementedError(f"{type(self).__name__} has no band")

    def offset_table(self) -> OffsetTable | None:
        """The term as an `OffsetTable`, or None: it is no function of i - j alone (or the positions are no runs)."""
        return None

    def segment_table(self) -> SegmentTable | None:
        """The term as a `SegmentTable`, or None."""
        return None

    def piecewise_table(self) -> PiecewiseTable | None:
        """The term as a `PiecewiseTable`, or None."""
        return None

    def parts(self) -> list["LogitTerm"] | None:
        """Terms whose sum is this one, for the fused kernel, or None: read it whole."""
        return None

    def renew(self, keep: tuple[str, ...] = ()) -> None:
        """A new forward for a term kept between inference forwards (`PositionMethod.kept_forward`): what was
        built from its values goes (the dense form, the forward's entries but `keep`, which the caller knows
        hold only views of the values or functions of the positions and constants)."""
        kept = {name: self._per_forward[name] for name in keep if name in self._per_forward}
        self._dense, self._per_forward, self.reuse = None, kept, True

    def per_forward(self, name: str, build: Callable[[], object]):
        """build(), kept on the term for the layers of the forward that share it while `reuse` is on."""
        if not self.reuse:
            return build()
        store = self._per_forward  # a plain attribute: torch 2.11's dynamo cannot trace __dict__.setdefault
        if name not in store:
            store[name] = build()
        return store[name]
