"""Pieces the families share: a learned input table replaced by the method's input term, RoPE made the
identity, the model's RoPE base."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class InputPositions(nn.Module):
    """Stands where a model's learned position table (GPT-2's `wpe`, BERT's `position_embeddings`) was: given
    the model's position ids, returns what the attached method adds to the embeddings (zeros for methods that
    act inside attention). Holds no parameters of its own."""

    def __init__(self, attached: nn.Module, hidden_size: int):
        super().__init__()
        object.__setattr__(self, "attached", attached)  # owned by the base model, not by this module
        self.hidden_size = hidden_size

    def forward(self, position_ids: Tensor) -> Tensor:
        term = self.attached.input_term(position_ids.reshape(-1, position_ids.shape[-1]))
        if term is None:
            dtype = next((p.dtype for p in self.attached.parameters()), torch.get_default_dtype())
            return torch.zeros(*position_ids.shape, self.hidden_size, device=position_ids.device, dtype=dtype)
        return term.expand(*position_ids.shape, self.hidden_size) if position_ids.dim() == 2 else term[0]


class NoRotary(nn.Module):
    """Stands where a model's rotary embedding module was: cos = 1, sin = 0, so `apply_rotary_pos_emb` returns
    queries and keys unchanged (x·1 + rotate_half(x)·0 = x exactly)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        shape = (position_ids.shape[0], position_ids.shape[-1], self.head_dim)  # (B, L, Dh), as HF's
        return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)


def own_base(model_config) -> float:
    """The model's RoPE base (rope_theta)."""
    rope = getattr(model_config, "rope_parameters", None)
    if isinstance(rope, dict) and "rope_theta" in rope:
        return float(rope["rope_theta"])
    return float(getattr(model_config, "rope_theta", 10000.0))
