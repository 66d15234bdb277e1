"""Llama-style decoders (Llama, Mistral, Qwen2, Qwen3; Gemma, OLMo, OLMo-2, Granite, StarCoder2 share the
wiring): pre-norm, RMSNorm, SwiGLU, grouped keys, RoPE applied
by each attention module from the base model's `rotary_emb`. Attaching a method makes RoPE the identity
(unless `input_positions=true` keeps it); input methods are added to the embeddings by the pre-hook."""

from __future__ import annotations

from dietpe.integrations.common import NoRotary
from dietpe.integrations.core import Family, register_family


def _attention(base):
    return [layer.self_attn for layer in base.layers]


def _replace(base, attached, keep: bool) -> None:
    if not keep:
        c = base.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        base.rotary_emb = NoRotary(head_dim)


LLAMA = register_family(Family(("llama", "mistral", "qwen2", "qwen3", "gemma", "olmo", "olmo2", "granite",
                                "starcoder2"), _attention, _replace, causal=True,
                               embed_in_hook=True))
