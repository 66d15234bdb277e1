"""`dietpe compare`: the papers' study in one command. Identical models that differ only in how position and
segments enter (DIET Tables 2 and 5) are pre-trained with masked LM on one corpus and one shared tokenizer,
each with several pre-training seeds, then fine-tuned on each task with the same grid and seeds; the report
opens with the papers' claims, each with its measured effect, a 95% interval and a verdict
(`dietpe.tasks.claims`), then the table (means and intervals over pre-training seeds), CSV/JSON of every
number and figures.

Without arguments it runs the built-in study (docs/study.md): a generated corpus and five tasks
(`dietpe.data.synthetic`), the rows the claims need, 3 pre-training seeds, in about 17 minutes on two
idle CPU cores; `--budget N` scales it up. Every finished pre-training and fine-tuning run is kept on disk, so
rerunning the command after a kill continues where it stopped.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shlex
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from dietpe import validate as V
from dietpe.analysis import stats
from dietpe.commands import BUILTIN_SIZE, BUILTIN_TASKS
from dietpe.analysis.style import method_styles
from dietpe.data.tasks import load_task
from dietpe.errors import ConfigError, DataError
from dietpe.methods import Method, parse_methods
from dietpe.positions.encoding import check_length
from dietpe.positions.registry import REGISTRY
from dietpe.tasks import claims as CL
from dietpe.tasks import finetune as ft
from dietpe.tasks import pretrain as pt
from dietpe.tasks.checkpoints import check_run_settings, local_path, write_json_atomic
from dietpe.tasks.runtime import is_main_process, set_threads, trainer_device_args


# -- numbers -------------------------------------------------------------------------------------------------

def position_place(method: Method) -> str:
    if method.position == "none":
        return "none"
    return "per-head" if REGISTRY[method.position].per_head else "input"


def task_score(summary: dict) -> float:
    """A task's number for one pre-trained model: its first metric, averaged over evaluation sets, at the
    best learning rate (median over fine-tuning seeds)."""
    return float(summary["averaged"][summary["metrics"][0]])


def seed_measures(unit: dict, task_names: list[str]) -> dict:
    """One pre-training seed's numbers, as the claims read them (`dietpe.tasks.claims.MEASURES`)."""
    m = {"mlm": unit["val_loss"]}
    evals = unit["curves"].get("eval_loss") or []
    if evals:
        m["early_mlm"] = evals[0][1]
    scores = [task_score(unit["tasks"][t]) for t in task_names if t in unit["tasks"]]
    if scores and len(scores) == len(task_names):
        m["score"] = float(np.mean(scores))
    for t in task_names:
        if t in unit["tasks"]:
            m[f"task:{t}"] = task_score(unit["tasks"][t])
    if unit.get("ranks"):
        m["rank"], m["rank_max"] = unit["ranks"]["mean"], unit["ranks"]["max"]
    return m


def aggregate(methods: list[Method], units: dict, task_names: list[str]) -> list[dict]:
    """Per method: the per-seed measures and their means with 95% t intervals."""
    rows = []
    for method in methods:
        mine = {seed: u for (name, seed), u in sorted(units.items()) if name == method.name}
        if not mine:
            continue
        first = next(iter(mine.values()))
        seeds = {seed: seed_measures(u, task_names) for seed, u in mine.items()}
        keys = sorted({k for v in seeds.values() for k in v})
        est = {k: stats.t_interval([v[k] for v in seeds.values() if k in v]) for k in keys
               if any(k in v for v in seeds.values())}
        rows.append(dict(method=method.name, position=method.position, place=position_place(method),
                         segment=method.segment, sharing=method.sharing, parameters=first["parameters"],
                         head_size=first["head_size"], position_rank=first.get("position_rank") or 0,
                         seeds=seeds, estimates={k: [e.mean, e.low, e.high, e.n] for k, e in est.items()},
                         curves={seed: u["curves"] for seed, u in mine.items()},
                         analysis={seed: u["analysis"] for seed, u in mine.items() if u.get("analysis")},
                         tasks={seed: u["tasks"] for seed, u in mine.items()}))
    return rows


def est_cell(row: dict, key: str, digits: int = 3) -> str:
    e = row["estimates"].get(key)
    if not e:
        return "…"
    mean, low, high, n = e
    if n < 2 or low is None or math.isnan(low):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {(high - low) / 2:.{digits}f}"


