"""Method specs: one model variant as a string, `position[:segment=..][:sharing=..][:field=value]`.

`diet-rel`, `diet-rel:segment=input:sharing=layer` and `diet-abs:position_rank=128` name a `DietConfig`'s
position fields; the pipeline (`dietpe pretrain --method`, `dietpe compare --methods`, `dietpe translate train
--method`) and the bench read them here. The papers' list of methods and each method's default segment mode
come from the registry (`dietpe.positions.registry`). The bench's row labels are specs too: `+seg` is
segment=per-head and `@backend` attn_backend=backend.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from dietpe.config import DietConfig
from dietpe.errors import ConfigError
from dietpe.positions.registry import REGISTRY

# Every registered method at its row in the papers' comparison (the registry's `paper_row`: DIET's and TUPE's
# methods, plus XLNet, rotary, ALiBi that the project adds); DIET rows with per-head segments.
REGISTRY_METHODS = tuple(m.paper_row for m in REGISTRY.values() if m.paper_row)

# The papers' tables, row by row, each spec as the paper describes the row (docs/recipes.md names the sentence
# behind every field; tests/test_paper_rows.py pins them). At bert-base d_h = 64, so "d_p = 64" is the default
# rank, written out. The Linformer rows: "Linformer (Wang et al., 2020) with a projection dimension of 32" (§4.1);
# the rows' "d_p = 32" is that k for Wang et al.'s row, and for DIET-ABS-LIN also the rank of P_Q P_Kᵀ, the
# symbol's meaning in every other row. Segments: Linformer's projected keys take input segments only.
LINFORMER_METHODS = (
    "absolute:attention=linformer:linformer_k=32",                                   # Wang et al. (2020) (d_p=32)
    "diet-abs:attention=linformer:linformer_k=32:position_rank=32:segment=input",   # DIET-ABS-LIN (d_p=32)
)
# DIET Table 2 (and 3: the same rows) and Table 4's Vaswani et al. row.
PAPER_METHODS = (
    "absolute",                                     # Devlin et al. (2018): input / input
    "shaw:shaw_max_distance=1024",                  # Shaw et al. (2018): per-head / input (the range: Table 6)
    "t5",                                           # Raffel et al. (2020): per-head / input
    "tupe-r",                                       # Ke et al. (2020): absolute and relative, per-head / input
    "diet-rel:segment=input",                       # DIET-REL: per-head / input
    "diet-rel",                                     # DIET-REL: per-head / per-head
    "diet-abs:position_rank=128:sharing=layer",     # DIET-ABS (d_p=128, share): per-head / per-head
    *LINFORMER_METHODS,
    "sinusoidal",                                   # Vaswani et al. (2017), Table 4 (translation)
)
# DIET Table 5 (XTREME ablation): sharing x segment for DIET-REL; DIET-ABS's rank d_p 64 to 512.
TABLE5_METHODS = (
    "diet-rel:segment=input", "diet-rel:segment=input:sharing=head", "diet-rel:segment=input:sharing=layer",
    "diet-rel", "diet-rel:sharing=head", "diet-rel:sharing=layer",
    "diet-abs:position_rank=64:segment=input", "diet-abs:position_rank=64", "diet-abs:position_rank=128",
    "diet-abs:position_rank=512",
    "diet-abs:position_rank=64:segment=input:sharing=layer", "diet-abs:position_rank=64:sharing=layer",
    "diet-abs:position_rank=128:sharing=layer", "diet-abs:position_rank=256:sharing=layer",
    "diet-abs:position_rank=512:sharing=layer",
)
# DIET Table 8 (appendix D, GLUE): position and segment, input against per-head.
TABLE8_METHODS = (
    "absolute", "diet-rel:segment=input", "diet-rel",
    "diet-abs:position_rank=64:segment=input", "diet-abs:position_rank=64",
    "diet-abs:position_rank=64:sharing=layer", "diet-abs:position_rank=128:sharing=layer",
)
# DIET Table 9 (appendix D, GLUE): sharing. Its unshared rows are Table 8's per-head-segment rows (the same
# scores), so every row has per-head segments.
TABLE9_METHODS = (
    "diet-rel", "diet-rel:sharing=layer", "diet-rel:sharing=head",
    "diet-abs:position_rank=64", "diet-abs:position_rank=128",
    "diet-abs:position_rank=64:sharing=layer", "diet-abs:position_rank=128:sharing=layer",
)
# TUPE Table 1 and §4.3 (the "mid" rows are the 300k-step checkpoints of TUPE-A and TUPE-R: --keep-steps).
TUPE_METHODS = (
    "absolute",                   # BERT-A: BERT-Base's absolute positions at the input
    "t5:input_positions=true",    # BERT-R: absolute input positions and T5's relative bias (eq. 5)
    "tupe-a",                     # TUPE-A (eq. 10)
    "tupe-r",                     # TUPE-R (eq. 11)
    "tupe-a:tupe_reset=false",    # TUPE-A^tie-cls: without the [CLS] reset
    "bert-ad",                    # BERT-A^d: every correlation, positions through their own projections
)

# The built-in study (docs/study.md): the rows the claims of `dietpe.study.claims` compare, at the `study` size
# (d_h = 8, so the default d_p of DIET-ABS is 8). DIET-ABS and DIET-REL take per-head segments unless told;
# `sinusoidal` with its sinusoids scaled by 0.2, the best of {1, 0.2, 0.03} measured in docs/study.md (unit
# sinusoids swamp BERT's 0.02 token embeddings; 0.03 is too weak to be used); the unscaled formula is in
# `study+papers`.
STUDY_METHODS = ("none", "absolute", "sinusoidal:position_scale=0.2", "tupe-r",
                 "diet-abs", "diet-abs:segment=input", "diet-abs:sharing=layer", "diet-abs:sharing=head",
                 "diet-abs:position_rank=2", "diet-abs:position_rank=32",
                 "diet-rel", "diet-rel:segment=input", "diet-rel:sharing=layer", "diet-rel:sharing=head")

# `dietpe compare --plan gpu-hour`: the rows of the claims it is sized to resolve (per-head against input
# position, DIET-ABS and DIET-REL; TUPE's faster convergence)
GPU_HOUR_METHODS = ("absolute", "diet-abs", "diet-rel", "tupe-r")

METHOD_LISTS = {"papers": PAPER_METHODS, "table5": TABLE5_METHODS, "table8": TABLE8_METHODS,
                "table9": TABLE9_METHODS, "tupe": TUPE_METHODS, "linformer": LINFORMER_METHODS,
                "registry": REGISTRY_METHODS, "gpu-hour": GPU_HOUR_METHODS, "papers+none": ("none",) + PAPER_METHODS, "study": STUDY_METHODS,
                # the study's rows and every registered method's (docs/study.md: --budget 2)
                "study+papers": STUDY_METHODS + tuple(m for m in REGISTRY_METHODS if m not in STUDY_METHODS)}


@dataclass(frozen=True)
class Method:
    """One model variant: where position and segment enter, and DIET's sharing, plus other config fields."""

    position: str
    segment: str
    sharing: str = "none"
    extra: tuple[tuple[str, object], ...] = ()

    @property
    def name(self) -> str:
        """The canonical spec, `position[:segment=..][:sharing=..][:field=value]`, parseable again."""
        parts = [self.position]
        if self.segment != default_segment(self.position):
            parts.append(f"segment={self.segment}")
        if self.sharing != "none":
            parts.append(f"sharing={self.sharing}")
        parts += [f"{k}={v}" for k, v in self.extra]
        return ":".join(parts)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9.-]+", "_", self.name)

    def config_fields(self) -> dict:
        return dict(position=self.position, segment=self.segment, sharing=self.sharing, **dict(self.extra))


