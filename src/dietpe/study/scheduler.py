"""The study's plan: which runs, in which order, how many at a time.

A unit is one method pre-trained with one seed (`dietpe.tasks.pretrain`), analysed (`dietpe.analysis.report`)
and fine-tuned on every task (`dietpe.tasks.finetune`). Units run seed-major (every method's first seed before
any second seed, so a partial report compares all methods), in this process or in spawned workers (`--jobs`).
Every finished run is kept on disk and reused, so a killed study continues where it stopped.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from dietpe.errors import ConfigError
from dietpe.methods import Method
from dietpe.positions.registry import REGISTRY
from dietpe.tasks import finetune as ft
from dietpe.tasks import pretrain as pt
from dietpe.tasks.runtime import set_threads, trainer_device_args
from dietpe.tasks.recipes import STUDY_PLANS
from dietpe.tasks.settings import FinetuneSettings, PretrainJob, PretrainSettings


def budget_defaults(budget: int, builtin: bool) -> dict:
    """What `--budget N` sets unless the command line does (docs/study.md): on the built-in data the study
    recipes and rows, from N = 2 the papers' other rows and fine-tuning protocol, from N = 3 five seeds."""
    return dict(recipe="study" if builtin else "cpu",
                ft_recipe=("study-full" if budget >= 2 else "study") if builtin else "cpu",
                methods=("study+papers" if budget >= 2 else "study") if builtin else "papers",
                pretrain_seeds=5 if budget >= 3 else 3)


def plan_defaults(name: str, builtin: bool, budget: int) -> dict:
    """What --plan NAME sets unless the command line does; refused on the built-in data and with --budget."""
    if builtin:
        raise ConfigError(f"--plan {name} trains on a corpus and tasks you name: give --corpus (e.g. "
                          f"wikitext:wikitext-103-raw-v1) and --tasks (e.g. nyu-mll/glue:cola nyu-mll/glue:stsb)")
    if budget != 1:
        raise ConfigError(f"--plan {name} sets the study's size; --budget {budget} would scale it again: give one")
    return dict(STUDY_PLANS[name])


@dataclass(frozen=True)
class Schedule:
    """What every unit of one study shares (sent to the worker processes as it is)."""

    corpus: str
    out: Path
    pretrain: PretrainSettings
    finetune: FinetuneSettings
    configs: dict           # method name -> its model config, built once before any work (PretrainJob.config)
    threads: int | None
    device_batch_size: int
    train_language: str
    quiet: bool             # workers side by side: one line per stage instead of progress bars
    total: int              # units in the plan
    device: str | None
    precision: str
    deterministic: bool
    packing: str


def schedule_for(args, corpus: str, out: Path, s_pre: PretrainSettings, s_ft: FinetuneSettings, configs: dict,
                 counts: tuple[int, int, int], total: int, jobs: int, log: Callable[[str], None]) -> Schedule:
    """The study's `Schedule` from its command line, logged as methods x seeds x (tasks x lr x seeds)."""
    methods, seeds, tasks = counts
    log(f"{methods} methods x {seeds} pre-training seeds x ({tasks} tasks x {len(s_ft.lrs)} lr x {s_ft.seeds} "
        f"seeds), {jobs} at a time")
    return Schedule(corpus=corpus, out=out, pretrain=s_pre, finetune=s_ft, configs=configs, threads=args.threads,
                    device_batch_size=args.device_batch_size, train_language=args.train_language, quiet=jobs > 1,
                    total=total, device=args.device, precision=args.precision, deterministic=args.deterministic,
                    packing=args.packing)


def plan(methods: list[Method], pretrain_seeds: list[int]) -> list[tuple[Method, int]]:
    """Seed-major: every method's first seed before any second seed."""
    return [(m, seed) for seed in pretrain_seeds for m in methods]


