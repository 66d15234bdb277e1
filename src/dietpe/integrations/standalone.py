"""A method for your own attention module: `Positions` builds the method's terms once per forward and
applies them to your q, k, v through diet's one equation

    scores = (q'·k'ᵀ)·scale + Σ logit terms + mask,   out = softmax(scores)·v + Σ value terms

(dietpe.attention.backends), with your positions, segments and mask. `embed` gives what an input method
adds to the token embeddings.
"""

from __future__ import annotations

import math
import operator

import torch
from torch import Tensor, nn

from dietpe.attention.registry import ALL_BACKENDS, serving_backend
from dietpe.errors import ConfigError, InputError
from dietpe.integrations.common import method_fields
from dietpe.positions.context import Context
from dietpe.positions.registry import REGISTRY


class Positions(nn.Module):
    """A position method (the `--method` syntax: `diet-rel`, `t5`, `alibi`, `rotary`, ...) for a stack of
    `num_layers` attention layers of `num_heads` heads of size `head_size`.

        pos = Positions("diet-rel", num_layers=4, num_heads=4, head_size=32, max_length=256, causal=True)
        ctx = pos.context(torch.arange(L))                   # once per forward: (L,) or (B, L) positions
        out = pos.attend(q, k, v, ctx, layer=i)              # q, k, v (B, H, L, Dh) -> (B, H, L, Dh)
    """

    def __init__(self, spec: str, *, num_layers: int, num_heads: int, head_size: int, max_length: int = 512,
                 causal: bool = False, num_segments: int = 2, backend: str = "sdpa", std: float = 0.02):
        super().__init__()
        from dietpe.config import DietConfig
        from dietpe.methods import parse_method
        from dietpe.models.causal import DietCausalConfig
        from dietpe.positions.encoding import PositionEncoding

        if backend not in ALL_BACKENDS:
            raise ConfigError(f"backend={backend!r}; use one of {', '.join(map(repr, ALL_BACKENDS))}")
        cls = DietCausalConfig if causal else DietConfig
        method = parse_method(spec, cls, segment="none", run_fields={})
        fields = {k: v for k, v in method_fields(method, "Positions").items() if k != "input_positions"}
        config = cls(**{"vocab_size": 8, "hidden_size": num_heads * head_size, "num_attention_heads": num_heads,
                        "num_hidden_layers": num_layers, "max_position_embeddings": max_length,
                        "type_vocab_size": num_segments, **fields})
        self.encoding = PositionEncoding(config)
        self.causal, self.scale = causal, 1.0 / math.sqrt(head_size)
        self.sizes = (num_layers, num_heads, head_size)
        self.backend = serving_backend(backend, value_terms=REGISTRY[config.position].probabilities).name
        from dietpe.integrations.core import init_encoding

        init_encoding(self.encoding, std)

    def embed(self, positions: Tensor) -> Tensor | None:
        """(1|B, L, D) to add to the token embeddings (input methods: absolute, sinusoidal), or None."""
        return self.encoding.embed(positions.reshape(-1, positions.shape[-1]), None)

    def context(self, positions: Tensor, key_positions: Tensor | None = None,
                segments: Tensor | None = None) -> Context:
        """The forward's positions: queries' (L,) or (B, L), keys' (default the same), segment ids (B, L)."""
        k = positions if key_positions is None else key_positions
        if self.encoding.head_segments is not None:
            if segments is None or segments.dim() != 2 or segments.shape[-1] != positions.shape[-1]:
                got = "none" if segments is None else f"shape {tuple(segments.shape)}"
                raise InputError(f"per-head segments need segment ids (B, {positions.shape[-1]}), one per query; "
                                 f"got {got}")
            if k.shape[-1] != positions.shape[-1]:
                raise InputError(f"per-head segments read one segment id per key as per query: keys of length "
                                 f"{k.shape[-1]} and queries of {positions.shape[-1]} would need their own")
        self.encoding.check(positions.shape[-1], segments, k if self.encoding.max_length is not None else None)
        return self.encoding.context(positions, k, segments)

    def _check(self, q: Tensor, k: Tensor, v: Tensor, layer: int) -> None:
        layers, heads, size = self.sizes
        try:
            index = None if isinstance(layer, bool) else operator.index(layer)
        except TypeError:
            index = None
        if index is None or not 0 <= index < layers:
            raise InputError(f"layer={layer!r}: this Positions was built for {layers} layers (0 to {layers - 1})")
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.dim() != 4 or x.shape[1] != heads or (name != "v" and x.shape[-1] != size):
                want = f"(B, {heads}, L, {size})" if name != "v" else f"(B, {heads}, L, Dv)"
                raise InputError(f"{name} has shape {tuple(x.shape)}; this Positions was built for {heads} heads of "
                                 f"size {size}: give {want} (repeat grouped keys and values per head)")
        if k.shape[2] != v.shape[2] or q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
            raise InputError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: the batch sizes must "
                             f"match, and k and v must have the same length")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: Context, layer: int = 0, mask: Tensor | None = None,
               dropout_p: float = 0.0) -> Tensor:
        """Attention of layer `layer` with the method's terms: q (B, H, Lq, Dh), k and v (B, H, Lk, Dh) ->
        (B, H, Lq, Dh). mask: (B, Lk) or (B|1, 1, Lq, Lk), boolean or integer (True or 1 = attend, as a
        tokenizer's attention_mask) or floating-point additive; the causal mask is added when built with
        causal=True. dropout_p applies whenever given (as torch's scaled_dot_product_attention)."""
        self._check(q, k, v, layer)
        lq, lk = q.shape[2], k.shape[2]
        if ctx.q_pos.shape[-1] != lq or ctx.k_pos.shape[-1] != lk:
            raise InputError(f"the context holds {ctx.q_pos.shape[-1]} query and {ctx.k_pos.shape[-1]} key positions "
                             f"for q of length {lq} and k of {lk}: build it with context() for this call's lengths")
        add = None
        if mask is not None:
            if mask.dim() == 2:
                mask = mask[:, None, None, :]
            if mask.dim() != 4 or mask.shape[-1] != lk or mask.shape[-2] not in (1, lq) \
                    or mask.shape[0] not in (1, q.shape[0]) or mask.shape[1] not in (1, q.shape[1]):
                raise InputError(f"mask has shape {tuple(mask.shape)}; give (B, {lk}) or (B|1, 1|H, {lq}, {lk}) for "
                                 f"q {tuple(q.shape)} and k {tuple(k.shape)}")
            if not mask.dtype.is_floating_point:  # 0/1 integers, as a tokenizer's attention_mask: keep where 1
                mask = mask != 0
            add = (torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
                   .masked_fill_(~mask, torch.finfo(q.dtype).min) if mask.dtype == torch.bool else mask.to(q.dtype))
        if self.causal:
            future = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(lk - lq + 1)
            c = torch.zeros(lq, lk, dtype=q.dtype, device=q.device).masked_fill_(future, torch.finfo(q.dtype).min)
            add = c[None, None] if add is None else (add + c).clamp(min=torch.finfo(q.dtype).min)
        terms = self.encoding.layer_terms(ctx, layer)
        out, _ = ALL_BACKENDS[self.backend](q, k, v, terms, add, self.scale, dropout_p, False)
        return out
