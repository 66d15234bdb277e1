"""What every training job shares at run time: processes (torchrun / accelerate), threads, the global
batch layout, a compact progress bar, small datasets and the loss curves of a run."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback

from dietpe.errors import ConfigError


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
    from dietpe.validate import positive_int

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
