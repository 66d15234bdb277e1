"""What pretrain, finetune and compare share: method specs, model sizes, the papers' recipes (DIET appendix A,
Table 7), kill-safe checkpoints for the Hugging Face `Trainer`, a compact progress bar, atomic files.

Kill safety: `Trainer` (transformers 5) writes `checkpoint-N/` in place, so a kill during a save leaves a
directory that `get_last_checkpoint` would pick up. `CompleteCheckpoints` writes a marker into the checkpoint
after every file (model, optimizer, scheduler, RNG states, trainer state) is written, and resuming uses only
the newest checkpoint with a marker; unmarked ones are deleted first, so they can never be loaded.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback

from diet.config import LEARNED_ABSOLUTE, PRESETS, DietConfig
from diet.errors import ConfigError

# -- methods -------------------------------------------------------------------------------------------------

DIET_POSITIONS = ("diet-abs", "diet-rel")
# The rows of DIET Table 2 (English GLUE) plus the methods the project adds; DIET rows with per-head segments.
PAPER_METHODS = ("absolute", "sinusoidal", "shaw", "xlnet", "t5", "tupe-a", "tupe-r",
                 "diet-abs:sharing=layer", "diet-rel", "rotary", "alibi")
# DIET Table 5: sharing x segment for DIET-REL and DIET-ABS (rank fixed to the head size here).
TABLE5_METHODS = tuple(f"{p}:segment={s}:sharing={h}" for p in DIET_POSITIONS
                       for s in ("input", "per-head") for h in ("none", "head", "layer"))
METHOD_LISTS = {"papers": PAPER_METHODS, "table5": TABLE5_METHODS,
                "papers+none": ("none",) + PAPER_METHODS}


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
    """DIET's rows put segments per head (its eq. 2); every other method takes BERT's input segments."""
    return "per-head" if position in DIET_POSITIONS else "input"


def parse_value(text: str):
    """A `key=value` option's value: int, float, bool, None or the text itself."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def parse_method(spec: str) -> Method:
    """`diet-rel`, `diet-rel:segment=input:sharing=layer`, `diet-abs:position_rank=128` -> Method.

    Validated by building a tiny DietConfig, so a mistake is reported before any data is read."""
    position, *pairs = spec.strip().split(":")
    fields: dict[str, object] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"method {spec!r}: {pair!r} is not key=value (e.g. diet-rel:segment=input)")
        fields[key.strip().replace("-", "_")] = parse_value(value.strip())
    segment = str(fields.pop("segment", default_segment(position)))
    sharing = str(fields.pop("sharing", "none"))
    allowed = set(DietConfig().to_dict())
    unknown = [k for k in fields if k not in allowed]
    if unknown:
        raise ConfigError(f"method {spec!r}: unknown field(s) {unknown}; use segment=, sharing= or a DietConfig "
                          f"field such as position_rank=")
    method = Method(position, segment, sharing, tuple(sorted(fields.items())))
    DietConfig.from_preset("bert-tiny", vocab_size=8, **method.config_fields())  # raises ConfigError
    return method


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


# -- sizes and configs ---------------------------------------------------------------------------------------

# `toy` is the built-in comparison's size (fits ~10 CPU minutes for 12 methods); the rest are diet's presets.
SIZES: dict[str, tuple[str, dict]] = {
    "toy": ("bert-tiny", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)),
    **{name: (name, {}) for name in PRESETS},
}


