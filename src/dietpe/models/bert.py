"""BERT checkpoints in and out: diet's `absolute` model is BERT exactly (Devlin et al. 2019: x_i = w_i + p_i +
s_i, post-LN blocks, tanh pooler, MLM head tied to the word embeddings), so a Hugging Face BERT checkpoint maps
onto it tensor by tensor, and back.

    from_bert(path_or_name, cls)                        -> the same model in diet (outputs equal to BERT's)
    from_bert(path_or_name, cls, position="diet-rel")   -> BERT's content weights (tokens, every projection,
                                                           LayerNorm and FFN, heads; segments with
                                                           segment="input": DIET's per-head ones have no place
                                                           for BERT's table), the new method's parameters
                                                           fresh; BERT's learned input positions dropped
                                                           (keep_input_positions=False)
    to_bert(model, path)                                -> a plain BERT folder transformers loads without diet

Every import returns a `LoadReport` (loaded, initialised, dropped tensors) and logs its summary, so a run
continued from BERT says exactly what came from the checkpoint. Weights are read with safetensors only (a
`pytorch_model.bin` is refused: torch.load of a downloaded file can run code). A hub name goes through
transformers' normal download path (`cached_file`), a folder is read in place.

The name mapping is written once, as pairs of templates, and read in both directions.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dietpe.config import DietConfig
from dietpe.errors import ConfigError, DataError
from dietpe.models.modeling import (
    DietForMaskedLM,
    DietForQuestionAnswering,
    DietForSequenceClassification,
    DietModel,
    DietPreTrainedModel,
)
from dietpe.positions.registry import REGISTRY, names

log = logging.getLogger("dietpe.bert")

# (BERT name, diet name) inside the encoder: `{n}` a layer index, `{w}` weight or bias
ENCODER_NAMES = (
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "positions.method.weight"),
    ("embeddings.token_type_embeddings.weight", "positions.input_segments.weight"),
    ("embeddings.LayerNorm.{w}", "embeddings.LayerNorm.{w}"),
    ("encoder.layer.{n}.attention.self.query.{w}", "layers.{n}.attention.query.{w}"),
    ("encoder.layer.{n}.attention.self.key.{w}", "layers.{n}.attention.key.{w}"),
    ("encoder.layer.{n}.attention.self.value.{w}", "layers.{n}.attention.value.{w}"),
    ("encoder.layer.{n}.attention.output.dense.{w}", "layers.{n}.attention_output.{w}"),
    ("encoder.layer.{n}.attention.output.LayerNorm.{w}", "layers.{n}.attention_norm.{w}"),
    ("encoder.layer.{n}.intermediate.dense.{w}", "layers.{n}.intermediate.{w}"),
    ("encoder.layer.{n}.output.dense.{w}", "layers.{n}.output.{w}"),
    ("encoder.layer.{n}.output.LayerNorm.{w}", "layers.{n}.output_norm.{w}"),
    ("pooler.dense.{w}", "pooler.{w}"),
)
# (BERT name, diet name) of the task heads, outside the encoder
HEAD_NAMES = (
    ("cls.predictions.transform.dense.{w}", "lm_head.dense.{w}"),
    ("cls.predictions.transform.LayerNorm.{w}", "lm_head.LayerNorm.{w}"),
    ("cls.predictions.decoder.weight", "lm_head.decoder.weight"),
    ("cls.predictions.bias", "lm_head.bias"),
    ("classifier.{w}", "classifier.{w}"),
    ("qa_outputs.{w}", "qa_outputs.{w}"),
)
# BERT's input position table: what `keep_input_positions` keeps or drops; the method whose table it is
INPUT_POSITIONS = "positions.method.weight"
(BERT_POSITION,) = names(bert_table=True)
KEPT_INPUT_POSITIONS = "positions.input_positions.weight"  # where it goes beside another method

# Hugging Face BERT architecture -> diet class, and back
DIET_CLASS = {"BertModel": DietModel, "BertForMaskedLM": DietForMaskedLM, "BertForPreTraining": DietForMaskedLM,
              "BertForSequenceClassification": DietForSequenceClassification,
              "BertForQuestionAnswering": DietForQuestionAnswering}
BERT_CLASS = {DietModel: "BertModel", DietForMaskedLM: "BertForMaskedLM",
              DietForSequenceClassification: "BertForSequenceClassification",
              DietForQuestionAnswering: "BertForQuestionAnswering"}
# BertConfig fields that are DietConfig fields of the same meaning
CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                 "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id", "classifier_dropout",
                 "id2label", "label2id", "problem_type", "tie_word_embeddings")


def _regex(template: str) -> re.Pattern:
    pattern = re.escape(template).replace(r"\{n\}", r"(?P<n>\d+)").replace(r"\{w\}", r"(?P<w>weight|bias)")
    return re.compile(pattern + "$")


_PAIRS = [(_regex(b), d, _regex(d), b) for b, d in ENCODER_NAMES + HEAD_NAMES]
_ENCODER = [_regex(d) for _, d in ENCODER_NAMES]


def _in_encoder(diet_name: str) -> bool:
    """A diet name (without the base model's prefix) of the encoder, not of a head."""
    return any(r.match(diet_name) for r in _ENCODER)


def _convert(name: str, to_diet: bool) -> str | None:
    for bert_re, diet_t, diet_re, bert_t in _PAIRS:
        m = (bert_re if to_diet else diet_re).match(name)
        if m:
            return (diet_t if to_diet else bert_t).format(**m.groupdict())
    return None


def bert_to_diet_name(name: str, base_prefix: str) -> str | None:
    """A BERT checkpoint's tensor name (any head, with or without the `bert.` prefix, old `gamma`/`beta`
    LayerNorm names too) -> the diet name in a model whose encoder sits under `base_prefix` ('' or 'diet.');
    None for what diet has no place for (NSP head, buffers)."""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))
    name = name.removeprefix("bert.")
    if name == "cls.predictions.decoder.bias":
        name = "cls.predictions.bias"  # the same tensor, tied in BERT
    out = _convert(name, to_diet=True)
    if out is None:
        return None
    return base_prefix + out if _in_encoder(out) else out