def default_segment(position: str) -> str:
    """The segment mode of the method's row in the papers: DIET's rows put segments per head (its eq. 2);
    every other method takes BERT's input segments (the registry's `segment` trait)."""
    return REGISTRY[position].segment if position in REGISTRY else "input"


# config fields whose values are names (segment=none, sharing=none), never parsed as numbers or None
WORD_FIELDS = ("segment", "sharing", "attention", "attn_backend", "hidden_act")


def parse_value(text: str):
    """A `key=value` option's value: int, float, bool, None or the text itself."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


@functools.cache
def config_fields(config_class: type) -> frozenset[str]:
    """The field names a spec may set for `config_class`, read once per class from a default instance."""
    return frozenset(config_class(vocab_size=8, hidden_size=8, num_attention_heads=2).to_dict())


def parse_method(spec: str, config_class: type = DietConfig, segment: str | None = None,
                 run_fields: dict[str, str] | None = None) -> Method:
    """`diet-rel`, `diet-rel:segment=input:sharing=layer`, `diet-abs:position_rank=128` -> Method.

    Validated by building a tiny `config_class` (DietConfig, or the translation model's DietSeq2SeqConfig,
    whose fields such as num_decoder_layers a spec may then set), so a mistake is reported before any data is
    read. `segment`: the segment mode when the spec names none (default: the method's row in the papers);
    `run_fields`: config fields the run sets itself, refused in a spec (default RUN_FIELDS)."""
    if not isinstance(spec, str):
        raise ConfigError(f"a method spec is a string such as 'diet-rel' or 'diet-abs:position_rank=16', got "
                          f"{type(spec).__name__} {spec!r}")
    run_fields = RUN_FIELDS if run_fields is None else run_fields
    position, *pairs = spec.strip().split(":")
    position, pairs = _bench_label(spec, position, pairs)
    fields: dict[str, object] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"method {spec!r}: {pair!r} is not key=value (e.g. diet-rel:segment=input)")
        key = key.strip().replace("-", "_")
        # named choices stay words: segment=none is the mode 'none', not Python's None
        fields[key] = value.strip() if key in WORD_FIELDS else parse_value(value.strip())
    segment = str(fields.pop("segment", segment or default_segment(position)))
    sharing = str(fields.pop("sharing", "none"))
    allowed = config_fields(config_class)
    unknown = [k for k in fields if k not in allowed]
    if unknown:
        raise ConfigError(f"method {spec!r}: unknown field(s) {unknown}; use segment=, sharing= or a "
                          f"{config_class.__name__} field such as position_rank=")
    for key, source in run_fields.items():
        if key in fields:
            raise ConfigError(f"method {spec!r}: {key} is set by the run from {source}; remove it from the method")
    for key, value in fields.items():
        if ("dropout" in key or key.endswith("_prob")) and not (isinstance(value, (int, float))
                                                               and not isinstance(value, bool) and 0 <= value < 1):
            raise ConfigError(f"method {spec!r}: {key}={value!r} must be a probability in [0, 1)")
    method = Method(position, segment, sharing, tuple(sorted(fields.items())))
    config_class.from_preset("bert-tiny", vocab_size=8, **method.config_fields())  # raises ConfigError
    return method


def _bench_label(spec: str, head: str, pairs: list[str]) -> tuple[str, list[str]]:
    """The bench's row labels as specs: `diet-rel+seg` is `diet-rel:segment=per-head`, `diet-rel@fused` is
    `diet-rel:attn_backend=fused`, so a row of `dietpe bench` can be trained as it is named."""
    head, at, backend = head.partition("@")
    if at:
        pairs = [f"attn_backend={backend}", *pairs]
    if head.endswith("+seg"):
        head, pairs = head[:-len("+seg")], ["segment=per-head", *pairs]
    keys = [p.partition("=")[0].strip().replace("-", "_") for p in pairs]
    for key in dict.fromkeys(k for k in keys if keys.count(k) > 1):  # the last would win, silently
        note = (" ('+seg' is segment=per-head, '@backend' is attn_backend=backend)"
                if key in ("segment", "attn_backend") else "")
        raise ConfigError(f"method {spec!r} sets {key} twice{note}")
    return head, pairs


# DietConfig fields a run sets itself; a method spec may override any other field, the size preset's
# (hidden_size, num_hidden_layers, ...) included.
RUN_FIELDS = {"vocab_size": "the tokenizer (--vocab-size)", "max_position_embeddings": "--max-length",
              "pad_token_id": "the tokenizer"}


def parse_methods(text: str) -> list[Method]:
    """A comma-separated list of specs, or named lists (`METHOD_LISTS`: `papers`, `table5`, `table8`, `table9`,
    `tupe`, `linformer`, ...). A row that two named lists share (`papers,tupe`: absolute, tupe-r) is kept once;
    a spec written twice is refused."""
    items: list[tuple[str, bool]] = []  # (spec, from a named list)
    for item in text.split(","):
        item = item.strip()
        if item:
            items.extend((spec, True) for spec in METHOD_LISTS[item]) if item in METHOD_LISTS else \
                items.append((item, False))
    if not items:
        raise ConfigError("no methods given; e.g. --methods absolute,diet-rel or --methods papers")
    methods: dict[str, tuple[Method, bool]] = {}
    dupes = set()
    for spec, listed in items:
        m = parse_method(spec)
        if m.name in methods:
            if not (listed or methods[m.name][1]):
                dupes.add(m.name)
            continue
        methods[m.name] = (m, listed)
    if dupes:
        raise ConfigError(f"methods listed twice: {sorted(dupes)}")
    return [m for m, _ in methods.values()]
