"""DIET: decoupled positional attention (Chen et al. 2021, "A Simple and Effective Positional Encoding for
Transformers", §3).

    DIET-ABS   (eq. 1)  A_ij = (x_i W_Q)(x_j W_K)ᵀ / √d + (P_Q P_Kᵀ)_ij            P_Q, P_K ∈ R^{n×d_p} per head
    DIET-REL   (eq. 3)  A_ij = (x_i W_Q)(x_j W_K)ᵀ / √d + R_{i-j}                 one scalar per offset per head
    DIET-ABS-LIN (eq. 4) A_ij = (x_i W_Q)((E X)_j W_K)ᵀ / √d + (P_Q P_Kᵀ)_ij      P_K ∈ R^{k×d_p} (Linformer)

Both are per layer by default; `sharing` gives the ablations of Tables 5, 8, 9 (`head`: heads of a layer
share one table, `layer`: all layers share). DIET-REL is unclipped and unbucketed: the table covers every
offset up to the configured maximum length; longer inputs reuse the edge offsets' values. `max_distance`
(config `diet_rel_max_distance`) clips offsets to ±max_distance as Shaw et al. do, so the edge value is
trained on every pair at least that far apart, not only on the longest offset, and reused beyond the
training length. Its default is the paper's unclipped table in an encoder (the papers' setting: inputs never
longer than the table) and half the model's length in causal attention, where a model meets lengths beyond
its training length and an edge trained by one pair per window leaves it there with a bias it never learned
(docs/parametrization.md, "Flat to 8L"); `diet_rel_max_distance=None` asks for the unclipped table there.
R, P_Q and P_K are stored over `logit_scale` (dietpe.positions.method); the equations read the effective tables.
Entry point: logit bias (DIET-ABS is low rank and may be folded into queries and keys by a backend).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dietpe.positions.context import Built, Context, clipped_diagonals, clipped_index
from dietpe.positions.fields import Field, optional_positive_int
from dietpe.positions.functional import take_rows
from dietpe.positions.method import (PositionMethod, Traits, normal_parameter, refill_logit, shared_layer,
                                    sharing_shape)
from dietpe.positions.terms import LayerTerms, LowRankBias, ScaledLowRank, TableBias

POSITION_RANK = Field("position_rank", None, optional_positive_int, "d_p, the rank of P_Q P_Kᵀ (None: the head size)")
DIET_REL_MAX_DISTANCE = Field("diet_rel_max_distance", None, optional_positive_int,
                              "offsets clipped to ± this (None: the paper's unclipped table; default: None, "
                              "in causal attention half the model's length)",
                              causal_default=lambda c: max(1, c.max_position_embeddings // 2))


def _table(config, layer: int, head: int) -> tuple[int, int]:
    """(layer, head) of the table a head reads under `sharing` (DIET Tables 5, 8, 9)."""
    return (0 if config.sharing == "layer" else layer), (0 if config.sharing == "head" else head)


class DietAbs(PositionMethod):
    name = "diet-abs"
    traits = Traits(entry=("logits",), learned_table=True, shareable=True, segment="per-head",
                    paper_row="diet-abs:sharing=layer", tile_terms=True)
    fields = (POSITION_RANK,)
    logit_parameters = ("p_q", "p_k")

    @classmethod
    def from_config(cls, c):
        return cls(c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings, c.rank, c.sharing,
                   c.linformer_k if c.attention == "linformer" else None)

    def reference_logit(self, config, q, k, i, j, layer, head):
        lt, h = _table(config, layer, head)  # eq. 1: + (P_Q P_Kᵀ)_ij
        bias = self.logit("p_q")[lt, h, i] @ self.logit("p_k")[lt, h, j]
        return super().reference_logit(config, q, k, i, j, layer, head) + bias

    def __init__(self, num_layers: int, num_heads: int, max_length: int, rank: int, sharing: str,
                 projected_keys: int | None = None):
        super().__init__()
        self.max_length, self.sharing = max_length, sharing
        n_layers, n_heads = sharing_shape(sharing, num_layers, num_heads)
        self.p_q = normal_parameter(n_layers, n_heads, max_length, rank)
        # with Linformer (eq. 4) keys are the k projected slots, so P_K has k rows
        self.p_k = normal_parameter(n_layers, n_heads, projected_keys or max_length, rank)

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        table = shared_layer(self.sharing, layer)
        kept = ctx.cached(Built(self, -1), lambda: self.kept_forward(ctx, (self.p_q, self.p_k),
                                                                      lambda: _AbsForward(self, ctx), None))
        if kept is not None:
            return kept.layer(self, ctx, table)

        def build():
            # the rows as stored: the term applies logit_scale (on the query side alone for the fused kernel)
            fq = take_rows(self.layer_table(ctx, "p_q", table, stored=True), ctx.q_pos, ctx.q_start)
            # Linformer's keys are its k projected slots, not positions
            p_k = self.layer_table(ctx, "p_k", table, stored=True)
            fk = p_k.unsqueeze(0) if ctx.projected_keys else take_rows(p_k, ctx.k_pos, ctx.k_start)
            c = self.logit_scale
            # P_Q P_Kᵀ, kept between inference forwards (DIET §3.1); built by a term of its own, so that the
            # returned term holds no closure over itself (a reference cycle)
            product = self.kept(ctx, f"diet_abs_{table}", (fq, fk), fq.shape[-3] * fq.shape[-2] * fk.shape[-2],
                                lambda: ScaledLowRank(fq, fk, c).build(None, None))
            return ScaledLowRank(fq, fk, c, product)

        return LayerTerms(logits=[ctx.cached(Built(self, table), build)])


class _AbsFactors:
    """P_Q's and P_K's rows at a forward's default positions, for every table at once: × logit_scale (views of P
    where the scale is 1, else a buffer), and folded as the fused kernel reads them (P_Q · c² / s in q's dtype,
    P_K as stored where it has q's dtype; one buffer per (s, dtype)), each refilled by one op for all tables at
    most once a forward, when first read (`forward` counts the forwards). The same elementwise ops as the
    per-forward path, so the same bits."""

    def __init__(self, p_q: Tensor, p_k: Tensor, scale: float, q_rows: slice, k_rows: slice):
        self.p, self.scale, self._rows = (p_q, p_k), scale, (q_rows, k_rows)
        self.forward = 0
        self._logit: list | None = None  # [forward, fq (T, H, Lq, r), fk, their (1, H, L, r) views per table]
        self._folded: dict[tuple, list] = {}  # (s, dtype) -> the same

    def rows(self) -> tuple[Tensor, Tensor]:
        return tuple(p[:, :, rows] for p, rows in zip(self.p, self._rows))

    def logit(self) -> list:
        if self.scale == 1:  # views of P: always current
            if self._logit is None:
                self._logit = [None, *self._views(*self.rows())]
            return self._logit
        if self._logit is None:
            fq, fk = (x * self.scale for x in self.rows())
            self._logit = [self.forward, fq, fk, *self._views(fq, fk)]
        elif self._logit[0] != self.forward:
            for x, out in zip(self.rows(), self._logit[1:3]):
                torch.mul(x, self.scale, out=out)
            self._logit[0] = self.forward
        return self._logit

    def factors(self, table: int) -> tuple[Tensor, Tensor]:
        views = self.logit()[-2:]
        return views[0][table], views[1][table]

    def folded(self, table: int, s: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        entry = self._folded.get((s, dtype))
        if entry is None or entry[0] != self.forward:
            fq, fk = self.rows()  # as `ScaledLowRank.folded`: P_Q · c² / s, and P_K as stored (a view in its dtype)
            c = self.scale * self.scale / s
            if entry is None:
                q2, k2 = (fq * c).to(dtype), fk.to(dtype)
                entry = self._folded[(s, dtype)] = [self.forward, q2, k2, *self._views(q2, k2)]
            else:
                torch.mul(fq, c, out=entry[1])  # computed in float32, then cast, as (fq * c).to(dtype)
                if fk.dtype != dtype:
                    entry[2].copy_(fk)
                entry[0] = self.forward
        return entry[-2][table], entry[-1][table]

    @staticmethod
    def _views(fq: Tensor, fk: Tensor) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        return tuple(x.unsqueeze(0) for x in fq.unbind(0)), tuple(x.unsqueeze(0) for x in fk.unbind(0))


class _KeptLowRank(LowRankBias):
    """DIET-ABS's term of one table, its factors read from `_AbsFactors` (refilled there when first read)."""

    def __init__(self, factors: _AbsFactors, table: int, product=None):
        super().__init__(*factors.factors(table), product)
        self._source, self._table = factors, table

    def factors(self) -> tuple[Tensor, Tensor]:
        return self._source.factors(self._table)

    def folded(self, s: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return self._source.folded(self._table, s, dtype)


class _AbsForward:
    """DIET-ABS's terms of every table, kept between forwards that build no autograd graph (DIET §3.1;
    `PositionMethod.kept_forward`): their factors views of `_AbsFactors`' buffers, which each forward refills
    (one op for all tables, only the form a backend reads: the fused kernel's folded factors, or the factors)."""

    def __init__(self, method: DietAbs, ctx: Context):
        lq, lk = ctx.q_pos.shape[-1], ctx.k_pos.shape[-1]
        self.factors = _AbsFactors(method.p_q, method.p_k, method.logit_scale,
                                   slice(ctx.q_start, ctx.q_start + lq), slice(ctx.k_start, ctx.k_start + lk))
        self.layers: list[LayerTerms | None] = [None] * method.p_q.shape[0]

    def layer(self, method: DietAbs, ctx: Context, table: int) -> LayerTerms:
        terms = self.layers[table]
        if terms is None:
            term = _KeptLowRank(self.factors, table)
            fq, fk = term.fq, term.fk
            fetch = method.kept(ctx, f"diet_abs_{table}", (fq, fk), fq.shape[-3] * fq.shape[-2] * fk.shape[-2],
                                lambda: fq @ fk.transpose(-1, -2))
            if fetch is not None:  # the CPU's product, compared with the factors once they are current
                factors = self.factors
                term.kept = lambda: (factors.factors(table), fetch())[1]
            terms = self.layers[table] = LayerTerms(logits=[term])
        return terms

    def start(self, ctx: Context) -> None:
        self.factors.forward += 1
        self.drop()

    def drop(self) -> None:
        for terms in self.layers:
            if terms is not None:
                terms.logits[0].renew()


class DietRel(PositionMethod):
    name = "diet-rel"
    traits = Traits(entry=("logits",), key_positions=True, relative=True, shareable=True, segment="per-head",
                    paper_row="diet-rel", tile_terms=True)
    fields = (DIET_REL_MAX_DISTANCE,)
    profile_name = "R[i-j]"
    logit_parameters = ("r",)

    @classmethod
    def from_config(cls, c):
        return cls(c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings, c.sharing,
                   c.diet_rel_max_distance)

    def reference_logit(self, config, q, k, i, j, layer, head):
        lt, h = _table(config, layer, head)  # eq. 3: + R_clip(i-j)
        d = min(config.diet_rel_max_distance or 1 << 30, config.max_position_embeddings - 1)
        bias = self.logit("r")[lt, h, max(-d, min(d, i - j)) + d]
        return super().reference_logit(config, q, k, i, j, layer, head) + bias

    def __init__(self, num_layers: int, num_heads: int, max_length: int, sharing: str,
                 max_distance: int | None = None):
        super().__init__()
        self.span = max_length - 1 if max_distance is None else min(max_distance, max_length - 1)
        self.sharing = sharing
        n_layers, n_heads = sharing_shape(sharing, num_layers, num_heads)
        self.r = normal_parameter(n_layers, n_heads, 2 * self.span + 1)  # R_{i-j}, i-j in [-span, span]

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        table = shared_layer(self.sharing, layer)
        shared = ctx.cached(Built(self, -1), lambda: self.kept_forward(ctx, (self.r,), lambda: _RelForward(self, ctx)))
        terms = shared.layers[table]
        if terms is None:  # one term per table, its dense form kept between inference forwards
            r = shared.r[table]
            terms = shared.layers[table] = LayerTerms(logits=[self.keep(ctx, f"diet_rel_{table}", (r,), TableBias(
                r, ctx.q_pos, ctx.k_pos, self.bucket, shared.index, diagonals=shared.diagonals, reach=self.span,
                runs=shared.runs, columns=shared.columns, at_columns=shared.at_columns(table)))])
        return terms

    def bucket(self, offsets):
        """Offset i - j -> column of R: every offset its own, the edges reused beyond the table."""
        return None if offsets is None else offsets.clamp(-self.span, self.span) + self.span


class _RelForward:
    """What DIET-REL's layers share in one forward, in one cache entry (every layer asks, and each entry costs
    its key's hashing in Python): R's per-layer slices (one `unbind`, so the backward writes each layer's
    gradient into one stacked gradient), the diagonals' columns of R, the consecutive columns they are where
    the positions are the defaults within the clip (known on the host), the positions' runs, the (1|B, Lq, Lk)
    index built only if some term needs more than its diagonals, and each table's terms once built. Where the
    diagonals are consecutive columns, every layer's table is sliced to them at once (`at_columns`): one view
    and, in the backward, one copy into R's gradient a forward, where each layer's slice was one of each.

    Kept between forwards that build no autograd graph (DIET §3.1: the term "is independent of the input, [so]
    we ... can cache the computed matrix before running inference"; `PositionMethod.kept_forward`): its slices
    are views of R, or of a buffer that each forward refills with R × logit_scale (one op), so they read the
    current R however it changed (an optimizer's fused step bumps no version counter); its terms drop what a
    forward built on them when it ends (dense forms, the index). A forward then reuses the objects its layers
    would build again, which in a step bound by the host (a GPU's, at inference) is most of the method's cost."""

    def __init__(self, method: DietRel, ctx: Context):
        span = method.span
        r = method.logit("r")
        self.r = r.unbind(0)
        self.diagonals = clipped_diagonals(ctx, span)
        first, count = ctx.first_offset(), ctx.q_pos.shape[-1] + ctx.k_pos.shape[-1] - 1
        self.columns = (first + span, first + span + count) \
            if first is not None and -span <= first and first + count - 1 <= span else None
        self.runs = ctx.runs()
        self.index = lambda: clipped_index(ctx, span)
        self.layers: list[LayerTerms | None] = [None] * len(self.r)
        self._r, self._columns = r, None
        self._source, self._scale, self._span = method.r, method.logit_scale, span  # not the module: no cycle

    def start(self, ctx: Context) -> None:
        """A later forward (`PositionMethod.kept_forward`): R × logit_scale into the buffer, the index from this
        forward's context."""
        refill_logit(self._r, self._source, self._scale)
        span = self._span
        self.index = lambda: clipped_index(ctx, span)
        self._renew(self.index)

    def drop(self) -> None:
        """The forward has ended: its context (positions, segments, index) goes with it."""
        self.index = None
        self._renew(None)

    def _renew(self, index) -> None:
        # the kernel's tables are R's slices where the diagonals are consecutive columns: views, kept
        keep = ("offset_table",) if self.columns is not None and self.diagonals is not None else ()
        for terms in self.layers:
            if terms is not None:
                terms.logits[0].renew(keep, index)

    def at_columns(self, table: int) -> Tensor | None:
        """R[table] at the diagonals' consecutive columns, every layer's sliced at the first call; None where they
        are no consecutive columns (or there are no diagonals)."""
        if self.columns is None or self.diagonals is None:
            return None
        if self._columns is None:
            a, b = self.columns
            self._columns = self._r.narrow(-1, a, b - a).unbind(0)
        return self._columns[table]

