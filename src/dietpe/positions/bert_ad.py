"""BERT-A^d: TUPE's ablation with every correlation kept (Ke et al. 2021, §4.3, Table 1):

    α_ij = 1/√(4d) · ( (x_i W_Q)(x_j W_K)ᵀ + (x_i W_Q)(p_j U_K)ᵀ + (p_i U_Q)(x_j W_K)ᵀ + (p_i U_Q)(p_j U_K)ᵀ )
         = (x_i W_Q + p_i U_Q)(x_j W_K + p_j U_K)ᵀ / √(4d)

"based on BERT-A and uses different projection matrices for words and positions": the word-position and
position-word correlations of BERT's input positions (TUPE eq. 6) stay, but positions are projected by their
own U_Q, U_K. It differs from TUPE-A^tie-cls (`tupe-a:tupe_reset=false`) only by the two cross terms, which is
the comparison §4.3 makes. Positions enter attention, not the input; p is TUPE's: a learned table with layer
norm wherever it is used, and U_Q, U_K (D×D, split into heads) are shared by all layers, as in TUPE (appendix
B; the paper writes the ablation with TUPE's symbols and no other change). In the multi-head form d is the head
size. Entry points: qk (p_i U_Q added to the query, p_j U_K to the key) and score scale (1/2 on q'·k'/√d).
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from dietpe.positions.context import Built, Context
from dietpe.positions.method import PositionMethod, Traits, normal_parameter
from dietpe.positions.terms import LayerTerms


class AddPositions:
    """qk term: q + p_i U_Q, k + p_j U_K, per head."""

    def __init__(self, pq: Tensor, pk: Tensor):
        self.pq, self.pk = pq, pk  # (1|B, H, Lq, Dh), (1|B, H, Lk, Dh)

    def __call__(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q + self.pq.to(q.dtype), k + self.pk.to(k.dtype)


class BertAd(PositionMethod):
    name = "bert-ad"
    traits = Traits(entry=("qk",), learned_table=True, key_positions=True)
    table_name = "BERT-A^d's positional embeddings LN(p_i)"

    @classmethod
    def from_config(cls, c):
        return cls(c.hidden_size, c.num_attention_heads, c.max_position_embeddings, c.layer_norm_eps)

    def reference_logit(self, config, q, k, i, j, layer, head):
        dh = q.shape[-1]
        proj = lambda u, x: u(self.norm(x)).view(-1, dh)[head]  # noqa: E731  (p U) of one head
        return (q + proj(self.u_q, self.p[i])) @ (k + proj(self.u_k, self.p[j])) / math.sqrt(4 * dh)

    def __init__(self, hidden_size: int, num_heads: int, max_length: int, eps: float):
        super().__init__()
        self.max_length, self.num_heads, self.head_size = max_length, num_heads, hidden_size // num_heads
        self.p = normal_parameter(max_length, hidden_size)  # p_i
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.u_q = nn.Linear(hidden_size, hidden_size)
        self.u_k = nn.Linear(hidden_size, hidden_size)

    def _heads(self, pos: Tensor, proj: nn.Linear) -> Tensor:
        # positions (L,) or (B, L) -> (1|B, H, L, Dh)
        normed = self.norm(self.p[pos.view(-1, pos.shape[-1])])  # (1|B, L, D)
        return proj(normed).unflatten(-1, (self.num_heads, self.head_size)).transpose(-2, -3)

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        def build():  # p U shared by every layer: computed once per forward
            add = AddPositions(self._heads(ctx.q_pos, self.u_q), self._heads(ctx.k_pos, self.u_k))
            return LayerTerms(qk=[add], score_scale=0.5)  # 1/√(4d) = 1/2 · 1/√d

        return ctx.cached(Built(self), build)

    def draw(self, ctx: Context, layer: int) -> Tensor:
        """The position-to-position correlation (p_i U_Q)(p_j U_K)ᵀ / √(4d), (1|B, H, Lq, Lk): the part of the
        logits that depends on positions alone (the cross terms read the words)."""
        add = self.layer_terms(ctx, layer).qk[0]
        return add.pq @ add.pk.transpose(-1, -2) / math.sqrt(4 * self.head_size)

    def position_table(self, length: int) -> Tensor:
        return self.norm(self.p[:length])
