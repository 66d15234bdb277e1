"""Peer models on the same shapes, for a reference point outside diet: Hugging Face `BertModel` (learned
absolute positions added at the input, SDPA attention) and `T5EncoderModel` (T5's bucketed relative bias,
shared by layers). Same hidden size, layers, heads, feed-forward width and vocabulary as the diet preset.
"""

from __future__ import annotations

from torch import nn

from dietpe.config import PRESETS
from dietpe.errors import ConfigError

PEERS = ("hf-bert", "hf-t5-encoder")


def build_peer(name: str, shape: str, max_length: int = 512, vocab_size: int = 30522) -> nn.Module:
    import torch

    sizes = PRESETS[shape]
    torch.manual_seed(0)
    if name == "hf-bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=vocab_size, max_position_embeddings=max_length, **sizes)
        config._attn_implementation = "sdpa"
        return BertModel(config)
    if name == "hf-t5-encoder":
        from transformers import T5Config, T5EncoderModel

        h = sizes["num_attention_heads"]
        config = T5Config(vocab_size=vocab_size, d_model=sizes["hidden_size"], d_kv=sizes["hidden_size"] // h,
                          d_ff=sizes["intermediate_size"], num_layers=sizes["num_hidden_layers"], num_heads=h)
        return T5EncoderModel(config)
    raise ConfigError(f"peer {name!r} is not one of {', '.join(PEERS)}")
