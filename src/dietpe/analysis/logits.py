"""The attention logits of a sampled batch, split into their token-to-token and position terms: the matrices
whose ranks DIET (Chen et al. 2021) compares in Fig. 2 (full logits) and Fig. 8 (position term).

For layer l and head h, with h_l the hidden states entering the layer and the layer's `LayerTerms`,

    content  = (q'·k'ᵀ) · scale · score_scale          q = h_l W_Q, k = h_l W_K, (q', k') after qk terms
    position = Σ the position method's logit terms      (DIET-ABS P_Q P_Kᵀ, DIET-REL R_{i-j}, TUPE, T5, ...)
    segment  = Σ the per-head segment terms             (DIET eq. 2)
    full     = content + position + segment             (what the softmax sees, before the padding mask)

Methods that add position at the input (absolute, sinusoidal) have no position term here: position is
inside `content`, which is what Theorem 1 bounds. Rotary enters through the qk terms, so it is in `content`
too. The logits come from the equation itself (`dietpe.attention.backends.logits`, which the eager backend
adds up) on the layer's own projections (`MultiHeadAttention.project`, Linformer included), so nothing forks
the model's equation; `tests/analysis` checks softmax(full) against the model's own attention probabilities.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dietpe.attention.backends import logits as equation_logits
from dietpe.errors import InputError
from dietpe.positions.encoding import PositionEncoding


@dataclass
class LayerLogits:
    """One layer's logits, each (B|1, H, Lq, Lk); position / segment are None when the model has no such term."""

    content: Tensor
    position: Tensor | None
    segment: Tensor | None
    full: Tensor


def encoder_of(model: nn.Module) -> nn.Module:
    """The stack to analyse: the model itself (DietModel), its `.diet` body, or a seq2seq model's encoder.

    Anything with `.positions` (a PositionEncoding), `.embeddings` and `.layers[i].attention` will do.
    """
    candidates = [model, getattr(model, "diet", None)]
    if callable(getattr(model, "get_encoder", None)):
        try:
            candidates.append(model.get_encoder())
        except Exception:  # HF's default get_encoder may refuse models without an encoder
            pass
    candidates += list(model.modules())
    for m in candidates:
        if (m is not None and isinstance(getattr(m, "positions", None), PositionEncoding)
                and hasattr(m, "layers") and hasattr(m, "embeddings")):
            return m
    raise InputError(f"{type(model).__name__} has no diet encoder (a module with .positions, .embeddings and "
                     f".layers) to analyse")


def _call_kwargs(encoder: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """Only the inputs the encoder's forward accepts (a seq2seq encoder may take no token types)."""
    accepted = inspect.signature(encoder.forward).parameters
    return {k: v for k, v in batch.items() if k in accepted and v is not None}


def segment_ids_for(encoder: nn.Module, batch: dict[str, Tensor]) -> Tensor | None:
    """The token types the model's forward uses: the batch's, or zeros when the model has segments."""
    seg = batch.get("token_type_ids")
    if seg is None and encoder.positions.num_segments:
        seg = torch.zeros_like(batch["input_ids"])
    return seg


@torch.no_grad()
def layer_inputs(encoder: nn.Module, batch: dict[str, Tensor]) -> list[Tensor]:
    """The hidden states (B, L, D) entering each layer's self-attention, caught with forward pre-hooks."""
    caught: dict[int, Tensor] = {}

    def catch(i: int):
        def hook(module, args) -> None:  # returns None: a value returned would replace the layer's arguments
            caught.setdefault(i, args[0].detach())
        return hook

    hooks = [layer.attention.register_forward_pre_hook(catch(i)) for i, layer in enumerate(encoder.layers)]
    try:
        encoder(**_call_kwargs(encoder, batch))
    finally:
        for h in hooks:
            h.remove()
    return [caught[i] for i in range(len(encoder.layers))]


def _heads(x: Tensor, num_heads: int) -> Tensor:
    b, n, d = x.shape
    return x.view(b, n, num_heads, d // num_heads).transpose(1, 2)  # (B, H, L, Dh)


@torch.no_grad()
def attention_logits(model: nn.Module, batch: dict[str, Tensor]) -> list[LayerLogits]:
    """Per layer: the token-to-token, position, segment and full logits of `batch` (input_ids (B, L), optional
    attention_mask and token_type_ids). The model is run in eval mode (no dropout)."""
    encoder = encoder_of(model)
    was_training = encoder.training
    encoder.eval()
    try:
        hidden = layer_inputs(encoder, batch)
    finally:
        encoder.train(was_training)
    pe: PositionEncoding = encoder.positions
    length = batch["input_ids"].shape[1]
    pos = torch.arange(length, device=batch["input_ids"].device)
    ctx = pe.context(pos, pos, segment_ids_for(encoder, batch), starts=(0, 0))  # as the model's forward builds it
    out = []
    for i, (layer, h) in enumerate(zip(encoder.layers, hidden)):
        attn = layer.attention
        # the attention's own projections (Linformer included) and the equation's own logits
        q, k, _, _ = attn.project(h, key_padding=batch.get("attention_mask"))
        parts = equation_logits(q, k, pe.layer_terms(ctx, i), attn.scale)
        out.append(LayerLogits(parts.content, parts.of("position"), parts.of("segment"), parts.full))
    return out