def job_count(jobs: int | None, units: int, threads: int | None) -> int:
    """--jobs, else as many units side by side as the cores hold at --threads each."""
    jobs = jobs or max(1, min(units, (os.cpu_count() or 1) // (threads or 1)))
    if jobs > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--jobs > 1 runs methods side by side in one launch; under torchrun use --jobs 1")
    return jobs


def run_all(schedule: Schedule, units: list[tuple[Method, int]], tasks: dict, prepared, jobs: int,
            finished: Callable[[int, dict], None]) -> None:
    """Every unit, `jobs` at a time; `finished(i, unit)` as each one ends (in the order they end)."""
    if jobs == 1:
        for i, (method, seed) in enumerate(units, 1):
            finished(i, run_unit(i, method, seed, tasks, prepared, schedule))
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(run_unit, i, m, seed, tasks, prepared, schedule): i
                   for i, (m, seed) in enumerate(units, 1)}
        for future in as_completed(futures):
            finished(futures[future], future.result())


def die_with_parent(parent: int) -> None:
    """A worker's initializer: the worker ends once the study's process is gone. A study killed with -9 cannot
    stop its pool, and its workers would go on writing into the folders a restarted study works in."""
    import threading
    import time

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="dietpe-parent-watch").start()


def position_rank(config) -> int:
    """d_p of a method whose per-head positions are a shared low-rank learned table (DIET-ABS); else 0."""
    info = REGISTRY[config.position]
    return getattr(config, "rank", 0) if info.learned_table and info.shareable else 0


def run_unit(i: int, method: Method, seed: int, tasks: dict, prepared, schedule: Schedule) -> dict:
    """Pre-train one method with one seed and fine-tune it on every task (in this process or a worker)."""
    set_threads(schedule.threads)
    out, n, quiet = schedule.out, schedule.total, schedule.quiet
    tag = f"{method.name} seed {seed}"
    if quiet:
        print(f"[compare] [{i}/{n}] {tag}: started", file=sys.stderr, flush=True)
    res = pt.run_pretrain(PretrainJob(
        schedule.corpus, method, out / "pretrain" / method.slug / f"seed{seed}", schedule.pretrain, seed=seed,
        device_batch_size=schedule.device_batch_size, quiet=quiet, description=f"[{i}/{n}] pretrain {tag}",
        device=schedule.device, precision=schedule.precision, deterministic=schedule.deterministic,
        packing=schedule.packing, config=schedule.configs.get(method.name)), prepared)
    index = analyze_method(res["model_dir"], prepared, out / "analysis" / method.slug / f"seed{seed}", tag,
                           device=schedule.device)
    summary = json.loads((index.parent / "summary.json").read_text(encoding="utf-8"))
    full = np.array([[np.nan if v is None else v for v in layer] for layer in summary["ranks"]["full logits"]],
                    dtype=float)
    from dietpe import DietConfig
    config = DietConfig.from_pretrained(res["model_dir"])
    unit = dict(method=method.name, seed=seed, parameters=res["parameters"], val_loss=res["val_loss"],
                perplexity=res["perplexity"], pretrain_seconds=res["seconds"], curves=res["curves"],
                analysis=str(index), head_size=config.head_size, position_rank=position_rank(config),
                ranks=dict(mean=float(np.nanmean(full)), max=float(np.nanmax(full))), tasks={})
    if quiet:
        print(f"[compare] [{i}/{n}] {tag}: pre-trained, MLM loss {res['val_loss']:.3f} ({res['seconds']:.0f}s); "
              f"fine-tuning", file=sys.stderr, flush=True)
    device_args = trainer_device_args(schedule.device, schedule.precision, schedule.deterministic)
    for name, data in tasks.items():
        folder = out / "finetune" / method.slug / f"seed{seed}" / name
        unit["tasks"][name] = ft.run_finetune(res["model_dir"], data, folder, schedule.finetune,
                                              train_language=schedule.train_language, quiet=quiet,
                                              label=f"[{i}/{n}] {tag} ", device_args=device_args)
    return unit


def analyze_method(model_dir, prepared, folder: Path, title: str, batch_size: int = 8,
                   device: str | None = None) -> Path:
    """The papers' pictures (rank, position patterns, segments, cosine) for one pre-trained model, on
    validation windows of the pre-training length; returns the index.md path."""
    import torch

    from dietpe.analysis import report
    from dietpe.models import DietForMaskedLM
    from dietpe.tasks.runtime import resolve_device

    _, _, val_blocks = prepared
    length = max(len(b) for b in val_blocks)
    flat = [t for b in val_blocks for t in b]
    n = min(batch_size, len(flat) // length)
    batch = torch.tensor(flat[: n * length]).view(n, length)
    model = DietForMaskedLM.from_pretrained(model_dir).eval().to(resolve_device(device))
    return report(model, batch, folder, title=title)
