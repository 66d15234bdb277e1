"""Input-additive positions: BERT's learned table (Devlin et al. 2019, §3: E = token + segment + position)
and fixed sinusoids (Vaswani et al. 2017, §3.5: P[k,2i] = sin(k/10000^(2i/d)), P[k,2i+1] = cos(...)).

Entry point: input. Theorem 1 of DIET bounds the rank of every head's logits by d_h for these.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dietpe.positions.functional import sinusoids
from dietpe.positions.method import PositionMethod, normal_parameter


class NoPosition(PositionMethod):
    """`none`: the model is permutation-equivariant (a baseline for how much position matters)."""


class LearnedAbsolute(PositionMethod):
    """`absolute`: a learned (max_length, D) table added to the token embeddings."""

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

    def __init__(self, hidden_size: int, scale: float = 1.0):
        super().__init__()
        self.hidden_size, self.scale = hidden_size, float(scale)

    def embed(self, position_ids: Tensor) -> Tensor:
        table = sinusoids(position_ids, self.hidden_size)  # (1|B, L, D), float32
        return table if self.scale == 1 else table * self.scale

    def position_table(self, length: int) -> Tensor:
        table = sinusoids(torch.arange(length), self.hidden_size)
        return table if self.scale == 1 else table * self.scale
