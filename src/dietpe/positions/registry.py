"""The position methods, one entry each: how a method is built from a config and what it is.

DIET (Chen et al. 2021) and TUPE (Ke et al. 2021) sort methods by *where* position enters; every fact of that
kind lives here, once, as a trait of the method, and everything else reads it: `DietConfig` validation
(learned tables, Linformer, sharing, backends), the backend choice, the pipeline's default segments and the
papers' list of methods, `dietpe bench` and the tests' matrices. Adding a method is one file under
`dietpe/positions/`, one entry below, and its paper-equation reference in tests/positions/test_references.py.

Traits:
    entry           the entry points it contributes to: input, qk, logits, values (dietpe.positions.base)
    learned_table   a table indexed by absolute position: positions beyond max_position_embeddings are refused
    key_positions   needs each key's position (relative or untied terms): impossible after Linformer's projection
    probabilities   a value term reads the attention probabilities: only the eager backend serves it
    query_terms     its logit term reads the query (Shaw's key term, XLNet): built per layer and batch
    relative        its terms depend on positions only through pos_i - pos_j: a shift of all positions changes
                    nothing (the tests hold every such method to it)
    shareable       DIET's per-head tables, which `sharing` applies to (DIET Tables 5, 8, 9)
    segment         the segment mode of its row in DIET's tables (DIET rows: per head, eq. 2; others: input)
    paper_row       its spec in the papers' comparison (DIET Table 2 rows, plus rotary and ALiBi), or None
    causal_ok       meaningful in causal self-attention (a decoder-only LM, `DietCausalConfig`); the causal
                    LM refuses the others when its config is built
    cls_reset       resets the terms of position 0 as [CLS]'s (TUPE's reset_θ): an encoder's device, refused
                    in a causal LM unless switched off (tupe_reset=False)

Builders read `causal(config)`: whether the stack being built attends causally (the causal LM, the
translation decoder). T5's buckets (also inside TUPE-R) are then T5's decoder's unidirectional ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from dietpe.positions.absolute import LearnedAbsolute, NoPosition, Sinusoidal
from dietpe.positions.alibi import ALiBi
from dietpe.positions.diet import DietAbs, DietRel
from dietpe.positions.kerple import Kerple
from dietpe.positions.method import PositionMethod
from dietpe.positions.rotary import Rotary
from dietpe.positions.shaw import Shaw
from dietpe.positions.t5 import T5
from dietpe.positions.tupe import TUPE
from dietpe.positions.xlnet import XLNet

if TYPE_CHECKING:
    from dietpe.config import DietConfig

ENTRY_POINTS = ("input", "qk", "logits", "values")


@dataclass(frozen=True)
class MethodInfo:
    name: str
    build: Callable[["DietConfig"], PositionMethod]
    entry: tuple[str, ...]
    learned_table: bool = False
    key_positions: bool = False
    probabilities: bool = False
    query_terms: bool = False
    relative: bool = False
    shareable: bool = False
    segment: str = "input"
    paper_row: str | None = None
    causal_ok: bool = True
    cls_reset: bool = False

    @property
    def per_head(self) -> bool:
        """Position enters attention itself (qk, logits or values), not the token embeddings."""
        return any(e != "input" for e in self.entry)


def causal(c: "DietConfig") -> bool:
    """Whether the stack built from `c` attends causally: a `DietCausalConfig`, or the translation decoder's
    view of its config (`DietSeq2SeqConfig.decoder_view`)."""
    return bool(getattr(c, "causal", False))


def _tupe(c: "DietConfig", relative: bool) -> TUPE:
    return TUPE(c.hidden_size, c.num_attention_heads, c.max_position_embeddings, c.layer_norm_eps,
                c.tupe_reset, relative, c.t5_num_buckets, c.t5_max_distance, causal(c))


REGISTRY: dict[str, MethodInfo] = {m.name: m for m in (
    MethodInfo("none", lambda c: NoPosition(), (), relative=True),
    MethodInfo("absolute", lambda c: LearnedAbsolute(c.max_position_embeddings, c.hidden_size), ("input",),
               learned_table=True, paper_row="absolute"),
    MethodInfo("sinusoidal", lambda c: Sinusoidal(c.hidden_size, c.position_scale), ("input",), paper_row="sinusoidal"),
    MethodInfo("shaw", lambda c: Shaw(c.num_hidden_layers, c.head_size, c.shaw_max_distance), ("logits", "values"),
               key_positions=True, probabilities=True, query_terms=True, relative=True, paper_row="shaw"),
    MethodInfo("xlnet", lambda c: XLNet(c.num_hidden_layers, c.hidden_size, c.num_attention_heads),
               ("qk", "logits"), key_positions=True, query_terms=True, relative=True, paper_row="xlnet"),
    MethodInfo("t5", lambda c: T5(c.num_attention_heads, c.t5_num_buckets, c.t5_max_distance, causal(c)),
               ("logits",), key_positions=True, relative=True, paper_row="t5"),
    MethodInfo("tupe-a", lambda c: _tupe(c, relative=False), ("logits",), learned_table=True, key_positions=True,
               paper_row="tupe-a", cls_reset=True),
    MethodInfo("tupe-r", lambda c: _tupe(c, relative=True), ("logits",), learned_table=True, key_positions=True,
               paper_row="tupe-r", cls_reset=True),
    MethodInfo("diet-abs", lambda c: DietAbs(c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings,
                                             c.rank, c.sharing, c.linformer_k if c.attention == "linformer" else None),
               ("logits",), learned_table=True, shareable=True, segment="per-head",
               paper_row="diet-abs:sharing=layer"),
    MethodInfo("diet-rel", lambda c: DietRel(c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings,
                                             c.sharing, getattr(c, "diet_rel_max_distance", None)),
               ("logits",), key_positions=True, relative=True, shareable=True, segment="per-head",
               paper_row="diet-rel"),
    MethodInfo("rotary", lambda c: Rotary(c.head_size, c.rotary_base), ("qk",), key_positions=True, relative=True,
               paper_row="rotary"),
    MethodInfo("alibi", lambda c: ALiBi(c.num_attention_heads), ("logits",), key_positions=True, relative=True,
               paper_row="alibi"),
    MethodInfo("kerple", lambda c: Kerple(c.num_attention_heads), ("logits",), key_positions=True, relative=True),
)}


def names(**traits) -> tuple[str, ...]:
    """The methods with the given trait values, e.g. names(learned_table=True), in registry order."""
    return tuple(n for n, m in REGISTRY.items() if all(getattr(m, k) == v for k, v in traits.items()))
