"""Multi-head attention with pluggable position terms and backends (Vaswani et al. 2017, §3.2.2), and
Linformer's length projection (Wang et al. 2020, eq. 7: keys (E X) W_K and values (F X) W_V, E, F ∈ R^{k×n}).

The module owns the projections only; what position contributes arrives as `LayerTerms`, built once per
forward by `dietpe.positions.encoding.PositionEncoding`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from dietpe.attention.backends import eager
from dietpe.attention.registry import resolve_backend
from dietpe.config import NEEDS_PROBABILITIES, DietConfig
from dietpe.positions.registry import REGISTRY
from dietpe.positions.terms import EMPTY, LayerTerms


class MultiHeadAttention(nn.Module):
    def __init__(self, config: DietConfig, linformer: bool = False):
        super().__init__()
        self.num_heads, self.head_size = config.num_attention_heads, config.head_size
        d = config.hidden_size
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.dropout_p = config.attention_probs_dropout_prob
        self.backend = resolve_backend(config.attn_backend, value_terms=config.position in NEEDS_PROBABILITIES,
                                       dropout=config.attention_probs_dropout_prob,
                                       method=REGISTRY[config.position])
        self.scale = 1.0 / math.sqrt(self.head_size)
        if linformer:
            # E, F: (k, n), shared by heads (Linformer's headwise sharing); sliced to the input length
            self.proj_k = nn.Parameter(torch.empty(config.linformer_k, config.max_position_embeddings))
            self.proj_v = nn.Parameter(torch.empty(config.linformer_k, config.max_position_embeddings))
        else:
            self.proj_k = self.proj_v = None

    def _heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_size).transpose(1, 2)  # (B, H, L, Dh)

    def keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """Project (B, Lk, D) to keys and values (B, H, Lk, Dh), e.g. for a decoder's cache."""
        return self._heads(self.key(source)), self._heads(self.value(source))

    def project(self, hidden: Tensor, keys_from: Tensor | None = None, key_padding: Tensor | None = None,
                past: tuple[Tensor, Tensor] | None = None, kv: tuple[Tensor, Tensor] | None = None):
        """Queries, keys and values (B, H, L, Dh) as the equation reads them: keys and values extended by the
        cache or, with Linformer, computed from the input projected along the length. Returns
        (q, k, v, (k, v) to cache)."""
        source = hidden if keys_from is None else keys_from
        q = self._heads(self.query(hidden))
        if self.proj_k is not None:
            k, v = self._projected(source, key_padding)
            return q, k, v, (k, v)
        k, v = kv if kv is not None else self.keys_values(source)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        return q, k, v, (k, v)

    def _projected(self, source: Tensor, key_padding: Tensor | None) -> tuple[Tensor, Tensor]:
        """Linformer's (E X) W_K + b_K and (F X) W_V + b_V (eq. 7, as fairseq's reference projects the layer's
        input): projecting the keys after their bias would scale b_K by E's row sums, a logit term per slot."""
        n = source.shape[1]
        if key_padding is not None:  # padded tokens must not leak into the projection
            source = source * key_padding[:, :, None].to(source.dtype)
        e, f = (p[:, :n].to(source.dtype) for p in (self.proj_k, self.proj_v))
        return (self._heads(self.key(torch.einsum("kn,bnd->bkd", e, source))),
                self._heads(self.value(torch.einsum("kn,bnd->bkd", f, source))))

    def forward(self, hidden: Tensor, terms: LayerTerms = EMPTY, mask: Tensor | None = None,
                keys_from: Tensor | None = None, key_padding: Tensor | None = None,
                past: tuple[Tensor, Tensor] | None = None, need_probs: bool = False,
                kv: tuple[Tensor, Tensor] | None = None):
        """hidden (B, Lq, D); keys_from (B, Lk, D) for cross-attention; key_padding (B, Lk) 1 = keep, used by
        Linformer, which cannot mask after projecting; past: cached (k, v) to extend when decoding;
        kv: keys and values already projected by `keys_values` (a decoder cache), used instead of projecting.
        Returns out (B, Lq, D), probs (B, H, Lq, Lk) or None, and the (k, v) to cache."""
        q, k, v, present = self.project(hidden, keys_from, key_padding, past, kv)
        if self.proj_k is not None:
            mask = None  # the projected keys are slots, not tokens: padding was zeroed before the projection
        dropout_p = self.dropout_p if self.training else 0.0
        backend = eager if need_probs else self.backend  # probabilities asked for: the reference computes them
        out, probs = backend(q, k, v, terms, mask, self.scale, dropout_p, need_probs)
        b, _, lq, _ = out.shape
        return out.transpose(1, 2).reshape(b, lq, -1), probs, present