@dataclass
class LoadReport:
    """What an import did: tensors (diet names) loaded from the checkpoint, initialised afresh, and checkpoint
    tensors (BERT names) dropped."""

    source: str
    target: str
    loaded: list[str] = field(default_factory=list)
    initialised: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{self.target} from {self.source}: {len(self.loaded)} tensors loaded, {len(self.initialised)} "
                 f"initialised, {len(self.dropped)} dropped"]
        if self.initialised:
            lines.append("  initialised: " + ", ".join(self.initialised))
        if self.dropped:
            lines.append("  dropped: " + ", ".join(self.dropped))
        return "\n".join(lines)


def _bert_config(path_or_name: str):
    from transformers import BertConfig

    try:
        found = BertConfig.get_config_dict(path_or_name)[0].get("model_type")
        config = BertConfig.from_pretrained(path_or_name)
    except OSError as e:
        raise DataError(f"{path_or_name}: no BERT config.json found ({e})") from e
    if found != "bert":  # BertConfig reads any config.json, a GPT-2's into BERT's default sizes
        raise ConfigError(f"{path_or_name}: model_type {found!r} is not BERT's ('bert'); from_bert continues BERT "
                          f"checkpoints; use dietpe.attach(model, spec) for other families (docs/integrate.md)")
    return config


