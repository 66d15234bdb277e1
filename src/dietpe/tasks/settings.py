"""The resolved settings of a run: a recipe (`dietpe.tasks.recipes`) with the command line's overrides applied,
checked once when built, then passed down as one frozen value.

`record()` is what a run folder saves (`run_settings.json`, `pretrain_results.json`, `summary.json`, compare's
`results.json`): the same keys the settings dicts had, so runs made before these types still resume.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dietpe.commands import DOC_STRIDE
from dietpe.errors import ConfigError
from dietpe.tasks.recipes import FINETUNE_RECIPES, PRETRAIN_RECIPES

#: --optimizer: AdamW (every recipe but `paper`) or LAMB (dietpe.tasks.lamb)
OPTIMIZERS = ("adamw", "lamb")

if TYPE_CHECKING:
    from dietpe.config import DietConfig
    from dietpe.methods import Method


def _given(value, default):
    """0 is a value to check, never "unset": only None takes the recipe's."""
    return default if value is None else value


def recipe_name(args) -> str:
    """--recipe, else `init` when --init continues a checkpoint (docs/causal.md), else `cpu`."""
    return args.recipe or ("init" if getattr(args, "init", None) else "cpu")


@dataclass(frozen=True)
class PretrainSettings:
    """Masked-LM pre-training: model size, data shape and optimizer (DIET appendix A, Table 7)."""

    size: str                  # a key of recipes.SIZES
    vocab_size: int            # of the tokenizer trained on the corpus
    max_length: int            # tokens per block
    steps: int                 # optimizer steps
    batch_size: int            # global, reached with gradient accumulation
    lr: float
    warmup: float              # fraction of the steps
    save_steps: int            # checkpoint and validation interval
    weight_decay: float = 0.01
    adam_epsilon: float = 1e-6
    max_grad_norm: float = 1.0
    logit_lr_scale: float = 1.0  # lr of logit-unit position parameters relative to lr (dietpe.tasks.optim)
    optimizer: str = "adamw"       # adamw or lamb (dietpe.tasks.lamb)
    logit_scale: float | None = None   # every model's DietConfig.logit_scale; None: the config's default
    max_positions: int | None = None   # rows of the position tables; None: max_length
    keep_steps: tuple[int, ...] = ()   # steps whose model is kept (steps/step-N)

    def __post_init__(self):
        object.__setattr__(self, "keep_steps", tuple(sorted(set(self.keep_steps))))
        scale = self.logit_lr_scale
        if scale != 1 and not (scale > 0 and math.isfinite(scale)):
            raise ConfigError(f"--logit-lr-scale={scale} must be positive and finite")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"--optimizer={self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.logit_scale is not None and not (self.logit_scale > 0 and math.isfinite(self.logit_scale)):
            raise ConfigError(f"logit_scale={self.logit_scale} must be positive and finite")
        if self.max_positions is not None and self.max_positions < self.max_length:
            raise ConfigError(f"--max-positions={self.max_positions} is below --max-length={self.max_length}: the "
                              f"position tables must have a row for every position of a block")
        bad = [k for k in self.keep_steps if not 0 < k <= self.steps]
        if bad:
            raise ConfigError(f"--keep-steps {bad[0]} is not a step of this run (1 to --steps={self.steps})")
        for key in ("vocab_size", "max_length", "steps", "batch_size", "save_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"--{key.replace('_', '-')}={getattr(self, key)} must be a positive integer")
        if not 0 <= self.warmup < 1:
            raise ConfigError(f"--warmup={self.warmup} must be a fraction in [0, 1)")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"--lr={self.lr} must be positive and finite")

    @classmethod
    def from_args(cls, args) -> PretrainSettings:
        """The recipe (--recipe) with the command line's overrides applied."""
        r = PRETRAIN_RECIPES[recipe_name(args)]
        steps = _given(args.steps, r.max_steps)
        max_length = _given(args.max_length, r.max_length)
        # the recipe's table rows, unless a longer block needs more
        max_positions = _given(getattr(args, "max_positions", None),
                               r.max_positions if r.max_positions and r.max_positions >= max_length else None)
        keep = getattr(args, "keep_steps", None)
        if keep is None:  # the recipe's kept steps are fractions of its run: scaled with --steps
            keep = tuple(max(1, round(k * steps / r.max_steps)) for k in r.keep_steps)
        return cls(size=_given(args.size, r.size), vocab_size=_given(args.vocab_size, r.vocab_size),
                   max_length=max_length, steps=steps,
                   batch_size=_given(args.batch_size, r.batch_size), lr=_given(args.lr, r.learning_rate),
                   warmup=_given(args.warmup, r.warmup),
                   save_steps=_given(args.save_steps, min(r.save_steps, steps)), weight_decay=r.weight_decay,
                   adam_epsilon=r.adam_epsilon, max_grad_norm=r.max_grad_norm,
                   logit_lr_scale=_given(getattr(args, "logit_lr_scale", None), r.logit_lr_scale),
                   optimizer=_given(getattr(args, "optimizer", None), r.optimizer), logit_scale=r.logit_scale,
                   max_positions=max_positions, keep_steps=tuple(keep))

    @property
    def positions(self) -> int:
        """Rows of the models' position tables (max_position_embeddings)."""
        return self.max_positions or self.max_length

    def record(self) -> dict:
        """The saved form; the fields added after the first runs only when they differ from their defaults, so
        runs made before them still resume."""
        d = asdict(self)
        for key, default in OPTIONAL_PRETRAIN.items():
            if d[key] == default:
                del d[key]
        return d