# A task cell is marked at chance when its 95% interval reaches up to chance + this many points (with one seed,
# no interval: when its mean does): the model may have learnt nothing about that task.
CHANCE_MARGIN = 1.0
CHANCE_MARK = "†"


def chance_score(data) -> float:
    """A task's chance: the best constant predictor's first metric on its evaluation labels (majority-class
    accuracy, all-positive F1, 0 for Matthews or a correlation), averaged over evaluation sets as `task_score`
    averages; 0 for span QA (a constant answer matches no span)."""
    from dietpe.data import metrics as M

    spec = data.spec
    if spec.kind == "qa":
        return 0.0
    primary = spec.metrics[0]
    scores = [M.chance([primary], [ex.label for ex in examples], spec.num_labels)[primary]
              for examples in data.evals.values() if examples]
    return float(np.mean(scores)) if scores else float("nan")


def at_chance(row: dict, key: str, chance: float | None) -> bool:
    e = row["estimates"].get(key)
    if not e or chance is None or math.isnan(chance):
        return False
    mean, low, high, n = e
    reach = mean if n < 2 or low is None or math.isnan(low) else low
    return reach <= chance + CHANCE_MARGIN


def markdown_table(rows: list[dict], task_names: list[str], chance: dict[str, float] | None = None) -> str:
    """The results table; with `chance` (task -> chance score), task cells at chance are marked and a last
    row gives each task's chance."""
    chance = chance or {}
    head = ["Method", "Position", "Segment", "Sharing", "Params", "Seeds", "MLM loss", "MLM @1st eval"] + \
        task_names + ["Avg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        vals = [r["method"], r["place"], r["segment"], r["sharing"], f"{r['parameters'] / 1e6:.3f}M",
                str(len(r["seeds"])), est_cell(r, "mlm"), est_cell(r, "early_mlm")]
        vals += [est_cell(r, f"task:{t}", 1) + (f" {CHANCE_MARK}" if at_chance(r, f"task:{t}", chance.get(t)) else "")
                 for t in task_names] + [est_cell(r, "score", 1)]
        lines.append("| " + " | ".join(vals) + " |")
    if chance and rows:
        known = [chance[t] for t in task_names if t in chance and not math.isnan(chance[t])]
        vals = ["*chance*", "", "", "", "", "", "", ""]
        vals += [f"*{chance[t]:.1f}*" if t in chance and not math.isnan(chance[t]) else "…" for t in task_names]
        vals += [f"*{np.mean(known):.1f}*" if len(known) == len(task_names) else "…"]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def chance_note(chance: dict[str, float] | None) -> str:
    if not chance:
        return ""
    return (f" *chance*: each task's score of the best constant predictor on its evaluation labels (the "
            f"majority class for accuracy, all-positive for F1, 0 for Matthews and correlations). "
            f"{CHANCE_MARK}: at chance, the cell's 95% interval reaches up to chance + {CHANCE_MARGIN:g} point "
            f"(with one seed, its mean does); such a method has shown nothing on that task, and a difference "
            f"between two such cells says nothing about position.")


def write_csvs(out: Path, rows: list[dict], task_names: list[str]) -> None:
    table = io.StringIO()
    w = csv.writer(table)
    w.writerow(["method", "position", "segment", "sharing", "parameters", "measure", "mean", "ci_low", "ci_high",
                "seeds"])
    seeds = io.StringIO()
    sw = csv.writer(seeds)
    sw.writerow(["method", "pretrain_seed", "measure", "value"])
    runs = io.StringIO()
    rw = csv.writer(runs)
    rw.writerow(["method", "pretrain_seed", "task", "lr", "seed", "best_step", "eval_set", "metric", "value",
                 "seconds"])
    for r in rows:
        for k, (mean, low, high, n) in r["estimates"].items():
            w.writerow([r["method"], r["position"], r["segment"], r["sharing"], r["parameters"], k, f"{mean:.5f}",
                        "" if math.isnan(low) else f"{low:.5f}", "" if math.isnan(high) else f"{high:.5f}", n])
        for seed, measures in r["seeds"].items():
            for k, v in measures.items():
                sw.writerow([r["method"], seed, k, f"{v:.5f}"])
        for seed, tasks in r["tasks"].items():
            for t in task_names:
                s = tasks.get(t)
                for run in (s or {}).get("runs", []):
                    for name, values in run["best"]["metrics"].items():
                        for k, v in values.items():
                            rw.writerow([r["method"], seed, t, run["lr"], run["seed"], run["best"]["step"], name,
                                         k, f"{v:.4f}", f"{run['seconds']:.1f}"])
    (out / "results.csv").write_text(table.getvalue(), encoding="utf-8")
    (out / "seeds.csv").write_text(seeds.getvalue(), encoding="utf-8")
    (out / "runs.csv").write_text(runs.getvalue(), encoding="utf-8")


