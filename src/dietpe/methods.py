"""Method specs: one model variant as a string, `position[:segment=..][:sharing=..][:field=value]`.

`diet-rel`, `diet-rel:segment=input:sharing=layer` and `diet-abs:position_rank=128` name a `DietConfig`'s
position fields; the pipeline (`dietpe pretrain --method`, `dietpe compare --methods`, `dietpe translate train
--method`) and the bench read them here. The papers' list of methods and each method's default segment mode
come from the registry (`dietpe.positions.registry`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from dietpe.config import SHAREABLE_POSITIONS, DietConfig
from dietpe.errors import ConfigError
from dietpe.positions.registry import REGISTRY

# The rows of DIET Table 2 (English GLUE) plus the methods the project adds; DIET rows with per-head segments.
PAPER_METHODS = tuple(m.paper_row for m in REGISTRY.values() if m.paper_row)


# DIET Table 5: sharing x segment for DIET-REL and DIET-ABS (rank fixed to the head size here).
TABLE5_METHODS = tuple(f"{p}:segment={s}:sharing={h}" for p in SHAREABLE_POSITIONS
                       for s in ("input", "per-head") for h in ("none", "head", "layer"))


# The built-in study (docs/study.md): the rows the claims of `dietpe.study.claims` compare, at the `study` size
# (d_h = 8, so the default d_p of DIET-ABS is 8). DIET-ABS and DIET-REL take per-head segments unless told;
# `sinusoidal` with its sinusoids scaled by 0.2, the best of {1, 0.2, 0.03} measured in docs/study.md (unit
# sinusoids swamp BERT's 0.02 token embeddings; 0.03 is too weak to be used); the unscaled formula is in
# `study+papers`.
STUDY_METHODS = ("none", "absolute", "sinusoidal:position_scale=0.2", "tupe-r",
                 "diet-abs", "diet-abs:segment=input", "diet-abs:sharing=layer", "diet-abs:sharing=head",
                 "diet-abs:position_rank=2", "diet-abs:position_rank=32",
                 "diet-rel", "diet-rel:segment=input", "diet-rel:sharing=layer", "diet-rel:sharing=head")

METHOD_LISTS = {"papers": PAPER_METHODS, "table5": TABLE5_METHODS,
                "papers+none": ("none",) + PAPER_METHODS, "study": STUDY_METHODS,
                "study+papers": STUDY_METHODS + tuple(m for m in PAPER_METHODS if m not in STUDY_METHODS)}


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
    run_fields = RUN_FIELDS if run_fields is None else run_fields
    position, *pairs = spec.strip().split(":")
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


# DietConfig fields a run sets itself; a method spec may override any other field, the size preset's
# (hidden_size, num_hidden_layers, ...) included.
RUN_FIELDS = {"vocab_size": "the tokenizer (--vocab-size)", "max_position_embeddings": "--max-length",
              "pad_token_id": "the tokenizer"}


def parse_methods(text: str) -> list[Method]:
    """A comma-separated list of specs, or a named list (`papers`, `papers+none`, `table5`)."""
    specs: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if item:
            specs.extend(METHOD_LISTS.get(item, (item,)))
    if not specs:
        raise ConfigError("no methods given; e.g. --methods absolute,diet-rel or --methods papers")
    methods = [parse_method(s) for s in specs]
    names = [m.name for m in methods]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"methods listed twice: {dupes}")
    return methods