# fields recorded only when they differ from these defaults (runs made before them resume)
OPTIONAL_PRETRAIN = {"logit_lr_scale": 1.0, "optimizer": "adamw", "logit_scale": None, "max_positions": None,
                     "keep_steps": ()}
OPTIONAL_FINETUNE = {"task_epochs": (), "metrics": (), "adam_epsilon": 1e-8, "doc_step": None}


@dataclass(frozen=True)
class FinetuneSettings:
    """The fine-tuning grid and its optimizer (DIET appendix A, Table 7)."""

    lrs: tuple[float, ...]     # the learning-rate grid
    seeds: int                 # fine-tuning seeds per learning rate
    epochs: float
    batch_size: int
    max_length: int
    warmup: float = 0.1        # fraction of the steps
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    eval_steps: int | None = None  # evaluate every N steps; None: every epoch
    max_eval: int | None = None    # examples per evaluation set; None: all
    doc_stride: int = 64           # QA context windows' overlap
    doc_step: int | None = None    # else the distance of their starts (the recipe's; --doc-stride clears it)
    task_epochs: tuple[tuple[str, float], ...] = ()  # epochs by task name where they differ from `epochs`
    metrics: tuple[tuple[str, str], ...] = ()        # the selecting metric by task name, where not the first
    adam_epsilon: float = 1e-8

    def __post_init__(self):
        object.__setattr__(self, "lrs", tuple(self.lrs))
        for key in ("task_epochs", "metrics"):  # a saved record reads back lists
            object.__setattr__(self, key, tuple(tuple(pair) for pair in getattr(self, key)))
        options = dict(seeds="--seeds", batch_size="--ft-batch-size", max_length="--ft-max-length",
                       eval_steps="--eval-steps", max_eval="--max-eval")
        for key, option in options.items():
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{option}={value} must be a positive integer (>= 1)")
        if not (self.epochs > 0 and math.isfinite(self.epochs)):
            raise ConfigError(f"--epochs={self.epochs} must be positive")
        if self.doc_stride < 0:
            raise ConfigError(f"--doc-stride={self.doc_stride} must be >= 0")
        if self.doc_step is not None and (isinstance(self.doc_step, bool) or not isinstance(self.doc_step, int)
                                          or self.doc_step < 1):
            raise ConfigError(f"doc_step={self.doc_step!r} must be a positive integer")

    @classmethod
    def from_args(cls, args) -> FinetuneSettings:
        """The recipe (--ft-recipe) with the command line's overrides applied."""
        r = FINETUNE_RECIPES[args.ft_recipe]
        return cls(lrs=r.learning_rates if args.lrs is None else parse_lrs(args.lrs),
                   seeds=_given(args.seeds, r.seeds), epochs=_given(args.epochs, r.epochs),
                   batch_size=_given(args.ft_batch_size, r.batch_size),
                   max_length=_given(args.ft_max_length, r.max_length), warmup=r.warmup,
                   weight_decay=r.weight_decay, max_grad_norm=r.max_grad_norm,
                   eval_steps=_given(args.eval_steps, r.eval_steps), max_eval=args.max_eval,
                   doc_stride=_given(args.doc_stride, r.doc_stride or DOC_STRIDE),
                   doc_step=r.doc_step if args.doc_stride is None else None,
                   task_epochs=r.task_epochs if args.epochs is None else (),  # --epochs: every task
                   metrics=r.metrics, adam_epsilon=r.adam_epsilon)

    def epochs_for(self, task: str) -> float:
        """The epochs of task `task` (a `TaskSpec.name`): the recipe's for that task, else `epochs`."""
        return float(dict(self.task_epochs).get(task, self.epochs))

    def metric_order(self, spec) -> tuple[str, ...]:
        """The task's metrics with the one that selects (and is reported) first: the recipe's choice for the
        task, else the task's own order."""
        chosen = dict(self.metrics).get(spec.name)
        if chosen is None or chosen not in spec.metrics:
            return tuple(spec.metrics)
        return (chosen, *(m for m in spec.metrics if m != chosen))

    def record(self) -> dict:
        d = asdict(self)
        for key, default in OPTIONAL_FINETUNE.items():
            if d[key] == default:
                del d[key]
        return d


