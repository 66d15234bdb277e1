"""T5 relative attention bias (Raffel et al. 2020, §2.1; DIET companion eq. 4):

    A_ij = q_i·k_j / √d_h + b_h[bucket(j - i)]

one scalar per bucket per head, shared by all layers, log buckets (32 buckets by default; the max distance,
beyond which every offset shares the last bucket, by default half the model's length and at most T5's 128,
see `t5_range`):
bidirectional in an encoder, unidirectional (all buckets for j <= i) in causal self-attention, as T5's
decoder does (`causal`, from the config). b is stored over `logit_scale` (dietpe.positions.method), as
x-transformers stores its T5 table over √d_h. Entry point: logit bias, computed once per forward for the whole
model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dietpe.errors import ConfigError
from dietpe.positions.context import Built, CacheKey, Context
from dietpe.positions.functional import relative_offsets, t5_bucket, t5_causal_bucket
from dietpe.positions.fields import Field, optional_positive_int, positive_int
from dietpe.positions.method import KeptTerm, PositionMethod, Traits, causal, normal_parameter, refill_logit
from dietpe.positions.terms import LayerTerms, TableBias

T5_NUM_BUCKETS = Field("t5_num_buckets", 32, positive_int, "T5's number of log buckets per direction pair")
T5_MAX_DISTANCE = Field("t5_max_distance", None, optional_positive_int,
                        "offsets beyond it share T5's last bucket (None: half the model's length, at most 128)")
#: T5's own range (Raffel et al. 2020), for its 512-token inputs
T5_RANGE = 128


def check_t5_buckets(config) -> None:
    """T5's log buckets need exact buckets below the log ones and a range beyond them: each direction's
    num_buckets/2 buckets (all num_buckets in causal attention) are half exact, for |d| < that half, and the
    log spacing divides by log(max_distance / that half)."""
    n, far, one_way = config.t5_num_buckets, t5_range(config), causal(config)
    exact = n // 2 if one_way else n // 4
    if exact < 1:
        raise ConfigError(f"t5_num_buckets={n} leaves no exact bucket; use at least {2 if one_way else 4}")
    if far <= exact:
        raise ConfigError(f"the T5 max distance {far} (t5_max_distance, or its default from the model's length) "
                          f"must exceed the {exact} exact buckets of t5_num_buckets={n}"
                          f"{' in causal attention' if one_way else ''}; raise it or use fewer buckets")


def t5_range(config) -> int:
    """The max distance: `t5_max_distance`, or half of `max_position_embeddings` capped at T5's 128 (and at
    least the bucket count, which the log buckets need). T5 chose 128 for 512-token inputs: the last bucket,
    reused for every longer distance, lies well inside the training length and is trained by many pairs. A
    range at the length itself leaves that bucket to the few longest pairs, and beyond the training length
    the model then leans on a bias it never learned (docs/parametrization.md, "Flat to 8L")."""
    if config.t5_max_distance is not None:
        return config.t5_max_distance
    return min(T5_RANGE, max(config.t5_num_buckets, config.max_position_embeddings // 2))


def t5_bucket_reference(memory_minus_query: int, config) -> int:
    """HF's own T5 bucket function, an independent reference; unidirectional when the stack is causal."""
    from transformers.models.t5.modeling_t5 import T5Attention  # loaded by the references alone

    return int(T5Attention._relative_position_bucket(torch.tensor(memory_minus_query), not causal(config),
                                                     config.t5_num_buckets, t5_range(config)))


def t5_offset_bucket(num_buckets: int, max_distance: int, causal: bool = False):
    """Offset i - j -> T5 bucket; T5 buckets memory - query = pos_j - pos_i. causal: the unidirectional
    buckets of T5's decoder."""
    bucket = t5_causal_bucket if causal else t5_bucket
    return lambda offsets: bucket(-offsets, num_buckets, max_distance)


@dataclass(frozen=True)
class T5Index(CacheKey):
    """(1|B, Lq, Lk) T5 bucket of each query-key pair (shared by T5 and TUPE-R)."""

    num_buckets: int
    max_distance: int
    causal: bool


@dataclass(frozen=True)
class T5Diagonals(CacheKey):
    """(Lq + Lk - 1,) T5 bucket of each offset i - j along the diagonals, or None."""

    num_buckets: int
    max_distance: int
    causal: bool


def t5_index(ctx: Context, num_buckets: int, max_distance: int, causal: bool = False) -> Tensor:
    """(1|B, Lq, Lk) bucket of each query-key pair."""
    return ctx.cached(T5Index(num_buckets, max_distance, causal), lambda: t5_offset_bucket(
        num_buckets, max_distance, causal)(relative_offsets(ctx.q_pos, ctx.k_pos)))


def t5_diagonals(ctx: Context, num_buckets: int, max_distance: int, causal: bool = False) -> Tensor | None:
    """(Lq + Lk - 1,) bucket of each offset i - j along the diagonals (see TableBias), or None."""

    def build():
        offsets = ctx.diagonal_offsets()
        return None if offsets is None else t5_offset_bucket(num_buckets, max_distance, causal)(offsets)

    return ctx.cached(T5Diagonals(num_buckets, max_distance, causal), build)


class T5(PositionMethod):
    name = "t5"
    traits = Traits(entry=("logits",), key_positions=True, relative=True, paper_row="t5", tile_terms=True)
    fields = (T5_NUM_BUCKETS, T5_MAX_DISTANCE)
    logit_parameters = ("bias",)

    @classmethod
    def from_config(cls, c):
        return cls(c.num_attention_heads, c.t5_num_buckets, t5_range(c), causal(c))

    @classmethod
    def check_config(cls, c) -> None:
        check_t5_buckets(c)

    def reference_logit(self, config, q, k, i, j, layer, head):
        bias = self.logit("bias")[head, t5_bucket_reference(j - i, config)]
        return super().reference_logit(config, q, k, i, j, layer, head) + bias

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int, causal: bool = False):
        super().__init__()
        self.num_buckets, self.max_distance, self.causal = num_buckets, max_distance, causal
        self.bias = normal_parameter(num_heads, num_buckets)  # b_h, shared by layers

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        # one TableBias object for all layers (its dense form built once per forward), kept between inference
        # forwards: its buckets are functions of the positions, its values a buffer refilled from b
        return ctx.cached(Built(self), lambda: self.kept_forward(ctx, (self.bias,), lambda: self._term(ctx))).terms

    def _term(self, ctx: Context) -> KeptTerm:
        n, dist, causal = self.num_buckets, self.max_distance, self.causal
        values = self.logit("bias")
        term = self.keep(ctx, "t5", (self.bias,), TableBias(
            values, ctx.q_pos, ctx.k_pos, t5_offset_bucket(n, dist, causal), lambda: t5_index(ctx, n, dist, causal),
            diagonals=t5_diagonals(ctx, n, dist, causal), reach=dist, runs=ctx.runs()))
        bias, scale = self.bias, self.logit_scale  # not the module, which keeps this: no cycle
        return KeptTerm(term, lambda: refill_logit(values, bias, scale),
                        index=lambda c: (lambda: t5_index(c, n, dist, causal)))
