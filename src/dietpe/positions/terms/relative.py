"""Relative logit terms over bucketed offsets pos_i - pos_j: a per-head scalar per bucket (`TableBias`: DIET-REL,
T5, TUPE-R) and the query against a relative vector per bucket (`QueryRelativeBias`: Shaw's key term, XLNet),
with the lazily built bucket index they share with Shaw's value term."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from dietpe.positions.context import Runs
from dietpe.positions.functional import OneHot, relative_gather, relative_offsets, toeplitz
from dietpe.positions.terms.logit import Band, LogitTerm, OffsetTable, ScoreMod, head_at, position_at, row_span
from dietpe.positions.terms.position import PositionBias


def _clipped(b: Tensor, qi: Tensor, ki: Tensor, q_pos: Tensor, k_pos: Tensor, first: Tensor, last: Tensor) -> Tensor:
    """pos_i - pos_j clipped to [first, last], minus first: the column of a per-offset table."""
    offset = position_at(q_pos, b, qi) - position_at(k_pos, b, ki)
    return torch.minimum(torch.maximum(offset, first), last) - first


def offset_table_pair(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor, table: Tensor, q_pos: Tensor, k_pos: Tensor,
                      first: Tensor, last: Tensor, keep: Callable[[Tensor, Tensor], Tensor] | None) -> Tensor:
    """score_mod: table[h, clip(pos_i - pos_j) - first] of a per-head table (H|1, last - first + 1) over the
    offsets first..last, zero where keep(pos_i, pos_j) is False (keep: a module-level function, or None)."""
    out = table[head_at(table, h), _clipped(b, qi, ki, q_pos, k_pos, first, last)]
    if keep is not None:
        out = torch.where(keep(position_at(q_pos, b, qi), position_at(k_pos, b, ki)), out, 0.0)
    return out


def query_offset_pair(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor, by_offset: Tensor, q_pos: Tensor,
                      k_pos: Tensor, first: Tensor, last: Tensor) -> Tensor:
    """score_mod: by_offset[b, h, qi, clip(pos_i - pos_j) - first] of (B, H, Lq, last - first + 1)."""
    return by_offset[b, h, qi, _clipped(b, qi, ki, q_pos, k_pos, first, last)]


def offset_bounds(pos: Tensor, first: int | Tensor, last: int | Tensor) -> tuple[Tensor, Tensor]:
    """first and last as 0-dim integer tensors on pos's device: a score_mod reads them as inputs, so a new
    range is a new value, never a new kernel."""
    return tuple(x.reshape(()) if isinstance(x, Tensor) else pos.new_full((), x) for x in (first, last))


class LazyIndex:
    """`index`: the (1|B, Lq, Lk) bucket of every pair, given as a tensor or as a function building it when
    first read (an (Lq, Lk) int64 index is 512 MiB at 8,192 tokens: built only where a path needs it);
    `onehot`: its `OneHot` from an optional function (None when not offered or too large)."""

    _index: Tensor | Callable[[], Tensor]
    _onehot: Callable[[], OneHot | None] | None = None

    @property
    def onehot(self) -> OneHot | None:
        return self._onehot() if self._onehot is not None else None

    @property
    def index(self) -> Tensor:
        if not isinstance(self._index, Tensor):
            self._index = self._index()
        return self._index


class SeparableKeep:
    """keep(pos_i, pos_j) = query(pos_i) & key(pos_j), elementwise: a keep of a query part and a key part
    (TUPE's reset: neither position is [CLS]'s), which a fused kernel reads as two vectors."""

    def __init__(self, query: Callable[[Tensor], Tensor], key: Callable[[Tensor], Tensor]):
        self.query, self.key = query, key

    def __call__(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.query(q_pos) & self.key(k_pos)


class TableBias(LazyIndex, PositionBias):
    """values[h, bucket(pos_i - pos_j)]: a per-head scalar for each (bucketed) offset. DIET-REL, T5, TUPE-R.

    values: (H|1, M); q_pos, k_pos: (Lq,), (Lk,) or per example (B, Lq), (B, Lk); bucket: offsets -> index
    into M, elementwise (DIET-REL's clip, T5's log buckets); keep: optional elementwise (pos_i, pos_j) -> bool,
    False where the term is zeroed (TUPE's [CLS] reset). The dense form reads `index` (1|B, Lq, Lk), built
    lazily (shared by layers through `index`, a tensor or a function), or, when `diagonals` is given (the
    (Lq + Lk - 1,) index of each offset i - j from -(Lk-1) to Lq-1, for consecutive positions), a Toeplitz
    matrix from a strided view instead of a gather (and its gradient by diagonal sums instead of a
    scatter-add), several times faster on CPU. reach: the bucket is the same for every offset beyond ±reach
    (DIET-REL's clip, T5's max distance); with it, `score_mod` reads a per-offset table of 2·reach + 1 values
    per head (gathered once per forward) at the clipped offset, whatever the positions; keep must then be a
    module-level function. Without it, the score_mod reads the dense form. runs: the per-example positions'
    `Runs` (where there are no diagonals), along which `offset_table` reads the table for the fused kernel.
    columns: (a, b) when the buckets along the diagonals are the columns a, a + 1, ..., b - 1 of values, known
    on the host (DIET-REL's unclipped offsets of the default positions): `offset_table` is then that slice, a
    view whose gradient is a copy, where a gather's is a sort and a scatter-add; at_columns: that slice when
    the caller has it (DIET-REL slices every layer's table at once: one view and one gradient copy a forward).
    """

    def __init__(self, values: Tensor, q_pos: Tensor, k_pos: Tensor, bucket: Callable[[Tensor], Tensor],
                 index: Tensor | Callable[[], Tensor] | None = None,
                 keep: Callable[[Tensor, Tensor], Tensor] | None = None, diagonals: Tensor | None = None,
                 reach: int | None = None, runs: Runs | None = None, columns: tuple[int, int] | None = None,
                 at_columns: Tensor | None = None):
        super().__init__(None, q_pos, k_pos, values.shape[0])
        self.values, self.bucket, self.reach = values, bucket, reach
        # an (Lq, Lk) int64 index is 512 MiB at 8,192 tokens: never built when the diagonals serve
        self._index = index if index is not None else (lambda: bucket(relative_offsets(q_pos, k_pos)))
        self.keep, self.diagonals, self.runs, self.columns = keep, diagonals, runs, columns
        self.at_columns = at_columns

    def renew(self, keep: tuple[str, ...] = (), index: Tensor | Callable[[], Tensor] | None = None) -> None:
        """`LogitTerm.renew`, and the index as in `__init__` (None: none until the next `renew`)."""
        super().renew(keep)
        self._index = index

    def _keep(self, start: int, stop: int) -> Tensor | None:
        if self.keep is None:
            return None
        keep = self.keep(self.q_pos[..., start:stop, None], self.k_pos[..., None, :])  # (1|B, rows, Lk) bool
        return keep if keep.dim() == 2 else keep[:, None]  # (rows, Lk) or (B, 1, rows, Lk)

    def build(self, q: Tensor | None, rows: tuple[int, int] | None) -> Tensor:
        lq, lk = self.size
        start, stop = row_span(rows, lq)
        if self.diagonals is None and self.batch > 1:
            bias = self.values[:, self.index[:, start:stop]].transpose(0, 1)  # (B, H, rows, Lk)
        elif self.diagonals is None:
            bias = self.values[:, self.index[start:stop]].unsqueeze(0)  # (1, H, rows, Lk)
        else:  # rows i in [start, stop) read diagonals start .. stop-1 + Lk-1: consecutive columns, or gathered
            at = self.columns[0] if self.columns is not None else None
            diagonals = self.values[:, at + start:at + stop + lk - 1] if at is not None \
                else self.values[:, self.diagonals[start:stop + lk - 1]]
            bias = toeplitz(diagonals, stop - start, lk).unsqueeze(0)
        keep = self._keep(start, stop)
        return bias if keep is None else bias * keep.to(bias.dtype)

    def offset_table(self) -> OffsetTable | None:
        """values read at the diagonals' buckets (or along the runs'), as a slice where they are consecutive
        columns, else by advanced indexing, whose gradient on CUDA sorts the indices and adds each bucket's
        entries in order (`index_select`'s would add them atomically); the keep as two vectors (per example with
        per-example positions) when it is a `SeparableKeep`. None without diagonals or runs, or with another
        keep."""
        if self.diagonals is None and self.runs is None:
            return None
        if not (self.keep is None or isinstance(self.keep, SeparableKeep)):
            return None

        def build():
            if self.columns is not None and self.diagonals is not None:
                values = self.at_columns if self.at_columns is not None \
                    else self.values[:, self.columns[0]:self.columns[1]]  # (H|1, Lq + Lk - 1), a view
            else:
                along = self.diagonals if self.diagonals is not None else self.bucket(self.runs.diagonals)
                values = self.values[:, along]  # (H|1, Lq + Lk - 1)
            if self.keep is None:
                return OffsetTable(values, runs=self.runs)
            return OffsetTable(values, self.keep.query(self.q_pos).to(values.dtype),
                               self.keep.key(self.k_pos).to(values.dtype), self.runs)

        return self.per_forward("offset_table", build)

    def score_mod(self, q: Tensor | None = None) -> ScoreMod:
        if self.reach is None:
            return super().score_mod(q)
        offsets = torch.arange(-self.reach, self.reach + 1, device=self.values.device)
        table = self.values[:, self.bucket(offsets)]  # (H|1, 2·reach + 1): one gather, one index in the kernel
        return ScoreMod(offset_table_pair, (table, self.q_pos, self.k_pos,
                                            *offset_bounds(self.q_pos, -self.reach, self.reach), self.keep))


class QueryRelativeBias(LazyIndex, LogitTerm):
    """scale · ((q + u) · r_m)[bucket(pos_i - pos_j)]: a query-dependent term over M relative vectors r.

    Shaw et al.'s key term (r = clipped a^K, u = 0) and XLNet's position terms (r = W_R R_{i-j}, u = v).
    r: (M, H|1, Dh); u: (H, Dh) or None; positions and bucket as in TableBias; index: optional (1|B, Lq, Lk)
    bucket of every pair (a tensor or a function, shared by layers); band: set when the buckets are clipped
    offsets of consecutive positions (Shaw), which `dietpe.attention.banded` serves with the fused kernel;
    onehot: optional function giving the index's `OneHot` (or None), which makes the dense form a matmul;
    first: the offset of bucket 0 when bucket(o) = clip(o - first, 0, M - 1) (Shaw's -k, XLNet's smallest
    offset), which `score_mod` needs (None: no score_mod).
    """

    query_dependent = True

    def __init__(self, r: Tensor, q_pos: Tensor, k_pos: Tensor, bucket: Callable[[Tensor], Tensor], scale: float,
                 u: Tensor | None = None, index: Tensor | Callable[[], Tensor] | None = None,
                 band: Band | None = None, onehot: Callable[[], OneHot | None] | None = None,
                 first: int | Tensor | None = None):
        super().__init__((q_pos.shape[-1], k_pos.shape[-1]), batch=None, heads=None)  # the query's B, H
        self.r, self.q_pos, self.k_pos, self.bucket, self.scale, self.u = r, q_pos, k_pos, bucket, scale, u
        self._index = index if index is not None else (lambda: bucket(relative_offsets(q_pos, k_pos)))
        self.band, self._onehot, self.first = band, onehot, first

    # scaled before the gather: M columns multiplied instead of Lk (the same products, so the same bits)
    def build(self, q: Tensor, rows: tuple[int, int] | None) -> Tensor:
        if rows is None:
            return relative_gather(self.by_offset(q), self.index, self.onehot)
        start, stop = rows
        return relative_gather(self.by_offset(q[..., start:stop, :]), self.index[..., start:stop, :])

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

    def score_mod(self, q: Tensor) -> ScoreMod | None:
        if self.first is None:
            return None
        # (B, H, Lq, M) per layer: M = Lq + Lk - 1 offsets at most (2k + 1 for Shaw), never (Lq, Lk) pairs
        by_offset, first = self.by_offset(q), self.first
        return ScoreMod(query_offset_pair, (by_offset, self.q_pos, self.k_pos,
                                            *offset_bounds(self.q_pos, first, first + by_offset.shape[-1] - 1)))
