"""What pretrain, finetune and compare share: method specs, model sizes, the papers' recipes (DIET appendix A,
Table 7), kill-safe checkpoints for the Hugging Face `Trainer`, a compact progress bar, atomic files.

Kill safety: `Trainer` (transformers 5) writes `checkpoint-N/` in place, so a kill during a save leaves a
directory that `get_last_checkpoint` would pick up. `CompleteCheckpoints` writes a marker into the checkpoint
after every file (model, optimizer, scheduler, RNG states, trainer state) is written, and resuming uses only
the newest checkpoint with a marker; unmarked ones are deleted first, so they can never be loaded.

Exact resume: a run is a pure function of its settings and seed, and a resumed run ends bit-identical to an
uninterrupted one. Data order comes from `SeededSampler` (a permutation seeded by (seed, epoch), not the
global RNG), MLM masks from per-example seeds (seed, epoch, index) (`EpochExamples`), so the only consumer of
the global RNG is dropout, whose state `Trainer` saves in each checkpoint and restores. `train_resumable` does
not run an extra step from a checkpoint at the last step, and `check_run_settings` refuses to resume (or reuse)
an output folder made with other settings.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback

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
    for key, source in RUN_FIELDS.items():
        if key in fields:
            raise ConfigError(f"method {spec!r}: {key} is set by the run from {source}; remove it from the method")
    for key, value in fields.items():
        if ("dropout" in key or key.endswith("_prob")) and not (isinstance(value, (int, float))
                                                               and not isinstance(value, bool) and 0 <= value < 1):
            raise ConfigError(f"method {spec!r}: {key}={value!r} must be a probability in [0, 1)")
    method = Method(position, segment, sharing, tuple(sorted(fields.items())))
    DietConfig.from_preset("bert-tiny", vocab_size=8, **method.config_fields())  # raises ConfigError
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
    fields = {**overrides, **method.config_fields()}  # a method's fields override the size preset's
    return DietConfig.from_preset(preset, **fields, vocab_size=vocab_size, max_position_embeddings=max_positions,
                                  pad_token_id=pad_token_id)


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


# -- determinism and exact resume -----------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (SplitMix64 steps): a pure function, unlike Python's `hash`."""
    x = 0x9E3779B97F4A7C15
    for part in parts:
        x = (x ^ (int(part) & _MASK64)) & _MASK64
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x >> 1


class EpochExamples(torch.utils.data.Dataset):
    """A training set whose items carry `example_seed`, a pure function of (seed, epoch, index).

    `SeededSampler` yields `epoch * len + index` for such a dataset, so the seed of an example's MLM mask is
    known from the index alone: it does not depend on the global RNG, on what ran before, or on a resume."""

    def __init__(self, items: list[dict], seed: int):
        self.items, self.seed = items, seed

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        epoch, index = divmod(int(i), len(self.items))
        return {**self.items[index], "example_seed": mix_seed(self.seed, epoch, index)}


class SeededSampler(torch.utils.data.Sampler):
    """Training order as a pure function of (seed, epoch): a permutation from a generator seeded by both, or
    with `lengths` the length grouping of `Trainer`'s `group_by_length` (mega-batches sorted by length).

    `Trainer` calls `set_epoch` before each epoch (accelerate's DataLoaderShard forwards it, also after the
    skip of a resume), so the order of the resumed epoch is the order the uninterrupted run had."""

    def __init__(self, size: int, seed: int, lengths: list[int] | None = None, batch_size: int = 1,
                 tag_epoch: bool = False):
        self.size, self.seed, self.lengths, self.batch_size, self.tag_epoch = size, seed, lengths, batch_size, tag_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self):
        return self.size

    def __iter__(self):
        generator = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch))
        if self.lengths is not None:
            from transformers.trainer_pt_utils import get_length_grouped_indices
            order = get_length_grouped_indices(self.lengths, self.batch_size, generator=generator)
        else:
            order = torch.randperm(self.size, generator=generator).tolist()
        offset = self.epoch * self.size if self.tag_epoch else 0
        return iter([offset + int(i) for i in order])


