"""The fused attention kernel (`attention.py`: the one attention equation, FlashAttention-2's tiling) as two
torch custom operators, forward and backward, with their shapes for tracing and the autograd rule between them:
how `torch.compile` (full graph included) takes a model whose attention is `attn_backend="fused"`.

Why custom operators: dynamo cannot trace Triton's launcher (it reads `UntypedStorage.data_ptr`), so the
kernel's autograd Function breaks the graph, and a full-graph compile fails. An operator is opaque to the
compiler: it records the call with the shapes `register_fake` gives and runs the kernels as in eager mode
(the autotuner's choice, the same bits). Eager mode keeps the autograd Function, which skips the operator's
dispatch per call. Attention dropout's Philox seed is drawn inside the operator on q's device, as the eager path
draws it, and handed to the backward as that tensor.

The operators take q, k, v, the output and its gradient token-major, (B, L, H, D), and return the output and
q, k, v's gradients contiguous so (the kernels read and write any strides): as FlashAttention's operators do,
so the heads merge back into (B, L, H·D) by a view, and the outputs' strides never depend on the inputs' (which
the compiler may trace with other strides than it runs them with).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dietpe.attention.kernels.attention import (Extras, attention_backward, attention_forward, dropout_seed,
                                                folded_inputs, kernel_inputs, pack_pieces)

NAMESPACE = "dietpe"
_EMPTY = (0,)


def _extras(q_keep, k_keep, q_segments, k_segments, mask, den, kinks, slope, intercept, q2, k2, causal: bool,
            dropout: float, seed: int) -> Extras:
    ex = Extras(q_keep=q_keep, k_keep=k_keep, q_segments=q_segments, k_segments=k_segments, mask=mask,
                causal=causal, dropout=dropout, seed=seed, q2=q2, k2=k2, token_major=True)  # as the fakes
    if den is not None:
        ex.den = den
        ex.pieces, ex.slots = pack_pieces(kinks, slope, intercept)
        ex.n_pieces = slope.shape[0]
    return ex


@torch.library.custom_op(f"{NAMESPACE}::fused_attention", mutates_args=())
def fused_forward(q: Tensor, k: Tensor, v: Tensor, table: Tensor | None, segments: Tensor | None,
                  q_keep: Tensor | None, k_keep: Tensor | None, q_segments: Tensor | None,
                  k_segments: Tensor | None, mask: Tensor | None, den: Tensor | None, kinks: Tensor | None,
                  slope: Tensor | None, intercept: Tensor | None, q2: Tensor | None, k2: Tensor | None,
                  scale: float, causal: bool, dropout: float) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (B, L, H, D): (out (B, Lq, H, Dv) contiguous, the log-sum-exp (B, H, Lq), the dropout seed: one int64
    on q's device, drawn as the eager path draws it)."""
    seed = dropout_seed(dropout, q) if dropout > 0 else torch.zeros(1, dtype=torch.int64, device=q.device)
    ex = _extras(q_keep, k_keep, q_segments, k_segments, mask, den, kinks, slope, intercept, q2, k2, causal,
                 dropout, seed)
    out, lse = attention_forward(*_heads(q, k, v), scale, table, segments, ex)
    return out.transpose(1, 2), lse, seed


def _heads(*xs: Tensor) -> tuple[Tensor, ...]:
    """(B, L, H, D) as the kernels' (B, H, L, D): views."""
    return tuple(x.transpose(1, 2) for x in xs)


@fused_forward.register_fake
def _(q, k, v, table, segments, q_keep, k_keep, q_segments, k_segments, mask, den, kinks, slope, intercept, q2,
      k2, scale, causal, dropout):
    b, lq, h, _ = q.shape
    out = q.new_empty(b, lq, h, v.shape[-1], dtype=v.dtype)
    return out, q.new_empty(b, h, lq, dtype=torch.float32), q.new_empty(1, dtype=torch.int64)


@torch.library.custom_op(f"{NAMESPACE}::fused_attention_backward", mutates_args=())
def fused_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, table: Tensor | None,
                   segments: Tensor | None, q_keep: Tensor | None, k_keep: Tensor | None,
                   q_segments: Tensor | None, k_segments: Tensor | None, mask: Tensor | None, den: Tensor | None,
                   kinks: Tensor | None, slope: Tensor | None, intercept: Tensor | None, q2: Tensor | None,
                   k2: Tensor | None, seed: Tensor, scale: float, causal: bool, dropout: float, table_grad: bool,
                   segments_grad: bool) -> list[Tensor]:
    """do, q, k, v, out (B, L, H, D): [dq, dk, dv (B, L, H, D) contiguous, d table, d segments, d den, d slope,
    d intercept, d q2, d k2]; an empty tensor where none is asked for or absent."""
    ex = _extras(q_keep, k_keep, q_segments, k_segments, mask, den, kinks, slope, intercept, q2, k2, causal,
                 dropout, seed)  # read by the kernels on the device: no copy to the host
    dq, dk, dv, d_table, d_segments, d_pieces, d_second = attention_backward(
        *_heads(do, q, k, v, out), lse, scale, table, segments, ex, table_grad, segments_grad)
    grads = [d_table, d_segments, *(d_pieces if d_pieces is not None else (None, None, None)),
             *(d_second if d_second is not None else (None, None))]
    return [*_heads(dq, dk, dv), *(g if g is not None else q.new_empty(_EMPTY) for g in grads)]