def parse_lrs(text: str) -> tuple[float, ...]:
    """--lrs: a comma-separated list of positive learning rates."""
    try:
        lrs = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--lrs {text!r} is not a comma-separated list of numbers (e.g. 1e-4,3e-4)") from None
    bad = [lr for lr in lrs if not (lr > 0 and math.isfinite(lr))]
    if bad:
        raise ConfigError(f"--lrs {text!r}: {bad[0]:g} is not a positive learning rate (must be > 0)")
    twice = [lr for i, lr in enumerate(lrs) if lr in lrs[:i]]
    if twice:  # one run folder per rate: the grid would count it twice and run it once
        raise ConfigError(f"--lrs {text!r}: {twice[0]:g} is given twice")
    return lrs


@dataclass(frozen=True)
class PretrainJob:
    """One pre-training run: what to train on, where, with which settings, and how to run it."""

    corpus: str
    method: Method
    output_dir: Path
    settings: PretrainSettings
    validation: str | None = None        # held-out text; else split from the corpus
    tokenizer: str | None = None         # a tokenizer to use instead of training one
    seed: int = 0
    device_batch_size: int = 64
    max_documents: int | None = None
    max_validation: int | None = None
    overwrite: bool = False
    quiet: bool = False
    report_to: str = "tensorboard"
    description: str | None = None       # the progress bar's label
    init: str | None = None              # a BERT checkpoint to continue (docs/causal.md)
    device: str | None = None
    precision: str = "fp32"
    deterministic: bool = False
    compile: str | None = None           # torch.compile's mode or backend (runtime.trainer_device_args)
    cache_dir: str | None = None         # prepared shards (dietpe.data.shards)
    packing: str = "full-sentences"
    tokenizer_sample: int | None = None
    tokenizer_type: str = "wordpiece"    # the tokenizer trained unless `tokenizer` is given
    special_tokens: str | None = None    # its special tokens' names, `role=name,...` (default: the type's)
    # the model's config, built (and so validated) once before any work; the tokenizer sets its vocabulary and
    # pad id. None: built when the run starts
    config: DietConfig | None = None

    def __post_init__(self):
        object.__setattr__(self, "output_dir", Path(self.output_dir))
