"""`dietpe compare`: the papers' study in one command. Identical models that differ only in how position and
segments enter (DIET Tables 2 and 5) are pre-trained with masked LM on one corpus and one shared tokenizer,
each with several pre-training seeds, then fine-tuned on each task with the same grid and seeds; the report
opens with the papers' claims, each with its measured effect, a 95% interval and a verdict
(`dietpe.study.claims`), then the table (means and intervals over pre-training seeds), CSV/JSON of every
number and figures.

Without arguments it runs the built-in study (docs/study.md): a generated corpus and five tasks
(`dietpe.data.synthetic`), the rows the claims need, 3 pre-training seeds, in about 17 minutes on two
idle CPU cores; `--budget N` scales it up. Every finished pre-training and fine-tuning run is kept on disk, so
rerunning the command after a kill continues where it stopped.

This module reads the command line into settings; the study itself is `dietpe.study` (the plan of runs in
`scheduler`, the numbers in `results`, the report and figures in `report` and `plots`).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from dietpe import validate as V
from dietpe.commands import BUILTIN_SIZE, BUILTIN_TASKS
from dietpe.data.tasks import TaskData, load_task
from dietpe.errors import ConfigError
from dietpe.methods import Method, parse_methods
from dietpe.positions.encoding import check_length
from dietpe.study import claims as CL
from dietpe.study import scheduler
from dietpe.study.report import markdown_table, write_report
from dietpe.study.results import aggregate, chance_score, claim_rows, task_score
from dietpe.tasks import finetune as ft
from dietpe.tasks import pretrain as pt
from dietpe.tasks.checkpoints import check_run_settings, local_path
from dietpe.tasks.recipes import PRETRAIN_RECIPES
from dietpe.tasks.runtime import is_main_process, set_threads, trainer_device_args
from dietpe.tasks.settings import FinetuneSettings, PretrainSettings


def main(args) -> int:
    V.refuse_unused(args, {"data_dir": "--data-dir"}, "without --suite xtreme")
    out = V.check_output_dir(args.output_dir, "-o")
    if args.cache_dir:
        V.check_output_dir(args.cache_dir, "--cache-dir")
    with V.created_only_on_success(out, disposable=("run_settings.json",)):
        return _main(args)


def check_data_options(args) -> bool:
    """The built-in data (neither --corpus nor --tasks) or the user's (both); the options that do not apply to
    it refused and the rest filled in. Returns whether the data is built in."""
    builtin = args.corpus is None and args.tasks is None
    if (args.corpus is None) != (args.tasks is None):
        raise ConfigError("give both --corpus and --tasks, or neither (the built-in data)")
    if not builtin:
        V.refuse_unused(args, {"builtin_size": "--builtin-size"}, "with --corpus and --tasks: no data is generated")
    else:
        V.refuse_unused(args, {"train_split": "--train-split", "eval_split": "--eval-split",
                               "train_language": "--train-language"},
                        "to the built-in tasks: they have one training and one evaluation file each")
        V.refuse_unused(args, {"languages": "--languages", "language_alpha": "--language-alpha"},
                        "to the built-in study: its corpus is generated (--suite xtreme is the multilingual one)")
    pt.refuse_unused_options(args)
    args.builtin_size = args.builtin_size or BUILTIN_SIZE
    args.train_split, args.eval_split = args.train_split or "train", args.eval_split or "dev"
    args.train_language = args.train_language or "en"
    return builtin


def study_settings(args, builtin: bool) -> tuple[list[Method], list[int], PretrainSettings, FinetuneSettings, dict]:
    """The methods, pre-training seeds and settings: --budget's defaults (`scheduler.budget_defaults`) unless
    the command line says otherwise; every method's model config built (and so checked) once before any work,
    by method name."""
    budget = args.budget
    defaults = scheduler.budget_defaults(budget, builtin)
    if getattr(args, "plan", None):
        defaults.update(scheduler.plan_defaults(args.plan, builtin, budget))
        args.max_validation = args.max_validation or defaults["max_validation"]
    args.recipe = args.recipe or defaults["recipe"]
    args.ft_recipe = args.ft_recipe or defaults["ft_recipe"]
    methods = parse_methods(defaults["methods"] if args.methods is None else args.methods)  # "" is refused
    if budget > 1 and args.steps is None:
        r = PRETRAIN_RECIPES[args.recipe]
        args.steps = r.max_steps * budget
        if args.save_steps is None:
            args.save_steps = min(r.save_steps, r.max_steps) * budget
    n_seeds = args.pretrain_seeds or defaults["pretrain_seeds"]
    pretrain_seeds = [args.seed + k for k in range(n_seeds)]
    s_pre, s_ft = PretrainSettings.from_args(args), FinetuneSettings.from_args(args)
    configs = {}
    for m in methods:
        # the pre-trained models' tables end at the pre-training length
        check_length(m.position, s_ft.max_length, s_pre.positions, "fine-tuning length ",
                     "lower --ft-max-length or raise --max-length (or --max-positions)", ConfigError)
        configs[m.name] = pt.check_before_work(m, s_pre, args.device_batch_size, args.device,
                                               not args.ignore_memory_check)
    return methods, pretrain_seeds, s_pre, s_ft, configs


def study_data(args, out: Path, builtin: bool, s_ft: FinetuneSettings) -> tuple[str, dict[str, TaskData]]:
    """The corpus and every task, read (or generated) before any training: a bad file is reported first."""
    from dietpe.data.synthetic import write_builtin

    if builtin:
        paths = write_builtin(out / "data", seed=args.seed, train=args.builtin_size,
                              dev=max(100, min(500, args.builtin_size // 2)))
        corpus = str(paths["corpus"])
        task_args = [(str(paths[t]), t) for t in BUILTIN_TASKS]
    else:
        corpus = pt.corpus_of(args)
        task_args = [(spec.partition("=")[0], spec.partition("=")[2] or None) for spec in args.tasks]
    tasks = {}
    for path, name in task_args:
        data = load_task(path, name, train_split=args.train_split, eval_split=args.eval_split,
                         train_language=args.train_language, max_train=args.max_train)
        if data.spec.name in tasks:
            raise ConfigError(f"task {data.spec.name} given twice")
        tasks[data.spec.name] = data
    ft.refuse_unused_options(args, list(tasks.values()))
    ft.check_tasks(tasks, s_ft)  # refused now rather than after every method's pre-training
    return corpus, tasks


def tokenizer_record(args) -> dict:
    """The tokenizer type, corpus languages and special tokens, recorded only when used (so that studies
    begun before they existed still continue)."""
    record = {"tokenizer_type": pt.tokenizer_type(args)} if pt.tokenizer_type(args) != "wordpiece" else {}
    for key in ("languages", "language_alpha", "special_tokens"):
        if getattr(args, key, None) is not None:
            record[key] = getattr(args, key)
    return record


def _main(args) -> int:
    start = time.time()
    set_threads(args.threads)
    trainer_device_args(args.device, args.precision, args.deterministic)  # refuse a missing CUDA first
    out = Path(args.output_dir)
    builtin = check_data_options(args)
    methods, pretrain_seeds, s_pre, s_ft, configs = study_settings(args, builtin)
    # What the shared data depends on, recorded before anything is written (each pre-training and fine-tuning
    # folder inside records its own settings): a rerun with another corpus or vocabulary is refused.
    check_run_settings(out, dict(
        task="compare", builtin=builtin, builtin_size=args.builtin_size if builtin else None,
        corpus=local_path(args.corpus), tokenizer=local_path(args.tokenizer), vocab_size=s_pre.vocab_size,
        max_length=s_pre.max_length, max_documents=args.max_documents, max_validation=args.max_validation,
        seed=args.seed, **tokenizer_record(args)), "another -o (or delete the folder)",
        products=("tokenizer", "pretrain", "finetune", "report.md"))
    corpus, tasks = study_data(args, out, builtin, s_ft)
    task_names = list(tasks)

    log = (lambda m: print(f"[compare] {m}", file=sys.stderr)) if is_main_process() else (lambda m: None)
    out.mkdir(parents=True, exist_ok=True)
    prepared = pt.prepare_data(corpus, None, args.tokenizer, s_pre.vocab_size, s_pre.max_length, out,
                               args.max_documents, log, args.max_validation, cache_dir=args.cache_dir,
                               packing=args.packing, tokenizer_sample=args.tokenizer_sample,
                               tokenizer_type=pt.tokenizer_type(args), special_tokens=args.special_tokens)
    units = scheduler.plan(methods, pretrain_seeds)
    jobs = scheduler.job_count(args.jobs, len(units), args.threads)
    info = dict(command="dietpe " + " ".join(shlex.quote(a) for a in sys.argv[1:]), corpus=corpus, builtin=builtin,
                tasks={t: d.source for t, d in tasks.items()}, methods=[m.name for m in methods],
                chance={t: chance_score(d, s_ft.metric_order(d.spec)[0], s_ft.max_eval) for t, d in tasks.items()},
                pretrain=s_pre.record(), finetune=s_ft.record(), pretrain_seeds=pretrain_seeds,
                budget=args.budget, seconds=0.0, processes=int(os.environ.get("WORLD_SIZE", "1")),
                jobs=jobs, threads=args.threads)
    schedule = scheduler.schedule_for(args, corpus, out, s_pre, s_ft, configs,
                                      (len(methods), len(pretrain_seeds), len(tasks)), len(units), jobs, log)
    done: dict[tuple[str, int], dict] = {}

    def finished(i: int, unit: dict) -> None:
        done[(unit["method"], unit["seed"])] = unit
        info["seconds"] = time.time() - start
        if is_main_process():
            write_report(out, aggregate(methods, done, task_names), task_names, info, final=len(done) == len(units))
            log(f"[{len(done)}/{len(units)}] {unit['method']} seed {unit['seed']}: MLM loss "
                f"{unit['val_loss']:.3f}; " + ", ".join(f"{t} {task_score(unit['tasks'][t]):.1f}" for t in task_names)
                + f" ({info['seconds'] / 60:.1f} min so far)")

    scheduler.run_all(schedule, units, tasks, prepared, jobs, finished)
    if is_main_process():
        rows = aggregate(methods, done, task_names)
        print(CL.claims_markdown(claim_rows(rows))[0])
        print(markdown_table(rows, task_names, info["chance"]))
        print(f"\nreport: {out / 'report.md'} ({info['seconds'] / 60:.1f} min)")
    return 0