def build_config(method: Method, size: str, vocab_size: int, max_length: int, pad_token_id: int,
                 max_position_embeddings: int | None = None, dropout: float | None = None) -> DietConfig:
    if size not in SIZES:
        raise ConfigError(f"model size {size!r} is not one of {', '.join(SIZES)}")
    preset, overrides = SIZES[size]
    max_positions = max_position_embeddings or max_length
    if max_length > max_positions and method.position in LEARNED_ABSOLUTE:
        raise ConfigError(f"max_length={max_length} exceeds max_position_embeddings={max_positions}: "
                          f"position={method.position!r} learns one vector per position up to that limit")
    if dropout is not None:
        overrides = {**overrides, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    return DietConfig.from_preset(preset, **overrides, **method.config_fields(), vocab_size=vocab_size,
                                  max_position_embeddings=max_positions, pad_token_id=pad_token_id)


def check_length(config: DietConfig, max_length: int, where: str) -> None:
    """Refuse, before training, a length the pretrained model's position method cannot serve."""
    if max_length > config.max_position_embeddings and config.position in LEARNED_ABSOLUTE:
        raise ConfigError(
            f"max_length={max_length} exceeds max_position_embeddings={config.max_position_embeddings} of "
            f"{where}: position={config.position!r} has a learned vector per position only up to that limit; "
            f"use --max-length {config.max_position_embeddings} or less")


# -- recipes -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PretrainRecipe:
    learning_rate: float
    warmup: float            # fraction of the steps
    max_length: int
    batch_size: int          # global, reached with gradient accumulation
    max_steps: int
    save_steps: int
    weight_decay: float = 0.01
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    vocab_size: int = 30000
    size: str = "bert-base"


@dataclass(frozen=True)
class FinetuneRecipe:
    learning_rates: tuple[float, ...]
    seeds: int
    epochs: float
    batch_size: int
    max_length: int
    warmup: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0


PRETRAIN_RECIPES = {
    # DIET appendix A, Table 7 (English): 500k steps, lr 0.0018, warm-up 2.5%, length 128, batch 4096.
    "paper": PretrainRecipe(1.8e-3, 0.025, 128, 4096, 500_000, 20_000),
    # A budget for a CPU session: same shape, a few hundred steps of bert-mini.
    "cpu": PretrainRecipe(1e-3, 0.06, 128, 32, 600, 100, size="bert-mini", vocab_size=8000),
    # The built-in comparison: the toy size on the generated corpus.
    "toy": PretrainRecipe(2e-3, 0.06, 32, 32, 800, 200, size="toy", vocab_size=1000),
}
FINETUNE_RECIPES = {
    # Table 7: lr grid {1,2,3,4}e-5, warm-up 10%, batch 32, 5 (or 10) epochs, length 128; median of 5 seeds.
    "paper": FinetuneRecipe((1e-5, 2e-5, 3e-5, 4e-5), 5, 5, 32, 128),
    "cpu": FinetuneRecipe((1e-4,), 1, 3, 32, 128),
    "toy": FinetuneRecipe((1e-3,), 2, 3, 32, 32),
}


# -- checkpoints ---------------------------------------------------------------------------------------------

COMPLETE = "diet-complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def write_json_atomic(path: str | Path, obj) -> None:
    """Write JSON to a temporary file and rename it: a reader sees the old file or the new, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=False, default=float)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str | Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class CompleteCheckpoints(TrainerCallback):
    """Marks a checkpoint complete once `Trainer` has written all of it (on_save runs after the save)."""

    def on_save(self, args, state, control, **kwargs):
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # every rank has written its RNG state
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                write_json_atomic(folder / COMPLETE, {"global_step": state.global_step})
        return control


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path, bool]]:
    """(step, folder, complete) of every checkpoint folder, oldest first."""
    out = []
    root = Path(output_dir)
    if root.is_dir():
        for p in root.iterdir():
            m = _CHECKPOINT.match(p.name)
            if m and p.is_dir():
                complete = (p / COMPLETE).is_file() and (p / "trainer_state.json").is_file()
                out.append((int(m.group(1)), p, complete))
    return sorted(out)


def resumable_checkpoint(output_dir: str | Path, remove_incomplete: bool = True) -> Path | None:
    """The newest complete checkpoint; incomplete ones (a kill during a save) are deleted if asked."""
    found = checkpoints(output_dir)
    if remove_incomplete:
        for step, folder, complete in found:
            if not complete:
                print(f"diet: removing incomplete checkpoint {folder} (interrupted during a save)", file=sys.stderr)
                shutil.rmtree(folder, ignore_errors=True)
    done = [folder for _, folder, complete in found if complete]
    return done[-1] if done else None


# -- progress ------------------------------------------------------------------------------------------------

class ProgressBar(TrainerCallback):
    """One tqdm bar per run with the latest loss and evaluation score, on the main process only."""

    def __init__(self, description: str, score_key: str | None = None):
        self.description = description
        self.score_key = score_key
        self.bar = None
        self.postfix: dict[str, str] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and not args.disable_tqdm:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=self.description,
                            dynamic_ncols=True, leave=True, file=sys.stderr)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None or not logs:
            return
        if "loss" in logs:
            self.postfix["loss"] = f"{logs['loss']:.3f}"
        if "eval_loss" in logs:
            self.postfix["val_loss"] = f"{logs['eval_loss']:.3f}"
        if self.score_key and self.score_key in logs:
            self.postfix["score"] = f"{logs[self.score_key]:.1f}"
        self.bar.set_postfix(self.postfix, refresh=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def replace_progress(trainer, bar: ProgressBar) -> None:
    """Swap Trainer's own progress bar and log printer for `bar` (and silence the bars of saving shards)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(bar)


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: list[dict]):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def add_threads_option(p, default: int | None = None) -> None:
    p.add_argument("--threads", type=int, default=default,
                   help="CPU threads per process (default: torch's choice); 1 is much faster for small models "
                        "on a busy machine, where more threads than free cores stall each other")


def set_threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads={threads} must be at least 1")
        torch.set_num_threads(threads)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def batch_layout(global_batch: int, device_batch: int) -> tuple[int, int]:
    """(per-device batch, gradient accumulation) reaching `global_batch` over all processes."""
    world = world_size()
    if global_batch % world:
        raise ConfigError(f"batch size {global_batch} is not divisible by the {world} processes")
    per_process = global_batch // world
    per_device = min(per_process, device_batch)
    accumulation = math.ceil(per_process / per_device)
    if per_device * accumulation != per_process:
        raise ConfigError(f"batch size {global_batch} over {world} process(es) is not a multiple of the device "
                          f"batch {device_batch}; pick --device-batch-size dividing {per_process}")
    return per_device, accumulation


def log_history_curves(log_history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Training and validation loss curves from `Trainer.state.log_history`."""
    curves: dict[str, list[tuple[int, float]]] = {"train_loss": [], "eval_loss": []}
    for row in log_history:
        for key, name in (("loss", "train_loss"), ("eval_loss", "eval_loss")):
            if key in row and "step" in row:
                curves[name].append((int(row["step"]), float(row[key])))
    return curves


@dataclass
class RunSummary:
    """What a finished pre-training run reports."""

    method: str
    output_dir: str
    val_loss: float
    perplexity: float
    steps: int
    seconds: float
    curves: dict = field(default_factory=dict)
