"""TUPE Fig. 2 (Ke et al. 2021, eq. 6): the first layer's content logits of a model with positions added at the
input, split into its four correlations:

    α_ij = (w_i W_Q)(w_j W_K)ᵀ/√d + (w_i W_Q)(p_j W_K)ᵀ/√d + (p_i W_Q)(w_j W_K)ᵀ/√d + (p_i W_Q)(p_j W_K)ᵀ/√d
           word-to-word          word-to-position         position-to-word         position-to-position

BERT normalises the sum e = w + p (+ the segment embedding) before the first layer. LN(e) = γ ⊙ (e − μ(e)) / σ(e)
+ β is linear in e once the token's σ(e) is fixed, so it splits exactly: x_w = γ ⊙ (w − μ(w)) / σ + β (the
token, its input segment and the norm's shift) and x_p = γ ⊙ (p − μ(p)) / σ, with σ = σ(e) of the token. The
queries and keys split alike, each projection's bias going with the word, and the four terms add up to the
layer's content logits exactly (tests/analysis/test_correlations.py holds them to `attention_logits`). The
paper finds the middle two nearly uniform: words and absolute positions hardly correlate.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dietpe.analysis.logits import encoder_of, segment_ids_for

TERMS = ("word-to-word", "word-to-position", "position-to-word", "position-to-position")


def has_input_positions(model: nn.Module) -> bool:
    """Whether positions are added to the token embeddings (BERT's table, sinusoids, or a table kept beside a
    per-head method) and the first layer reads plain queries and keys: the models eq. 6 describes."""
    encoder = encoder_of(model)
    pe = encoder.positions
    config = encoder.config
    pos = torch.arange(2, device=next(encoder.parameters()).device)
    if getattr(config, "attention", "full") != "full" or pe.embed(pos[None], None) is None:
        return False
    return not pe.layer_terms(pe.context(pos, pos, None, starts=(0, 0)), 0).qk


def _heads(x: Tensor, num_heads: int) -> Tensor:
    b, n, d = x.shape
    return x.view(b, n, num_heads, d // num_heads).transpose(1, 2)  # (B, H, L, Dh)


@torch.no_grad()
def four_correlations(model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """TERMS -> (B, H, L, L): the first layer's four correlations for `batch` (input_ids (B, L), optional
    token_type_ids), positions 0 .. L-1, in eval mode. Their sum is the layer's content logits."""
    encoder = encoder_of(model)
    if not has_input_positions(model):
        raise ValueError(f"position={encoder.config.position!r} adds no positions at the input (or its first "
                         f"layer transforms queries and keys): TUPE's eq. 6 has no four terms to split")
    ids = batch["input_ids"]
    pe, emb, attn = encoder.positions, encoder.embeddings, encoder.layers[0].attention
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    segments = segment_ids_for(encoder, batch)
    word = emb.word_embeddings(ids)  # (B, L, D)
    if pe.input_segments is not None and segments is not None:
        word = word + pe.input_segments.embed(segments)
    pos = pe.embed(positions, None).to(word.dtype).expand_as(word)  # the input position terms alone
    norm = emb.LayerNorm
    e = word + pos
    sigma = (e.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    x_w = norm.weight * (word - word.mean(-1, keepdim=True)) / sigma + norm.bias
    x_p = norm.weight * (pos - pos.mean(-1, keepdim=True)) / sigma
    h = attn.num_heads
    q = {"word": _heads(attn.query(x_w), h), "position": _heads(x_p @ attn.query.weight.T, h)}
    k = {"word": _heads(attn.key(x_w), h), "position": _heads(x_p @ attn.key.weight.T, h)}
    ctx = pe.context(positions[0], positions[0], segments, starts=(0, 0))
    scale = attn.scale * pe.layer_terms(ctx, 0).score_scale
    return {f"{a}-to-{b}": q[a] @ k[b].transpose(-1, -2) * scale
            for a, b in (("word", "word"), ("word", "position"), ("position", "word"), ("position", "position"))}


def spread(terms: dict[str, Tensor]) -> dict[str, dict[str, float]]:
    """Per term: its mean, and its standard deviation over the (i, j) pairs of a sequence and head (averaged
    over sequences and heads): how much it can move attention from one key to another."""
    return {name: {"mean": float(t.mean()), "std": float(t.flatten(-2).std(-1).mean())} for name, t in terms.items()}
