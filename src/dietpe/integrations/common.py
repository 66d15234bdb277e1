"""Pieces the families share: a learned input table replaced by the method's input term, RoPE made the
identity, the model's RoPE base."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dietpe.errors import ConfigError

#: what a spec may set, besides the method's own fields, where diet does not build the model (`attach`,
#: `Positions`); every other config field describes a model, which these take as it is
ENCODING_FIELDS = frozenset({"position", "segment", "sharing", "logit_scale", "max_position_embeddings",
                             "input_positions"})
_INSTEAD = {"attn_backend": "pass backend= instead",
            "attention": "Linformer's projection of keys and values is a model's, not a method's",
            "linformer_k": "Linformer's projection of keys and values is a model's, not a method's"}


def method_fields(method, where: str) -> dict:
    """`method`'s config fields (a parsed spec), refusing the fields that describe a model (sizes, dropout,
    Linformer, the backend) rather than the method: `where` takes the model, or its sizes, as they are."""
    from dietpe.positions.registry import FIELDS

    fields = method.config_fields()
    foreign = sorted(k for k in fields if k not in FIELDS and k not in ENCODING_FIELDS)
    if foreign:
        hints = "".join(f"; {k}: {_INSTEAD[k]}" for k in foreign if k in _INSTEAD)
        allowed = sorted((ENCODING_FIELDS - {"position"}) | set(FIELDS))
        what = "is a field" if len(foreign) == 1 else "are fields"
        raise ConfigError(f"{where}: {', '.join(foreign)} {what} of the model, not of the method ({where} takes "
                          f"the model's own){hints}; a spec here may set {', '.join(allowed)}")
    return fields


class InputPositions(nn.Module):
    """Stands where a model's learned position table (GPT-2's `wpe`, BERT's `position_embeddings`) was: given
    the model's position ids, returns what the attached method adds to the embeddings (zeros for methods that
    act inside attention), in the dtype the table had. Holds no parameters of its own."""

    def __init__(self, attached: nn.Module, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        object.__setattr__(self, "attached", attached)  # owned by the base model, not by this module
        self.hidden_size = hidden_size
        # an empty buffer follows the model's .to(dtype) as the table would: a parameter-free method's term
        # (zeros, sinusoids) must not promote a bf16 model's embeddings to float32
        self.register_buffer("dtype_probe", torch.empty(0, dtype=dtype), persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        term = self.attached.input_term(position_ids.reshape(-1, position_ids.shape[-1]))
        dtype = self.dtype_probe.dtype
        if term is None:
            return torch.zeros(*position_ids.shape, self.hidden_size, device=position_ids.device, dtype=dtype)
        term = term.to(dtype)
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
