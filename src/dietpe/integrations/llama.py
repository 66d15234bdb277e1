"""Llama-style decoders (Llama, Mistral, Qwen2, Qwen3; Gemma, OLMo, OLMo-2, Granite, StarCoder2 share the
wiring): pre-norm, RMSNorm, SwiGLU, grouped keys, RoPE applied by each attention module from the base model's
`rotary_emb`. Attaching a method makes RoPE the identity (unless `input_positions=true` keeps it); input
methods are added to the embeddings by the pre-hook. A method that is RoPE itself (`rotary`: a qk term reading
a RoPE base) is served by the model's own rotary module, so every `rope_type` transformers defines (default,
linear, dynamic, yarn, longrope, llama3) and its factors are the model's, computed by transformers' own code
(`ROPE_INIT_FUNCTIONS`); a spec that sets another `rotary_base` gets the same module rebuilt with that base."""

from __future__ import annotations

import copy

from dietpe.errors import ConfigError
from dietpe.integrations.common import NoRotary, own_base
from dietpe.integrations.core import Family, register_family
from dietpe.positions.registry import REGISTRY


def _attention(base):
    return [layer.self_attn for layer in base.layers]


def is_rope(config) -> bool:
    """The method is rotary position embedding itself: only a qk term, reading a RoPE base."""
    info = REGISTRY[config.position]
    return info.entry == ("qk",) and info.uses("rotary_base")


def _rebuilt(base, theta: float):
    """The model's rotary module, built again from a copy of its config with base `theta`."""
    config = copy.deepcopy(base.config)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        config.rope_parameters = {**rope, "rope_theta": theta}
    else:
        config.rope_theta = theta
    try:
        module = type(base.rotary_emb)(config=config)
    except Exception as e:  # a rotary module this wiring does not know how to rebuild
        raise ConfigError(f"attach: cannot rebuild {type(base.rotary_emb).__name__} with rotary_base={theta}: "
                          f"{e}; attach 'rotary' without rotary_base to use the model's own") from None
    buffer = next(iter(base.rotary_emb.buffers()), None)
    return module.to(buffer.device) if buffer is not None else module


def _replace(base, attached, keep: bool) -> None:
    if keep:
        return
    if is_rope(attached.config) and hasattr(base, "rotary_emb"):
        attached.native = True  # the model's own module computes it, in the model's own place
        if attached.config.rotary_base != own_base(base.config):
            base.rotary_emb = _rebuilt(base, attached.config.rotary_base)
        return
    c = base.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    base.rotary_emb = NoRotary(head_dim)


LLAMA = register_family(Family(("llama", "mistral", "qwen2", "qwen3", "gemma", "olmo", "olmo2", "granite",
                                "starcoder2"), _attention, _replace, causal=True,
                               embed_in_hook=True))