# -- figures -------------------------------------------------------------------------------------------------

def plot_figures(out: Path, rows: list[dict], task_names: list[str], forest: list[tuple]) -> list[str]:
    from dietpe.extras import need

    need("matplotlib").use("Agg")
    import matplotlib.pyplot as plt

    styles = method_styles([r["method"] for r in rows])
    files = []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for r in rows:
        colour, marker = styles[r["method"]]
        for ax, key in ((ax1, "train_loss"), (ax2, "eval_loss")):
            curves = [c.get(key) or [] for c in r["curves"].values()]
            curves = [c for c in curves if c]
            if not curves:
                continue
            steps = sorted(set.intersection(*({s for s, _ in c} for c in curves)))
            if not steps:
                continue
            values = np.array([[dict(c)[s] for s in steps] for c in curves])
            mean = values.mean(0)
            ax.plot(steps, mean, color=colour, marker=marker, ms=4 if key == "eval_loss" else 0,
                    markevery=1 if key == "eval_loss" else max(1, len(steps) // 6), lw=1.2, label=r["method"])
            if len(curves) > 1:
                ax.fill_between(steps, values.min(0), values.max(0), color=colour, alpha=0.15, lw=0)
    for ax, title in ((ax1, "pre-training loss (train)"), (ax2, "validation MLM loss")):
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.set_title(title + ": mean over seeds, band = min..max")
        ax.grid(alpha=0.3)
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "pretrain_loss.png", dpi=110)
    plt.close(fig)
    files.append("pretrain_loss.png")

    if forest:
        measures = list(dict.fromkeys(m for *_, m in forest))
        heights = [sum(1 for *_, m in forest if m == x) for x in measures]
        fig, axes = plt.subplots(len(measures), 1, figsize=(13, 1.2 + 0.5 * len(forest) + 0.6 * len(measures)),
                                 gridspec_kw={"height_ratios": heights}, squeeze=False, layout="constrained")
        colours = {stats.SUPPORTED: "tab:green", stats.CONTRADICTED: "tab:red"}
        for ax, measure in zip(axes[:, 0], measures):
            items = [f for f in forest if f[3] == measure]
            for y, (label, e, verdict, _) in enumerate(reversed(items)):
                c = colours.get(verdict, "tab:grey")
                lo = e.mean if math.isnan(e.low) else e.low
                hi = e.mean if math.isnan(e.high) else e.high
                ax.errorbar([e.mean], [y], xerr=[[e.mean - lo], [hi - e.mean]], fmt="o", color=c, capsize=3)
            ax.set_yticks(range(len(items)))
            ax.set_ylim(-0.6, len(items) - 0.4)
            # long labels (the rank-saturation contrast) wrapped so that none is cut at the figure's edge
            ax.set_yticklabels([textwrap.fill(f[0], 52) for f in reversed(items)], fontsize=7)
            ax.axvline(0, color="k", lw=0.7)
            ax.set_xlabel(f"{measure}: difference in {CL.MEASURES[measure][0]} "
                          f"({'higher' if CL.MEASURES[measure][1] else 'lower'} is better)", fontsize=8)
            ax.grid(alpha=0.3, axis="x")
        fig.suptitle("claims: mean difference over pre-training seeds, 95% t interval; green supported, red "
                     "contradicted, grey not resolved", fontsize=9)
        fig.savefig(out / "claims_forest.png", dpi=110)
        plt.close(fig)
        files.append("claims_forest.png")

    for t in task_names:
        fig, ax = plt.subplots(figsize=(8, 0.5 + 0.35 * len(rows)))
        for y, r in enumerate(reversed(rows)):
            colour, marker = styles[r["method"]]
            vals = [v[f"task:{t}"] for v in r["seeds"].values() if f"task:{t}" in v]
            if not vals:
                continue
            ax.scatter(vals, [y] * len(vals), color=colour, marker=marker, s=22, alpha=0.6)
            e = stats.t_interval(vals)
            if e.n > 1:
                ax.errorbar([e.mean], [y], xerr=[[e.mean - e.low], [e.high - e.mean]], color=colour, capsize=3)
            ax.plot([e.mean], [y], color=colour, marker="|", ms=14)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([r["method"] for r in reversed(rows)], fontsize=7)
        ax.set_xlabel(f"{t} dev score: one point per pre-training seed, bar = mean and 95% t interval")
        ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        name = f"finetune_{t}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)
    return files


# -- report --------------------------------------------------------------------------------------------------

def claim_rows(rows: list[dict]) -> dict[str, dict]:
    return {r["method"]: {"seeds": r["seeds"], "head_size": r["head_size"], "position_rank": r["position_rank"]}
            for r in rows}


def environment(info: dict) -> str:
    """The report's environment block: what a reader needs to rerun it and compare."""
    import platform

    import torch
    import transformers

    from dietpe import __version__

    seeds = ", ".join(map(str, info.get("pretrain_seeds", [])))
    fine = info.get("finetune", {}).get("seeds")
    return "\n".join([
        "| | |", "|---|---|",
        f"| dietpe | {__version__} |", f"| torch | {torch.__version__} |",
        f"| transformers | {transformers.__version__} |", f"| Python | {platform.python_version()} |",
        f"| threads per process | {info.get('threads') or torch.get_num_threads()} |",
        f"| processes (runs at a time) | {info.get('jobs', 1)} |",
        f"| pre-training seeds | {seeds} |",
        f"| fine-tuning seeds per learning rate | {fine if fine is not None else '—'} |",
        f"| command | `{info.get('command', '')}` |"])


def write_report(out: Path, rows: list[dict], task_names: list[str], info: dict, final: bool) -> None:
    claims_md, forest = CL.claims_markdown(claim_rows(rows))
    write_json_atomic(out / "results.json", {"settings": info, "methods": rows})
    write_csvs(out, rows, task_names)
    # figures cost seconds of CPU: drawn for the final report only (partial reports keep the previous ones)
    figures = plot_figures(out, rows, task_names, forest) if rows and final else []
    status = "" if final else "\n**Partial report: the comparison is still running or was interrupted; rerun " \
                              "the same command to continue.**\n"
    pre, fin = info["pretrain"], info["finetune"]
    logit_scale = pre.get("logit_lr_scale", 1.0)
    scale = (f"parameters added to the attention logits x{logit_scale:g} for every method" if logit_scale != 1
             else "one learning rate for every parameter")
    one_seed = (" With one fine-tuning seed its noise is part of each pre-training seed's number (and so of the "
                "intervals); the papers' median over fine-tuning seeds is `--budget 2` (docs/study.md)."
                if fin["seeds"] == 1 else "")
    text = f"""# dietpe compare: position methods, pre-trained and fine-tuned alike
{status}
Command: `{info['command']}`

Corpus: {info['corpus']}. Tasks: {', '.join(f'{t} ({p})' for t, p in info['tasks'].items())}.
Model: `{pre['size']}` size; {pre['steps']} pre-training steps of batch {pre['batch_size']} x {pre['max_length']}
tokens, lr {pre['lr']:g} ({scale}), warm-up {pre['warmup']:g}, evaluation every
{pre['save_steps']} steps; pre-training seeds {', '.join(map(str, info['pretrain_seeds']))}. Fine-tuning: lr grid
{', '.join(f'{x:g}' for x in fin['lrs'])} x {fin['seeds']} seed(s) per pre-trained model, {fin['epochs']:g} epochs,
batch {fin['batch_size']}.{one_seed} This invocation's wall time: {info['seconds'] / 60:.1f} min, {info.get('jobs', 1)} run(s) at a
time (runs finished by an earlier invocation are reused).

{claims_md}
![claims](claims_forest.png)

## Environment

{environment(info)}

## Results

Mean ± half-width of the 95% t interval over pre-training seeds.

{markdown_table(rows, task_names, info.get("chance"))}

Position: where position enters (`input` embeddings or `per-head` in attention). MLM loss: validation
cross-entropy over masked tokens (same masked positions for every method) at the end, and at the first
evaluation. Task cells: for each pre-trained model, the task's first metric ({', '.join(task_names)}) at the
learning rate whose median over fine-tuning seeds is best (the papers' protocol; averaged over evaluation sets);
then mean over pre-training seeds. Avg: the mean over tasks, per seed, then over seeds.{chance_note(info.get("chance"))}

Files: `results.json` (everything: per-seed measures, intervals, every run), `results.csv` (means and
intervals), `seeds.csv` (per pre-training seed), `runs.csv` (every fine-tuning run), {', '.join(f'`{f}`' for f in figures)}.
Figures share one colour and marker per method.

![pre-training curves](pretrain_loss.png)
"""
    indexes = {r["method"]: r["analysis"][min(r["analysis"])] for r in rows if r.get("analysis")}
    if indexes:
        from dietpe.analysis import compare_section
        text += "\n(Pictures of each method's first pre-training seed.)\n\n" + compare_section(indexes, out)
    if info.get("builtin"):
        text += """
Built-in tasks (docs/study.md): `order` (is the animal or the fruit first), `pair-order` (two segments; which
one puts the animal first), `distance` (are the animal and the fruit adjacent or at least four words apart) and
`start` (is the animal the first word after [CLS]) have the same words under both labels, so `none` (no
position information) stays at chance (the *chance* row); `topic` needs only the words, a control every method should solve.
"""
    (out / "report.md").write_text(text, encoding="utf-8")


# -- main ----------------------------------------------------------------------------------------------------

def budget_defaults(budget: int, builtin: bool) -> dict:
    """What `--budget N` sets unless the command line does (docs/study.md): on the built-in data the study
    recipes and rows, from N = 2 the papers' other rows and fine-tuning protocol, from N = 3 five seeds."""
    return dict(recipe="study" if builtin else "cpu",
                ft_recipe=("study-full" if budget >= 2 else "study") if builtin else "cpu",
                methods=("study+papers" if budget >= 2 else "study") if builtin else "papers",
                pretrain_seeds=5 if budget >= 3 else 3)


def main(args) -> int:
    out = V.check_output_dir(args.output_dir, "-o")
    if args.cache_dir:
        V.check_output_dir(args.cache_dir, "--cache-dir")
    with V.created_only_on_success(out, disposable=("run_settings.json",)):
        return _main(args)


def _main(args) -> int:
    from dietpe.data.synthetic import write_builtin

    start = time.time()
    set_threads(args.threads)
    trainer_device_args(args.device, args.precision, args.deterministic)  # refuse a missing CUDA first
    out = Path(args.output_dir)
    builtin = args.corpus is None and args.tasks is None
    if (args.corpus is None) != (args.tasks is None):
        raise ConfigError("give both --corpus and --tasks, or neither (the built-in data)")
    if not builtin:
        V.refuse_unused(args, {"builtin_size": "--builtin-size"}, "with --corpus and --tasks: no data is generated")
    else:
        V.refuse_unused(args, {"train_split": "--train-split", "eval_split": "--eval-split",
                               "train_language": "--train-language"},
                        "to the built-in tasks: they have one training and one evaluation file each")
    pt.refuse_unused_options(args)
    budget = args.budget
    args.builtin_size = args.builtin_size or BUILTIN_SIZE
    args.train_split, args.eval_split = args.train_split or "train", args.eval_split or "dev"
    args.train_language = args.train_language or "en"
    defaults = budget_defaults(budget, builtin)
    args.recipe = args.recipe or defaults["recipe"]
    args.ft_recipe = args.ft_recipe or defaults["ft_recipe"]
    methods = parse_methods(defaults["methods"] if args.methods is None else args.methods)  # "" is refused
    if budget > 1 and args.steps is None:
        r = pt.PRETRAIN_RECIPES[args.recipe]
        args.steps = r.max_steps * budget
        if args.save_steps is None:
            args.save_steps = min(r.save_steps, r.max_steps) * budget
    n_seeds = args.pretrain_seeds or defaults["pretrain_seeds"]
    pretrain_seeds = [args.seed + k for k in range(n_seeds)]
    s_pre = pt.settings(args)
    s_ft = ft.settings(args)
    for m in methods:
        # the pre-trained models' tables end at the pre-training length
        check_length(m.position, s_ft["max_length"], s_pre["max_length"], "fine-tuning length ",
                     "lower --ft-max-length or raise --max-length", ConfigError)
        pt.check_before_work(m, s_pre, args.device_batch_size, args.device, not args.ignore_memory_check)

    # What the shared data depends on, recorded before anything is written (each pre-training and fine-tuning
    # folder inside records its own settings): a rerun with another corpus or vocabulary is refused.
    check_run_settings(out, dict(
        task="compare", builtin=builtin, builtin_size=args.builtin_size if builtin else None,
        corpus=local_path(args.corpus), tokenizer=local_path(args.tokenizer), vocab_size=s_pre["vocab_size"],
        max_length=s_pre["max_length"], max_documents=args.max_documents, max_validation=args.max_validation,
        seed=args.seed), "another -o (or delete the folder)", products=("tokenizer", "pretrain", "finetune", "report.md"))
    if builtin:
        paths = write_builtin(out / "data", seed=args.seed, train=args.builtin_size,
                              dev=max(100, min(500, args.builtin_size // 2)))
        corpus = str(paths["corpus"])
        task_args = [(str(paths[t]), t) for t in BUILTIN_TASKS]
    else:
        corpus = args.corpus
        task_args = [(spec.partition("=")[0], spec.partition("=")[2] or None) for spec in args.tasks]
    # Read every task first: a bad file is reported before any training.
    tasks = {}
    for path, name in task_args:
        data = load_task(path, name, train_split=args.train_split, eval_split=args.eval_split,
                         train_language=args.train_language, max_train=args.max_train)
        if data.spec.name in tasks:
            raise ConfigError(f"task {data.spec.name} given twice")
        tasks[data.spec.name] = data
    task_names = list(tasks)
    ft.refuse_unused_options(args, list(tasks.values()))
    for name, data in tasks.items():  # refused now rather than after every method's pre-training
        if data.spec.kind != "qa" and len(data.train) < s_ft["batch_size"]:
            raise DataError(f"{data.source}: {len(data.train)} training examples of {name}, fewer than one "
                            f"fine-tuning batch of {s_ft['batch_size']} (--ft-batch-size)")

    log = (lambda m: print(f"[compare] {m}", file=sys.stderr)) if is_main_process() else (lambda m: None)
    out.mkdir(parents=True, exist_ok=True)
    prepared = pt.prepare_data(corpus, None, args.tokenizer, s_pre["vocab_size"], s_pre["max_length"], out,
                               args.max_documents, log, args.max_validation, cache_dir=args.cache_dir,
                               packing=args.packing, tokenizer_sample=args.tokenizer_sample)
    info = dict(command="dietpe " + " ".join(shlex.quote(a) for a in sys.argv[1:]), corpus=corpus, builtin=builtin,
                tasks={t: d.source for t, d in tasks.items()}, methods=[m.name for m in methods],
                chance={t: chance_score(d) for t, d in tasks.items()},
                pretrain=s_pre, finetune={k: v for k, v in s_ft.items()}, pretrain_seeds=pretrain_seeds,
                budget=budget, seconds=0.0, processes=int(os.environ.get("WORLD_SIZE", "1")))
    # seed-major: every method's first seed before any second seed, so a partial report compares all methods
    plan = [(m, seed) for seed in pretrain_seeds for m in methods]
    jobs = args.jobs or max(1, min(len(plan), (os.cpu_count() or 1) // (args.threads or 1)))
    if jobs > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--jobs > 1 runs methods side by side in one launch; under torchrun use --jobs 1")
    info["jobs"] = jobs
    info["threads"] = args.threads
    log(f"{len(methods)} methods x {len(pretrain_seeds)} pre-training seeds x ({len(tasks)} tasks x "
        f"{len(s_ft['lrs'])} lr x {s_ft['seeds']} seeds), {jobs} at a time")
    work = dict(corpus=corpus, out=str(out), s_pre=s_pre, s_ft=s_ft, threads=args.threads,
                device_batch_size=args.device_batch_size, train_language=args.train_language,
                quiet=jobs > 1, total=len(plan), device=args.device, precision=args.precision,
                deterministic=args.deterministic, packing=args.packing)
    units: dict[tuple[str, int], dict] = {}

    def finished(i: int, unit: dict) -> None:
        units[(unit["method"], unit["seed"])] = unit
        info["seconds"] = time.time() - start
        if is_main_process():
            rows = aggregate(methods, units, task_names)
            write_report(out, rows, task_names, info, final=len(units) == len(plan))
            log(f"[{len(units)}/{len(plan)}] {unit['method']} seed {unit['seed']}: MLM loss "
                f"{unit['val_loss']:.3f}; " + ", ".join(f"{t} {task_score(unit['tasks'][t]):.1f}" for t in task_names)
                + f" ({info['seconds'] / 60:.1f} min so far)")

    if jobs == 1:
        for i, (method, seed) in enumerate(plan, 1):
            finished(i, run_unit(i, method, seed, tasks, prepared, work))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_unit, i, m, seed, tasks, prepared, work): i
                       for i, (m, seed) in enumerate(plan, 1)}
            for future in _as_completed(futures):
                finished(futures[future], future.result())
    if is_main_process():
        rows = aggregate(methods, units, task_names)
        print(CL.claims_markdown(claim_rows(rows))[0])
        print(markdown_table(rows, task_names, info["chance"]))
        print(f"\nreport: {out / 'report.md'} ({info['seconds'] / 60:.1f} min)")
    return 0


def _as_completed(futures):
    from concurrent.futures import as_completed
    return as_completed(futures)


def run_unit(i: int, method: Method, seed: int, tasks: dict, prepared, work: dict) -> dict:
    """Pre-train one method with one seed and fine-tune it on every task (in this process or a worker)."""
    set_threads(work["threads"])
    out, n = Path(work["out"]), work["total"]
    tag = f"{method.name} seed {seed}"
    if work["quiet"]:
        print(f"[compare] [{i}/{n}] {tag}: started", file=sys.stderr, flush=True)
    res = pt.run_pretrain(work["corpus"], method, out / "pretrain" / method.slug / f"seed{seed}", work["s_pre"],
                          seed=seed, device_batch_size=work["device_batch_size"], quiet=work["quiet"],
                          description=f"[{i}/{n}] pretrain {tag}", prepared=prepared, device=work["device"],
                          precision=work["precision"], deterministic=work["deterministic"], packing=work["packing"])
    index = analyze_method(res["model_dir"], prepared, out / "analysis" / method.slug / f"seed{seed}", tag,
                           device=work["device"])
    summary = json.loads((index.parent / "summary.json").read_text(encoding="utf-8"))
    full = np.array([[np.nan if v is None else v for v in layer] for layer in summary["ranks"]["full logits"]],
                    dtype=float)
    from dietpe import DietConfig
    config = DietConfig.from_pretrained(res["model_dir"])
    unit = dict(method=method.name, seed=seed, parameters=res["parameters"], val_loss=res["val_loss"],
                perplexity=res["perplexity"], pretrain_seconds=res["seconds"], curves=res["curves"],
                analysis=str(index), head_size=config.head_size,
                position_rank=config.rank if config.position == "diet-abs" else 0,
                ranks=dict(mean=float(np.nanmean(full)), max=float(np.nanmax(full))), tasks={})
    if work["quiet"]:
        print(f"[compare] [{i}/{n}] {tag}: pre-trained, MLM loss {res['val_loss']:.3f} ({res['seconds']:.0f}s); "
              f"fine-tuning", file=sys.stderr, flush=True)
    for name, data in tasks.items():
        folder = out / "finetune" / method.slug / f"seed{seed}" / name
        s = ft.run_finetune(res["model_dir"], data, folder, work["s_ft"], train_language=work["train_language"],
                            quiet=work["quiet"], label=f"[{i}/{n}] {tag} ",
                            device_args=trainer_device_args(work["device"], work["precision"], work["deterministic"]))
        unit["tasks"][name] = s
    return unit


def analyze_method(model_dir, prepared, folder: Path, title: str, batch_size: int = 8,
                   device: str | None = None) -> Path:
    """The papers' pictures (rank, position patterns, segments, cosine) for one pre-trained model, on
    validation windows of the pre-training length; returns the index.md path."""
    import torch

    from dietpe.analysis import report
    from dietpe.models import DietForMaskedLM

    _, _, val_blocks = prepared
    length = max(len(b) for b in val_blocks)
    flat = [t for b in val_blocks for t in b]
    n = min(batch_size, len(flat) // length)
    batch = torch.tensor(flat[: n * length]).view(n, length)
    from dietpe.tasks.runtime import resolve_device
    model = DietForMaskedLM.from_pretrained(model_dir).eval().to(resolve_device(device))
    return report(model, batch, folder, title=title)