class SeededTrainer(Trainer):
    """`Trainer` whose training order is a `SeededSampler` seeded with `data_seed` (else `seed`)."""

    def _get_train_sampler(self, train_dataset=None):
        dataset = self.train_dataset if train_dataset is None else train_dataset
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        lengths = None
        if self.args.train_sampling_strategy == "group_by_length":
            lengths = [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
        return SeededSampler(len(dataset), seed, lengths,
                             self.args.train_batch_size * self.args.gradient_accumulation_steps,
                             tag_epoch=isinstance(dataset, EpochExamples))


def train_resumable(trainer, resume: Path | None):
    """`trainer.train()`, resuming from `resume` if given. A checkpoint at (or past) the last step is loaded, not
    trained on: `Trainer` would run one more step before noticing (41 steps for `--steps 40`). Returns the
    `TrainOutput`, or None when nothing was left to train."""
    if resume is not None:
        saved = read_json(Path(resume) / "trainer_state.json")
        if saved.get("max_steps") and saved["global_step"] >= saved["max_steps"]:
            from transformers import TrainerState
            # the checkpoint's weights, trainer state and callbacks' states, as train() would restore them
            trainer._load_from_checkpoint(str(resume))
            trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
            trainer._load_callback_state()
            return None
    return trainer.train(resume_from_checkpoint=str(resume) if resume else None)


# -- run settings --------------------------------------------------------------------------------------------

RUN_SETTINGS = "run_settings.json"


def _plain(value):
    """JSON's view of a value (tuples become lists), so saved and new settings compare equal."""
    return json.loads(json.dumps(value, default=str))


def _flatten(d: dict, prefix: str = "") -> dict:
    """{"settings": {"lr": 1}} -> {"settings.lr": 1}, so a difference is named by its field."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def file_fingerprint(path: str | Path) -> str:
    """sha256 of a file's bytes (first 16 hex digits), or '' if there is no such file."""
    path = Path(path)
    if not path.is_file():
        return ""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def local_path(text: str | None) -> str | None:
    """An absolute path for a local file or folder (the same run from another directory), else the text."""
    if text is None:
        return None
    path = Path(text)
    return str(path.resolve()) if path.exists() else text


def check_run_settings(output_dir: str | Path, settings: dict, fresh_hint: str = "--overwrite",
                       products: tuple[str, ...] = ()) -> None:
    """Record `settings` in `output_dir` (atomically) before a run writes anything else, or, if the folder holds
    results of an earlier run, refuse to go on with different settings: a ConfigError names each differing
    field, old -> new, and says how to start afresh.

    `products` are glob patterns of what a run leaves (checkpoints count too). Results without a settings file
    come from an unknown run and are refused; a settings file alone (a run that failed before producing
    anything) is simply replaced."""
    output_dir = Path(output_dir)
    path = output_dir / RUN_SETTINGS
    new = _plain(settings)
    found = sorted({p.name for pattern in products for p in output_dir.glob(pattern)})
    found += [folder.name for _, folder, _ in checkpoints(output_dir)]
    if found and path.is_file():
        try:
            old = read_json(path)
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict):
            raise ConfigError(f"{path}: unreadable run settings; to start afresh use {fresh_hint} or another "
                              f"output folder")
        old, flat = _flatten(old), _flatten(new)
        diff = [k for k in sorted(set(old) | set(flat)) if old.get(k) != flat.get(k)]
        if diff:
            changes = "; ".join(f"{k}: {old.get(k)!r} -> {flat.get(k)!r}" for k in diff)
            raise ConfigError(f"{output_dir} holds a run with other settings ({changes}); to start afresh use "
                              f"{fresh_hint}, or give another output folder")
        return
    if found:
        raise ConfigError(f"{output_dir} holds an earlier run ({', '.join(found[:3])}) without {RUN_SETTINGS}, "
                          f"so its settings are unknown; to start afresh use {fresh_hint}, or give another "
                          f"output folder")
    if is_main_process():
        write_json_atomic(path, new)


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
    from diet.validate import positive_int

    p.add_argument("--threads", type=positive_int, default=default,
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
