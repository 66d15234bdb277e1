"""GPT-2 (Radford et al. 2019): post-embedding learned absolute table `wpe`, added to the token embeddings.
Attaching a method puts its input term (zeros for methods acting inside attention) where `wpe` was, unless
`input_positions=true` keeps the table."""

from __future__ import annotations

from dietpe.errors import ConfigError
from dietpe.integrations.common import InputPositions
from dietpe.integrations.core import Family, register_family


def _attention(base):
    return [block.attn for block in base.h]


def _replace(base, attached, keep: bool) -> None:
    if not keep:
        base.wpe = InputPositions(attached, base.config.hidden_size, base.wpe.weight.dtype)


def _check(config) -> None:
    if getattr(config, "reorder_and_upcast_attn", False):
        raise ConfigError("attach: GPT-2 with reorder_and_upcast_attn=True computes eager attention by its own path, "
                          "which cannot add the method's terms; set reorder_and_upcast_attn=False")


def _table(base):
    wpe = base.wpe
    return getattr(wpe, "weight", None)


GPT2 = register_family(Family(("gpt2",), _attention, _replace, causal=True, input_table=_table, check=_check))
