"""Position-only attention patterns, segment attention and position-embedding similarity: the numbers behind
DIET (Chen et al. 2021) Fig. 4 and 7 (learned positional attention), Fig. 6 (segment attention), Fig. 5
(cosine similarity of input position embeddings), and TUPE (Ke et al. 2021) Fig. 6 (positional correlation).

Every method draws itself (STYLE 11): the position pattern of layer l for length n is the method's
`draw(ctx, l)` on a Context of positions 0..n-1, with no tokens and no segments: the sum of its logit terms
that need no query. XLNet draws its terms at q = 0 (v·W_R R_{i-j}); Shaw's key term vanishes without a query.

Input-additive methods (absolute, sinusoidal) have no such term: position mixes with the tokens before the
embedding LayerNorm, and the split is not separable after it. We define their pattern as the first layer's
logits for an input made of position embeddings alone (token embeddings zero):

    pattern_0 = (LN(P) W_Q + b_Q)(LN(P) W_K + b_K)ᵀ / √d_h           LN = the embedding LayerNorm

DIET Fig. 8 draws P W_Q W_Kᵀ Pᵀ without LayerNorm or biases; both are products of n×d_h factors, so
Theorem 1's bound rank ≤ d_h holds for either. Deeper layers have no position-only pattern for these methods.
Rotary acts on q and k only and has no position-only pattern either.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dietpe.analysis.logits import _heads, encoder_of
from dietpe.positions.encoding import PositionEncoding


def _expand_heads(term: Tensor, num_heads: int) -> Tensor:
    """(1, H|1, Lq, Lk) -> (H, Lq, Lk): heads that share one table (sharing='head') are repeated."""
    return term[0].expand(num_heads, -1, -1)


@torch.no_grad()
def position_pattern(model: nn.Module, length: int) -> list[Tensor | None]:
    """Per layer: the position-only logits (H, n, n) for positions 0..length-1, or None where the method puts
    nothing position-only into that layer (see the module docstring for input-additive methods)."""
    encoder = encoder_of(model)
    pe: PositionEncoding = encoder.positions
    num_heads = encoder.layers[0].attention.num_heads
    pos = torch.arange(length, device=next(encoder.parameters()).device)
    ctx = pe.context(pos, pos, None, starts=(0, 0))
    out: list[Tensor | None] = []
    for i in range(len(encoder.layers)):
        drawn = pe.method.draw(ctx, i)  # each method draws itself
        out.append(None if drawn is None else _expand_heads(drawn.float(), num_heads))
    if all(p is None for p in out):
        table = pe.method.embed(pos[None])  # (1, n, D) or None
        if table is not None:
            out[0] = input_position_pattern(encoder, table)
    return out


def input_position_pattern(encoder: nn.Module, table: Tensor) -> Tensor:
    """(H, n, n): the first layer's logits when the input is the position embeddings `table` (1, n, D) alone."""
    attn = encoder.layers[0].attention
    h = encoder.embeddings.LayerNorm(table.to(encoder.embeddings.LayerNorm.weight.dtype))
    q, k = _heads(attn.query(h), attn.num_heads), _heads(attn.key(h), attn.num_heads)
    return ((q @ k.transpose(-1, -2)) * attn.scale)[0].float()


@torch.no_grad()
def segment_pattern(model: nn.Module, segment_ids: Tensor) -> list[Tensor] | None:
    """Per layer: the per-head segment term Ŝ[S(i), S(j)] (H, n, n) for `segment_ids` (n,), or None when the
    model has no per-head segments (DIET eq. 2)."""
    encoder = encoder_of(model)
    pe: PositionEncoding = encoder.positions
    if pe.head_segments is None:
        return None
    num_heads = encoder.layers[0].attention.num_heads
    segment_ids = segment_ids.to(next(encoder.parameters()).device)  # the model's device, as the table's
    pos = torch.arange(len(segment_ids), device=segment_ids.device)
    ctx = pe.context(pos, pos, segment_ids[None])
    out = []
    for i in range(len(encoder.layers)):
        term = pe.head_segments.layer_terms(ctx, i).logits[0].dense()
        out.append(_expand_heads(term.float(), num_heads))
    return out


def two_segments(length: int = 32, second_start: int = 16) -> Tensor:
    """DIET Fig. 6's input: `length` tokens, the second segment starting at `second_start`."""
    return (torch.arange(length) >= second_start).long()


# ---------------------------------------------------------------------------------------------------
# relative structure of a pattern
# ---------------------------------------------------------------------------------------------------
def offset_profile(pattern: Tensor) -> tuple[Tensor, Tensor]:
    """Mean of each diagonal of (..., n, n): (offsets i-j from -(n-1) to n-1, values (..., 2n-1)).

    For a Toeplitz pattern (DIET-REL, T5) this is the learned R_{i-j} itself; for an absolute one it is the
    average shift pattern.
    """
    n = pattern.shape[-1]
    offsets = torch.arange(-(n - 1), n)
    # diagonal(k) holds entries with j - i = k, i.e. offset i - j = -k
    values = torch.stack([pattern.diagonal(-int(o), dim1=-2, dim2=-1).mean(-1) for o in offsets], dim=-1)
    return offsets, values


def toeplitz_deviation(pattern: Tensor) -> Tensor:
    """(..., n, n) -> (...): the largest spread (max - min) along any diagonal. 0 exactly when the pattern
    depends on i - j only; compare it with the pattern's own range to judge how relative a head is."""
    n = pattern.shape[-1]
    spreads = [d.amax(-1) - d.amin(-1) for d in (pattern.diagonal(k, dim1=-2, dim2=-1) for k in range(-(n - 1), n))]
    return torch.stack(spreads, dim=-1).amax(-1)


# ---------------------------------------------------------------------------------------------------
# position embeddings (Fig. 5)
# ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def position_embeddings(model: nn.Module, length: int | None = None) -> Tensor | None:
    """The (n, D) absolute position embeddings a model has: the input-additive table (absolute, sinusoidal), or
    TUPE's p after the LayerNorm it is always used with. None for methods without one."""
    encoder = encoder_of(model)
    pe: PositionEncoding = encoder.positions
    table = pe.method.position_table(length or pe.max_length or 512)
    return None if table is None else table.detach().float()


def cosine_similarity_matrix(table: Tensor) -> Tensor:
    """(n, D) -> (n, n): cos(p_i, p_j)."""
    unit = nn.functional.normalize(table.double(), dim=-1)
    return (unit @ unit.T).float()


def position_cosine_similarity(table: Tensor) -> Tensor:
    """The cosine similarities of all pairs i < j of rows of `table` (n, D): DIET Fig. 5's distribution."""
    sim = cosine_similarity_matrix(table)
    i, j = torch.triu_indices(len(table), len(table), offset=1)
    return sim[i, j]

