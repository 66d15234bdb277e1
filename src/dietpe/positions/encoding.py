"""Builds a config's position and segment methods and merges their contributions per layer.

`PositionEncoding` is the one place a model asks "what does position add here?": `embed` for the input
entry point, `layer_terms` for attention. Which class serves which name is the registry
(`dietpe.positions.registry`); nothing downstream branches on the name.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig

from dietpe.errors import InputError, may_read, value_range
from dietpe.positions.absolute import LearnedAbsolute
from dietpe.positions.context import Context
from dietpe.positions.terms import LayerTerms
from dietpe.positions.registry import REGISTRY
from dietpe.positions.segments import InputSegments, PerHeadSegments


def check_length(position: str, length: int, limit: int, what: str = "sequence length ",
                 hint: str = "use shorter inputs or a relative method", error: type = InputError,
                 learned: bool | None = None) -> None:
    """The one length check: a method with a learned table (`learned_table` in the registry, or `learned`:
    a model with an input position table besides) serves at most `limit` (= max_position_embeddings)
    positions; any other accepts any length. The message names the value, the limit and the method; `what`
    prefixes the value (e.g. "max_length=", "--max-length ")."""
    learned = REGISTRY[position].learned_table if learned is None else learned
    if learned and length > limit:
        raise error(f"{what}{length} exceeds max_position_embeddings={limit}, the size of the learned position "
                    f"table of position={position!r}; {hint}")


class PositionEncoding(nn.Module):
    """The position method and the segment method of one stack of attention layers."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.method = REGISTRY[config.position].build(config)
        self.num_segments = config.type_vocab_size if config.segment != "none" else 0
        self.input_segments = (InputSegments(config.type_vocab_size, config.hidden_size)
                               if config.segment == "input" else None)
        self.head_segments = (PerHeadSegments(config.num_hidden_layers, config.num_attention_heads,
                                              config.type_vocab_size, config.sharing)
                              if config.segment == "per-head" else None)
        # BERT's learned input table besides a per-head method (DIET Fig. 5; kept from a BERT checkpoint)
        self.input_positions = (LearnedAbsolute(config.max_position_embeddings, config.hidden_size)
                                if getattr(config, "input_positions", False) else None)
        for method in (self.method, self.head_segments):  # logit-unit tables: stored over the config's scale
            if method is not None:
                method.logit_scale = float(getattr(config, "logit_scale", 1.0))
        self.projected_keys = config.attention == "linformer"
        self.position_name = config.position

    @property
    def max_length(self) -> int | None:
        """The longest input the learned tables (the method's, an input table besides) serve; None: any."""
        limits = [m.max_length for m in (self.method, self.input_positions) if m is not None and m.max_length]
        return min(limits) if limits else None

    def check(self, length: int, segment_ids: Tensor | None, positions: Tensor | None = None) -> None:
        """Refuse inputs the learned tables cannot serve, naming the value and the limit. `positions`: the
        caller's own position ids (else 0 .. length-1). While compiling only what needs no look at the data
        is checked (reading it would break the graph)."""
        if self.max_length is not None and positions is None:
            hint = ("use shorter inputs or a relative method" if self.method.max_length else
                    "the input position table (input_positions=True) ends there; use shorter inputs")
            check_length(self.position_name, length, self.max_length, hint=hint, learned=True)
        if torch.compiler.is_compiling():
            return
        if self.max_length is not None and positions is not None and positions.numel() and may_read(positions):
            lo, hi = value_range(positions)
            if lo < 0 or hi >= self.max_length:
                raise InputError(
                    f"position_ids must lie in [0, {self.max_length - 1}] for position={self.position_name!r}, "
                    f"whose learned table has max_position_embeddings={self.max_length} rows; got "
                    f"{lo if lo < 0 else hi}")
        # with segment='none' segment ids carry nothing and are ignored
        if self.num_segments and segment_ids is not None and segment_ids.numel() and may_read(segment_ids):
            lo, hi = value_range(segment_ids)
            if lo < 0 or hi >= self.num_segments:
                raise InputError(f"token_type_ids must lie in [0, {self.num_segments - 1}] (type_vocab_size="
                                 f"{self.num_segments}), got {lo if lo < 0 else hi}")

    def positions(self, position_ids: Tensor | None, batch: int, length: int,
                  device: torch.device) -> tuple[Tensor, Tensor]:
        """The positions of a forward: (for the context: (L,) shared by the batch or (B, L) per example,
        for the input entry point: (1|B, L)). Default 0 .. L-1; else the caller's `position_ids`, of shape
        (L,), (1, L) or (B, L), checked against the learned tables."""
        if position_ids is None:
            pos = torch.arange(length, device=device)
            return pos, pos[None]
        if not isinstance(position_ids, Tensor) or position_ids.dtype.is_floating_point or \
                position_ids.dtype == torch.bool or position_ids.is_complex():
            kind = position_ids.dtype if isinstance(position_ids, Tensor) else type(position_ids).__name__
            raise InputError(f"position_ids must be an integer tensor, got {kind}")
        shape = tuple(position_ids.shape)
        if shape not in ((length,), (1, length), (batch, length)):
            raise InputError(f"position_ids has shape {shape}, but the input is (batch={batch}, length={length}): "
                             f"give ({length},), (1, {length}) or ({batch}, {length})")
        position_ids = position_ids.to(device).view(-1, length)  # (1|B, L)
        self.check(length, None, position_ids)
        # one row (or a batch of one) is shared: the fast paths for shared positions apply
        pos = position_ids[0] if position_ids.shape[0] == 1 else position_ids
        return pos, position_ids

    def embed(self, position_ids: Tensor, segment_ids: Tensor | None) -> Tensor | None:
        """Input entry point: the sum of what position and segments add to the token embeddings."""
        out = self.method.embed(position_ids)
        if self.input_positions is not None:
            table = self.input_positions.embed(position_ids)
            out = table if out is None else out + table
        if self.input_segments is not None and segment_ids is not None:
            seg = self.input_segments.embed(segment_ids)
            out = seg if out is None else out + seg.to(out.dtype)
        return out

    def context(self, q_pos: Tensor, k_pos: Tensor, segments: Tensor | None,
                k_segments: Tensor | None = None, starts: tuple[int, int] | None = None) -> Context:
        """q_pos, k_pos: (Lq,), (Lk,) shared by the batch, or (B, Lq), (B, Lk) per example. starts: (q0, k0)
        when the caller knows q_pos = q0, q0+1, ... and k_pos = k0, k0+1, ... (see `Context`)."""
        head_segments = segments if self.head_segments is not None else None
        k_seg = (k_segments if k_segments is not None else segments) if self.head_segments is not None else None
        q_start, k_start = starts if starts is not None else (None, None)
        return Context(q_pos, k_pos, head_segments, k_seg, self.projected_keys, q_start, k_start)

    def layer_terms(self, ctx: Context, layer: int) -> LayerTerms:
        terms = self.method.layer_terms(ctx, layer)
        if self.head_segments is not None:
            terms = terms.merge(self.head_segments.layer_terms(ctx, layer))
        return terms
