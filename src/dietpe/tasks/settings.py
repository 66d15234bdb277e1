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

    def __post_init__(self):
        scale = self.logit_lr_scale
        if scale != 1 and not (scale > 0 and math.isfinite(scale)):
            raise ConfigError(f"--logit-lr-scale={scale} must be positive and finite")
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
        return cls(size=_given(args.size, r.size), vocab_size=_given(args.vocab_size, r.vocab_size),
                   max_length=_given(args.max_length, r.max_length), steps=steps,
                   batch_size=_given(args.batch_size, r.batch_size), lr=_given(args.lr, r.learning_rate),
                   warmup=_given(args.warmup, r.warmup),
                   save_steps=_given(args.save_steps, min(r.save_steps, steps)), weight_decay=r.weight_decay,
                   adam_epsilon=r.adam_epsilon, max_grad_norm=r.max_grad_norm,
                   logit_lr_scale=_given(getattr(args, "logit_lr_scale", None), r.logit_lr_scale))

    def record(self) -> dict:
        """The saved form; logit_lr_scale only when used, so runs made before the option existed still resume."""
        d = asdict(self)
        if d["logit_lr_scale"] == 1:
            del d["logit_lr_scale"]
        return d


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

    def __post_init__(self):
        object.__setattr__(self, "lrs", tuple(self.lrs))
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

    @classmethod
    def from_args(cls, args) -> FinetuneSettings:
        """The recipe (--ft-recipe) with the command line's overrides applied."""
        r = FINETUNE_RECIPES[args.ft_recipe]
        return cls(lrs=r.learning_rates if args.lrs is None else parse_lrs(args.lrs),
                   seeds=_given(args.seeds, r.seeds), epochs=_given(args.epochs, r.epochs),
                   batch_size=_given(args.ft_batch_size, r.batch_size),
                   max_length=_given(args.ft_max_length, r.max_length), warmup=r.warmup,
                   weight_decay=r.weight_decay, max_grad_norm=r.max_grad_norm, eval_steps=args.eval_steps,
                   max_eval=args.max_eval, doc_stride=_given(args.doc_stride, r.doc_stride or DOC_STRIDE))

    def record(self) -> dict:
        return asdict(self)


def parse_lrs(text: str) -> tuple[float, ...]:
    """--lrs: a comma-separated list of positive learning rates."""
    try:
        lrs = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--lrs {text!r} is not a comma-separated list of numbers (e.g. 1e-4,3e-4)") from None
    bad = [lr for lr in lrs if not (lr > 0 and math.isfinite(lr))]
    if bad:
        raise ConfigError(f"--lrs {text!r}: {bad[0]:g} is not a positive learning rate (must be > 0)")
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