def _gradient_shapes(q, table, segments, den, slope, q2, k2, table_grad: bool,
                     segments_grad: bool) -> list[tuple | None]:
    """Shapes of the tables' and folded factors' gradients the backward returns (None: an empty tensor)."""
    pieces = table_grad and den is not None
    return [tuple(table.shape) if table is not None and table_grad else None,
            tuple(segments.shape) if segments is not None and segments_grad else None,
            tuple(den.shape) if pieces else None, *((tuple(slope.shape),) * 2 if pieces else (None, None)),
            *((tuple(q2.shape), tuple(k2.shape)) if q2 is not None else (None, None))]


@fused_backward.register_fake
def _(do, q, k, v, out, lse, table, segments, q_keep, k_keep, q_segments, k_segments, mask, den, kinks, slope,
      intercept, q2, k2, seed, scale, causal, dropout, table_grad, segments_grad):
    shapes = _gradient_shapes(q, table, segments, den, slope, q2, k2, table_grad, segments_grad)
    dtypes = [torch.float32] * 5 + [q2.dtype if q2 is not None else q.dtype, k2.dtype if k2 is not None else q.dtype]
    tables = [q.new_empty(s if s is not None else _EMPTY, dtype=t if s is not None else q.dtype)
              for s, t in zip(shapes, dtypes)]
    # contiguous (B, L, H, D), whatever q, k, v's strides: as the kernels write them here (`Extras.token_major`)
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), *tables]


_INPUTS = ("q", "k", "v", "table", "segments", "q_keep", "k_keep", "q_segments", "k_segments", "mask", "den",
           "kinks", "slope", "intercept", "q2", "k2")


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:len(_INPUTS)], output[0], output[1], output[2])
    ctx.scale, ctx.causal, ctx.dropout = inputs[len(_INPUTS):]


def _backward(ctx, do, _dlse, _dseed):
    saved = ctx.saved_tensors
    q, k, v, table, segments, q_keep, k_keep, q_segments, k_segments, mask, den, kinks, slope, intercept, q2, k2 = \
        saved[:len(_INPUTS)]
    out, lse, seed = saved[len(_INPUTS):]
    needs = dict(zip(_INPUTS, ctx.needs_input_grad))
    table_grad = needs["table"] or (den is not None and (needs["den"] or needs["slope"] or needs["intercept"]))
    grads = fused_backward(do.contiguous(), q, k, v, out, lse, table, segments, q_keep, k_keep, q_segments,
                           k_segments, mask, den, kinks, slope, intercept, q2, k2, seed, ctx.scale, ctx.causal,
                           ctx.dropout, table_grad, needs["segments"])
    by_name = dict(zip(("q", "k", "v", "table", "segments", "den", "slope", "intercept", "q2", "k2"), grads))
    return (*(by_name.get(n) if needs[n] else None for n in _INPUTS), None, None, None)


fused_forward.register_autograd(_backward, setup_context=_setup)


def fused_attention_op(q: Tensor, k: Tensor, v: Tensor, scale: float, table: Tensor | None = None,
                       segments: Tensor | None = None, extras: Extras | None = None,
                       pieces: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
                       folded: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """`attention.fused_attention` through the operators, for torch.compile (the same arguments); the seed in
    `extras` is ignored: the operator draws its own."""
    extras = extras or Extras()
    q, k, v, table, segments, pieces = kernel_inputs(q, k, v, table, segments, pieces)
    den, kinks, slope, intercept = pieces if pieces is not None else (None, None, None, None)
    q2, k2 = folded_inputs(q, folded)
    ex = extras
    out, _, _ = fused_forward(*_heads(q, k, v), table, segments, ex.q_keep, ex.k_keep, ex.q_segments, ex.k_segments,
                              ex.mask, den, kinks, slope, intercept, q2, k2, scale, ex.causal, ex.dropout)
    return out.transpose(1, 2)  # (B, H, Lq, Dv), token-major
