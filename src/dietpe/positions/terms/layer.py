"""What position and segments contribute to one attention layer: qk, logit and value terms, and a score scale."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from dietpe.positions.terms.logit import LogitTerm
from dietpe.positions.terms.values import ValueTerm


class QKTerm(Protocol):
    """(q (B, H, Lq, Dh), k (B, H, Lk, Dh)) -> (q', k') of the same shapes, before the dot product."""

    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]: ...


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

    def for_checkpointing(self) -> "LayerTerms":
        """The same terms, built afresh by each layer that uses them: a checkpointed layer is recomputed in
        the backward pass and must redo (and save) exactly what it did the first time, not find it cached."""
        for term in self.logits:
            term.reuse = False
        return LayerTerms(self.qk, self.logits, self.values, self.score_scale)


EMPTY = LayerTerms()
