"""`dietpe compare --suite xtreme`: the DIET paper's cross-lingual protocol (§4.2, Table 3, Table 5). Every
method is pre-trained with masked LM on one multilingual corpus and one shared tokenizer, with several
pre-training seeds; each pre-trained model is fine-tuned on English only (XNLI: MNLI's training set; QA: SQuAD
v1.1) and evaluated zero-shot in every language of XNLI, XQuAD, MLQA and TyDiQA-GoldP that is given, with the
papers' metrics (accuracy; F1 / exact match). The report opens with the claims of Tables 3 and 5, each with its
measured effect, 95% interval and verdict, then Table 3's layout and one table per task and metric with every
language (`dietpe.study.xtreme`).

Without --corpus and --tasks it runs the built-in suite, which needs no download: the shared data folder's
XNLI and XQuAD (`dietpe.data.xtreme`; `--data-dir`, else found above the working directory), a Unigram
tokenizer and the `xtreme` recipes (docs/xtreme.md). With --corpus (`--languages` for a multilingual one) and
--tasks (`xnli`, `xquad`, `mlqa`, `tydiqa`, each `TASK[=EVAL][@TRAIN]`) it runs on the user's data; `--recipe
paper-multilingual --ft-recipe paper-multilingual` is the paper's set-up. Finished runs are kept on disk: a
rerun after a kill continues where it stopped.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from dietpe import validate as V
from dietpe.data import xtreme as XD
from dietpe.data.tasks import TaskData, load_task
from dietpe.errors import ConfigError
from dietpe.study import scheduler
from dietpe.study import xtreme as XS
from dietpe.methods import parse_method
from dietpe.study.results import aggregate
from dietpe.tasks import finetune as ft
from dietpe.tasks import pretrain as pt
from dietpe.tasks.checkpoints import check_run_settings, local_path
from dietpe.tasks.recipes import PRETRAIN_RECIPES, build_config
from dietpe.tasks.runtime import is_main_process, set_threads, trainer_device_args


BUILTIN_MAX_EVAL = 400  # XNLI examples per language the built-in suite evaluates (XQuAD has about 200 questions)


def main(args) -> int:
    out = V.check_output_dir(args.output_dir, "-o")
    if args.cache_dir:
        V.check_output_dir(args.cache_dir, "--cache-dir")
    with V.created_only_on_success(out, disposable=("run_settings.json",)):
        return _main(args)


def check_options(args) -> tuple[bool, int]:
    """Built-in data (neither --corpus nor --tasks) or the user's (both); defaults filled in. Returns whether
    the data is built in, and the model's head size (which the rows' d_p scale with)."""
    builtin = args.corpus is None and args.tasks is None
    if (args.corpus is None) != (args.tasks is None):
        raise ConfigError("give both --corpus and --tasks, or neither (the built-in suite)")
    V.refuse_unused(args, {"builtin_size": "--builtin-size"}, "to --suite xtreme (its built-in data is XNLI and "
                                                              "XQuAD as they are)")
    if builtin:
        V.refuse_unused(args, {"languages": "--languages", "train_split": "--train-split",
                               "eval_split": "--eval-split"}, "to the built-in suite: its data is fixed")
    else:
        V.refuse_unused(args, {"data_dir": "--data-dir"}, "with --corpus and --tasks: no built-in data is read")
        items = [XD.TaskItem.parse(text) for text in args.tasks]  # refused before any work
        names = [i.task.name for i in items]
        if len(set(names)) != len(names):
            raise ConfigError(f"--tasks: {next(n for n in names if names.count(n) > 1)} given twice")
    pt.refuse_unused_options(args)
    args.train_language = args.train_language or "en"
    if builtin and args.train_language != "en":
        raise ConfigError("the built-in suite fine-tunes on English (its only training set); --train-language en")
    if builtin and args.max_eval is None:
        args.max_eval = BUILTIN_MAX_EVAL
    args.recipe = args.recipe or ("xtreme" if builtin else "cpu")
    args.ft_recipe = args.ft_recipe or ("xtreme" if builtin else "cpu")
    if not args.tokenizer:
        args.tokenizer_type = args.tokenizer_type or "unigram"  # language-independent, as the paper's
    head_size = build_config(parse_method("absolute"), args.size or PRETRAIN_RECIPES[args.recipe].size, 64,
                             8, 0).head_size
    max_length = args.max_length or PRETRAIN_RECIPES[args.recipe].max_length
    default = "xtreme-all" if args.budget >= 2 else ("xtreme-core" if builtin else "xtreme")
    args.methods = XS.expand_methods(args.methods or default, head_size, max_length)
    return builtin, head_size


def suite_data(args, out: Path, builtin: bool) -> tuple[str, dict[str, TaskData], str]:
    """The corpus, every task (read before any training: a bad file is reported first) and a note on the data."""
    if builtin:
        data_dir = XD.find_data_dir(args.data_dir)
        paths = XD.write_builtin(data_dir, out / "data")
        from dietpe.data.multilingual import corpus_source
        corpus = corpus_source(str(paths["corpus"]), ",".join(paths["languages"]), args.language_alpha)
        tasks = {"XNLI": load_task(str(paths["xnli"]), "xnli", train_split="train", eval_split="dev",
                                   max_train=args.max_train),
                 "XQuAD": load_task(str(paths["xquad"]), "qa", train_split="train", max_train=args.max_train)}
        note = (f"Built in from {data_dir} (docs/xtreme.md): the unlabelled XNLI test sentences of 15 languages "
                f"and the contexts of XQuAD's training articles; XNLI's labelled development set split by premise "
                f"(2/3 trained on in English, 1/3 evaluated in every language) and XQuAD's by article (5/6 and 1/6), "
                f"so no evaluated example, in any language, is trained on or pre-trained on.")
        return corpus, tasks, note
    corpus = pt.corpus_of(args)
    tasks: dict[str, TaskData] = {}
    for text in args.tasks:
        item = XD.TaskItem.parse(text)
        tasks[item.task.name] = XD.load_item(item, args.train_split or "train",
                                             args.eval_split or item.task.local_eval_split,
                                             args.train_language, args.max_train)
    return corpus, tasks, ""


def _main(args) -> int:
    start = time.time()
    set_threads(args.threads)
    trainer_device_args(args.device, args.precision, args.deterministic)
    out = Path(args.output_dir)
    builtin, head_size = check_options(args)
    from dietpe.tasks.compare import study_settings
    methods, pretrain_seeds, s_pre, s_ft, configs = study_settings(args, builtin)
    check_run_settings(out, dict(
        task="compare --suite xtreme", builtin=builtin, corpus=local_path(args.corpus), tasks=args.tasks,
        languages=args.languages, language_alpha=args.language_alpha, tokenizer=local_path(args.tokenizer),
        tokenizer_type=args.tokenizer_type, vocab_size=s_pre.vocab_size, max_length=s_pre.max_length,
        max_documents=args.max_documents, max_validation=args.max_validation, seed=args.seed),
        "another -o (or delete the folder)", products=("tokenizer", "pretrain", "finetune", "report.md"))
    corpus, tasks, note = suite_data(args, out, builtin)
    ft.refuse_unused_options(args, list(tasks.values()))
    ft.check_tasks(tasks, s_ft)  # refused now rather than after every method's pre-training
    log = (lambda m: print(f"[xtreme] {m}", file=sys.stderr)) if is_main_process() else (lambda m: None)
    out.mkdir(parents=True, exist_ok=True)
    prepared = pt.prepare_data(corpus, None, args.tokenizer, s_pre.vocab_size, s_pre.max_length, out,
                               args.max_documents, log, args.max_validation, cache_dir=args.cache_dir,
                               packing=args.packing, tokenizer_sample=args.tokenizer_sample,
                               tokenizer_type=pt.tokenizer_type(args), special_tokens=args.special_tokens)
    info = run_info(args, corpus, tasks, note, s_pre, s_ft, pretrain_seeds, prepared, builtin)
    units = scheduler.plan(methods, pretrain_seeds)
    info["jobs"] = jobs = scheduler.job_count(args.jobs, len(units), args.threads)
    claims = XS.xtreme_claims(head_size, s_pre.max_length)
    schedule = scheduler.schedule_for(args, corpus, out, s_pre, s_ft, configs,
                                      (len(methods), len(pretrain_seeds), len(tasks)), len(units), jobs, log)
    done: dict[tuple[str, int], dict] = {}
    measures = XS.measures_for(args.train_language)

    def finished(i: int, unit: dict) -> None:
        done[(unit["method"], unit["seed"])] = unit
        info["seconds"] = time.time() - start
        if is_main_process():
            rows = aggregate(methods, done, list(tasks), measures)
            XS.write_report(out, rows, info, claims, final=len(done) == len(units))
            m = rows and next(r for r in rows if r["method"] == unit["method"])["seeds"][unit["seed"]]
            log(f"[{len(done)}/{len(units)}] {unit['method']} seed {unit['seed']}: MLM loss {unit['val_loss']:.3f}; "
                f"Avg {m.get('score', float('nan')):.1f}, zero-shot {m.get('zero_shot_score', float('nan')):.1f} "
                f"({info['seconds'] / 60:.1f} min so far)")

    scheduler.run_all(schedule, units, tasks, prepared, jobs, finished)
    if is_main_process():
        rows = aggregate(methods, done, list(tasks), measures)
        print(XS.claims_section(rows, claims)[0])
        print(XS.overview_table(rows, info["tasks"]))
        print(f"\nreport: {out / 'report.md'} ({info['seconds'] / 60:.1f} min)")
    return 0


def run_info(args, corpus: str, tasks: dict, note: str, s_pre, s_ft, pretrain_seeds, prepared, builtin) -> dict:
    """What the report states: the command, data, settings and the languages' sampling."""
    from dietpe.data import multilingual

    mixture = multilingual.describe(corpus) if multilingual.is_mixture(corpus) else None
    origin = prepared.manifest["key"]["data"]["train"]["origin"]
    tok = prepared.tokenizer
    kind = type(tok.backend_tokenizer.model).__name__
    return dict(command="dietpe " + " ".join(shlex.quote(a) for a in sys.argv[1:]), corpus=corpus, builtin=builtin,
                corpus_text=origin, data_note=note, mixture=mixture,
                alpha=multilingual.Mixture.parse(corpus).alpha if mixture else None,
                tasks={t: XS.task_info(t, d, args.train_language, s_ft.max_eval) for t, d in tasks.items()},
                train_language=args.train_language, tokenizer=f"{kind}, {len(tok):,} tokens",
                methods=args.methods.split(","), pretrain=s_pre.record(), finetune=s_ft.record(),
                pretrain_seeds=pretrain_seeds, budget=args.budget, seconds=0.0,
                processes=int(os.environ.get("WORLD_SIZE", "1")), threads=args.threads)