def _state_dict(path_or_name: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, from model.safetensors or its shards, read with safetensors only."""
    from safetensors.torch import load_file
    from transformers.utils import cached_file

    def find(filename: str) -> str | None:
        return cached_file(path_or_name, filename, _raise_exceptions_for_missing_entries=False,
                           _raise_exceptions_for_connection_errors=False)

    single = find("model.safetensors")
    if single:
        return load_file(single)
    index = find("model.safetensors.index.json")
    if index:
        shards = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
        state = {}
        for shard in shards:
            state.update(load_file(find(shard)))
        return state
    raise DataError(f"{path_or_name}: no model.safetensors (or sharded index) found; diet reads BERT weights with "
                    f"safetensors only (torch.load of a pytorch_model.bin can run code): convert it once with "
                    f"transformers (`BertModel.from_pretrained(...).save_pretrained(dir)`) where you trust it")


def bert_table(config: DietConfig) -> bool:
    """Whether the config's method is BERT's learned input table itself (the registry's `bert_table`)."""
    return REGISTRY[config.position].bert_table


def bert_config_fields(bert_config) -> dict:
    """The DietConfig fields of a `BertConfig`; refuses BERT variants diet does not reproduce."""
    kind = getattr(bert_config, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise ConfigError(f"position_embedding_type={kind!r}: only BERT's learned absolute positions map onto diet")
    if getattr(bert_config, "is_decoder", False) or getattr(bert_config, "add_cross_attention", False):
        raise ConfigError("a BERT decoder (is_decoder / add_cross_attention) does not map onto diet's encoder")
    d = bert_config.to_dict()
    return {k: d[k] for k in CONFIG_FIELDS if k in d}


def from_bert(path_or_name: "str | torch.nn.Module", cls: type[DietPreTrainedModel] | None = None, position: str = "absolute",
              keep_input_positions: bool | None = None, config: DietConfig | None = None,
              **overrides) -> tuple[DietPreTrainedModel, LoadReport]:
    """A diet model from a BERT checkpoint (a folder, a hub name, or a loaded transformers Bert* model):
    returns (model, report).

    cls: the diet class (default: the one matching the checkpoint's architecture, e.g. BertForMaskedLM ->
    DietForMaskedLM). position (and `overrides`, any DietConfig field such as segment or sharing): the position
    method; every tensor BERT has a place for in it is loaded, the rest initialised (seed torch first).
    keep_input_positions: load BERT's learned input position table (default: only when position='absolute').
    With another (per-head) method, keeping it gives the model an input table besides its method
    (`input_positions=True`, DIET Fig. 5's combination). config: a complete DietConfig instead of
    position/overrides; its sizes must be BERT's."""
    if isinstance(path_or_name, torch.nn.Module):  # a loaded transformers BERT: its config and tensors
        source = path_or_name
        if getattr(getattr(source, "config", None), "model_type", None) != "bert":
            raise ConfigError(f"from_bert: expected a transformers BERT model (model_type 'bert'), got "
                              f"{type(source).__name__}; use dietpe.attach(model, spec) for other families")
        bert_config = source.config
        path_or_name = type(source).__name__
        arch_default = type(source).__name__
        tensors = {k: v.detach() for k, v in source.state_dict().items()}
    else:
        bert_config = _bert_config(path_or_name)
        arch_default, tensors = None, None
    if cls is None:
        arch = arch_default or (bert_config.architectures or ["BertModel"])[0]
        if arch not in DIET_CLASS:
            raise ConfigError(f"{path_or_name}: architecture {arch!r} has no diet counterpart; pass cls= one of "
                              f"{', '.join(c.__name__ for c in BERT_CLASS)}")
        cls = DIET_CLASS[arch]
    fields = bert_config_fields(bert_config)
    if config is None:
        config = DietConfig(**{**fields, "position": position, **overrides})
    else:
        wrong = {k: (getattr(config, k), v) for k, v in fields.items()
                 if k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "type_vocab_size") and getattr(config, k) != v}
        if wrong:
            raise ConfigError(f"{path_or_name}: the config differs from the BERT checkpoint in "
                              + ", ".join(f"{k}={a} (BERT: {b})" for k, (a, b) in wrong.items()))
    if keep_input_positions is None:
        keep_input_positions = bert_table(config) or bool(getattr(config, "input_positions", False))
    if keep_input_positions and not bert_table(config) and not config.input_positions:
        config = DietConfig(**{**config.to_dict(), "input_positions": True})  # validated: per-head methods only
    model = cls(config)
    prefix = "" if isinstance(model, DietModel) else model.base_model_prefix + "."
    targets = model.state_dict()
    report = LoadReport(str(path_or_name), f"{cls.__name__}(position={config.position!r})")
    mapped: dict[str, torch.Tensor] = {}
    for name, tensor in (tensors if tensors is not None else _state_dict(path_or_name)).items():
        target = bert_to_diet_name(name, prefix)
        if target == prefix + INPUT_POSITIONS:
            if not keep_input_positions:
                target = None
            elif not bert_table(config):  # the input table besides the method
                target = prefix + KEPT_INPUT_POSITIONS
        if target is None or target not in targets:
            report.dropped.append(name)
            continue
        if tuple(targets[target].shape) != tuple(tensor.shape):
            raise DataError(f"{path_or_name}: {name} has shape {tuple(tensor.shape)}, {target} in diet "
                            f"{tuple(targets[target].shape)}")
        mapped[target] = tensor
    model.load_state_dict(mapped, strict=False)
    tied = {k for k, v in getattr(model, "_tied_weights_keys", None).items() if v in mapped} \
        if config.tie_word_embeddings and getattr(model, "_tied_weights_keys", None) else set()
    report.loaded = sorted(set(mapped) | tied)
    report.initialised = sorted(k for k in targets if k not in mapped and k not in tied)
    log.info(report.summary())
    return model, report


def to_bert(model: DietPreTrainedModel, path: str | Path) -> Path:
    """Save a diet `absolute` model (input segments, full attention) as a plain Hugging Face BERT folder:
    config.json (model_type bert, the matching Bert* architecture) and model.safetensors."""
    from safetensors.torch import save_file
    from transformers import BertConfig

    c = model.config
    if type(model) not in BERT_CLASS:
        raise ConfigError(f"{type(model).__name__} has no BERT counterpart; export one of "
                          f"{', '.join(k.__name__ for k in BERT_CLASS)}")
    if not bert_table(c) or c.segment != "input" or c.attention != "full":
        raise ConfigError(f"only position={BERT_POSITION!r}, segment='input', attention='full' is BERT; this model has "
                          f"position={c.position!r}, segment={c.segment!r}, attention={c.attention!r}")
    fields = {k: getattr(c, k) for k in CONFIG_FIELDS if hasattr(c, k)}
    bert_config = BertConfig(**fields, architectures=[BERT_CLASS[type(model)]])
    prefix = "" if isinstance(model, DietModel) else "bert."
    base = "" if isinstance(model, DietModel) else model.base_model_prefix + "."
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if c.tie_word_embeddings else set()
    state = {}
    for name, tensor in model.state_dict().items():
        if name in tied:
            continue  # BERT ties it too: transformers restores it from the word embeddings
        inner = name.removeprefix(base) if name.startswith(base) else name
        bert_name = _convert(inner, to_diet=False)
        if bert_name is None:
            raise ConfigError(f"{name} has no place in BERT")
        state[(prefix if _in_encoder(inner) else "") + bert_name] = tensor.detach().contiguous().clone()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    bert_config.save_pretrained(path)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    log.info(f"{type(model).__name__} saved as {BERT_CLASS[type(model)]} in {path} ({len(state)} tensors)")
    return path


def init_config(path_or_name: str, max_length: int, **method_fields) -> DietConfig:
    """The DietConfig to continue pre-training a BERT checkpoint with another position method: BERT's sizes,
    vocabulary and dropout, the method's fields (position, segment, sharing, ...). Refuses a training length the
    method's learned tables (BERT's max_position_embeddings) cannot serve."""
    from dietpe.positions.encoding import check_length

    fields = {**bert_config_fields(_bert_config(path_or_name)), **method_fields}
    for key in ("id2label", "label2id", "problem_type"):
        fields.pop(key, None)
    check_length(fields.get("position", "absolute"), max_length, fields["max_position_embeddings"],
                 "--max-length ", f"the BERT checkpoint {path_or_name} has max_position_embeddings="
                                  f"{fields['max_position_embeddings']}", ConfigError)
    return DietConfig(**fields)
