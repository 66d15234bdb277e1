"""The four places where position (and segment) information can enter a Transformer, as term types.

DIET (Chen et al. 2021) and TUPE (Ke et al. 2021) argue that *where* position enters matters more than
whether it is absolute or relative. diet makes each place a small typed interface, and an encoding is a set
of contributions to them, never a branch inside attention:

    input       PositionMethod.embed: (1|B, L, D) added to the token embeddings   (BERT, sinusoids, token types)
    qk          QKTerm:     (q, k) -> (q', k') before the dot product          (rotary, XLNet's u)
    logit bias  LogitTerm:  (1|B, H|1, Lq, Lk) added to the scaled logits      (T5, DIET, TUPE, ALiBi, KERPLE,
                            Shaw's key term, segments; any f(pos_i, pos_j) through PositionBias); low-rank
                            ones also offer factors, so a backend may fold them into queries and keys
    values      ValueTerm:  probs (B, H, Lq, Lk) -> (B, H, Lq, Dh) added to the attention output  (Shaw's value)

The one attention equation (dietpe.attention.backends) is

    scores = (q'·k'ᵀ) · scale · score_scale + Σ logit terms + mask
    out    = softmax(scores) · v + Σ value terms(softmax(scores))

Notation used everywhere: B batch, H heads, Lq / Lk query / key length, D hidden size, Dh head size,
r rank of a low-rank term, M number of distinct relative offsets or buckets. A size written 1|B (or H|1) is
1 where the tensor is shared by the batch (the heads) and broadcasts.

Modules: `logit` the logit-term contract (`LogitTerm`), `low_rank`, `position` and `relative` its
implementations, `values` the value term, `layer` a layer's terms (`LayerTerms`). The per-forward `Context`
the methods build terms from is `dietpe.positions.context`.
"""

from dietpe.positions.terms.layer import EMPTY, LayerTerms, QKTerm
from dietpe.positions.terms.logit import (LogitTerm, OffsetTable, PiecewiseTable, ScoreMod, SegmentTable, head_at,
                                         position_at, row_span)
from dietpe.positions.terms.low_rank import LowRankBias, ScaledLowRank, SegmentBias
from dietpe.positions.terms.position import DistanceBias, PositionBias
from dietpe.positions.terms.relative import Band, LazyIndex, QueryRelativeBias, SeparableKeep, TableBias
from dietpe.positions.terms.values import ValueTerm

__all__ = ["EMPTY", "Band", "DistanceBias", "LayerTerms", "LazyIndex", "LogitTerm", "LowRankBias", "OffsetTable",
           "PiecewiseTable", "PositionBias", "QKTerm", "QueryRelativeBias", "ScaledLowRank", "ScoreMod", "SegmentBias",
           "SegmentTable", "TableBias", "ValueTerm", "head_at", "position_at", "row_span"]
