"""BERT and RoBERTa encoders (Devlin et al. 2019; Liu et al. 2019): a learned absolute table
`embeddings.position_embeddings` added to token and token-type embeddings. Attaching a method puts its input
term (zeros for methods acting inside attention) where the table was, unless `input_positions=true` keeps it;
token types stay BERT's own unless the spec asks for per-head segments, which then read `token_type_ids`."""

from __future__ import annotations

from dietpe.errors import ConfigError
from dietpe.integrations.common import InputPositions
from dietpe.integrations.core import Family, register_family


def _attention(base):
    if getattr(base.config, "is_decoder", False):
        raise ConfigError(f"attach: a {base.config.model_type} decoder (is_decoder=True) is not supported; "
                          f"attach to the encoder (is_decoder=False)")
    return [layer.attention.self for layer in base.encoder.layer]


def _replace(base, attached, keep: bool) -> None:
    if not keep:
        base.embeddings.position_embeddings = InputPositions(attached, base.config.hidden_size,
                                                              base.embeddings.position_embeddings.weight.dtype)


def _table(base):
    return getattr(base.embeddings.position_embeddings, "weight", None)


BERT = register_family(Family(("bert", "roberta"), _attention, _replace, causal=False, input_table=_table,
                              segments=True))
