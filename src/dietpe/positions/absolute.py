"""Input-additive positions: BERT's learned table (Devlin et al. 2019, §3: E = token + segment + position)
and fixed sinusoids (Vaswani et al. 2017, §3.5: P[k,2i] = sin(k/10000^(2i/d)), P[k,2i+1] = cos(...)).

Entry point: input. Theorem 1 of DIET bounds the rank of every head's logits by d_h for these.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from dietpe.positions.fields import Field, positive_float
from dietpe.positions.functional import sinusoids
from dietpe.positions.method import PositionMethod, Traits, normal_parameter

POSITION_SCALE = Field("position_scale", 1.0, positive_float, "a scale on the fixed input sinusoids")


def sinusoid_reference(pos: int, d: int) -> Tensor:
    """Vaswani §3.5 for one position, a loop over dimensions: (d,)."""
    out = torch.zeros(d)
    for i in range(0, d, 2):
        out[i] = math.sin(pos / 10000 ** (i / d))
        if i + 1 < d:
            out[i + 1] = math.cos(pos / 10000 ** (i / d))
    return out


class NoPosition(PositionMethod):
    """`none`: the model is permutation-equivariant (a baseline for how much position matters)."""

    name = "none"
    traits = Traits(relative=True)


class LearnedAbsolute(PositionMethod):
    """`absolute`: a learned (max_length, D) table added to the token embeddings."""

    name = "absolute"
    traits = Traits(entry=("input",), learned_table=True, paper_row="absolute", bert_table=True)

    @classmethod
    def from_config(cls, c):
        return cls(c.max_position_embeddings, c.hidden_size)

    def reference_embedding(self, config, pos: int) -> Tensor:
        return self.weight[pos]

    def __init__(self, max_length: int, hidden_size: int):
        super().__init__()
        self.max_length = max_length
        self.weight = normal_parameter(max_length, hidden_size)

    def embed(self, position_ids: Tensor) -> Tensor:
        return nn.functional.embedding(position_ids, self.weight)  # (1|B, L, D)

    def position_table(self, length: int) -> Tensor:
        return self.weight[:length]


class Sinusoidal(PositionMethod):
    """`sinusoidal`: fixed, parameter-free, defined for any length. `scale` (`position_scale`) multiplies the
    sinusoids: 1 is Vaswani's formula as written; in BERT's layout, where token embeddings start at std 0.02,
    unit sinusoids swamp the tokens, and a scale near initializer_range·√2 gives both the same RMS."""

    name = "sinusoidal"
    traits = Traits(entry=("input",), paper_row="sinusoidal")
    fields = (POSITION_SCALE,)

    @classmethod
    def from_config(cls, c):
        return cls(c.hidden_size, c.position_scale)

    def reference_embedding(self, config, pos: int) -> Tensor:
        return config.position_scale * sinusoid_reference(pos, config.hidden_size)

    def __init__(self, hidden_size: int, scale: float = 1.0):
        super().__init__()
        self.hidden_size, self.scale = hidden_size, float(scale)

    def embed(self, position_ids: Tensor) -> Tensor:
        table = sinusoids(position_ids, self.hidden_size)  # (1|B, L, D), float32
        return table if self.scale == 1 else table * self.scale

    def position_table(self, length: int) -> Tensor:
        table = sinusoids(torch.arange(length), self.hidden_size)
        return table if self.scale == 1 else table * self.scale
