"""`diet compare`: the papers' study in one command. Identical models that differ only in how position and
segments enter (DIET Tables 2 and 5) are pre-trained with masked LM on one corpus and one shared tokenizer,
then fine-tuned on each task with the same grid and seeds; the report gives validation MLM loss and
perplexity, the fine-tuned scores (median over seeds at the best learning rate), CSV/JSON of every number
and loss curves.

Without arguments it generates its own corpus and tasks (`diet.data.synthetic`: word order decides two of
them, the third is a position-free control) and runs offline in about ten minutes on two CPU cores.
Every finished pre-training and fine-tuning run is kept on disk, so rerunning the command after a kill
continues where it stopped.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shlex
import sys
import time
from pathlib import Path

from diet import validate as V
from diet.data.tasks import load_task
from diet.errors import ConfigError, DataError
from diet.methods import Method, parse_methods
from diet.positions.encoding import check_length
from diet.positions.registry import REGISTRY
from diet.tasks import finetune as ft
from diet.tasks import pretrain as pt
from diet.tasks.checkpoints import check_run_settings, local_path, write_json_atomic
from diet.tasks.runtime import add_threads_option, is_main_process, set_threads


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="pre-train and fine-tune every position method; write a report",
                              description=__doc__.splitlines()[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--corpus", help="pre-training corpus (directory, file or Hugging Face name); default: the "
                                    "built-in generated corpus")
    p.add_argument("--tasks", nargs="+", metavar="PATH[=TASK]",
                   help="fine-tuning tasks, each a directory in its official layout (glue/CoLA, xnli, xquad), "
                        "optionally =task-name; default: the built-in order, pair-order and topic tasks")
    p.add_argument("--methods", help="comma-separated method specs or named lists (papers, papers+none, "
                                     "table5); default: papers+none on built-in data, papers otherwise")
    p.add_argument("-o", "--output-dir", default="diet-compare", help="where runs and the report go")
    p.add_argument("--train-split", default="train", help="file prefix of training splits (XNLI: dev)")
    p.add_argument("--eval-split", default="dev", help="file prefix of evaluation splits (XNLI: test)")
    p.add_argument("--train-language", default="en", help="cross-lingual tasks: the language fine-tuned on")
    p.add_argument("--builtin-size", type=V.positive_int, default=2000, help="training examples per built-in task")
    pt.add_pretrain_options(p, recipe_default=None)
    ft.add_finetune_options(p, recipe_default=None)
    add_threads_option(p, default=1)
    p.add_argument("--jobs", type=V.positive_int, help="methods trained side by side, one process each (default: CPU cores "
                                            "/ threads, e.g. 2 on 2 cores)")
    p.set_defaults(func=main)


# -- report --------------------------------------------------------------------------------------------------

def position_place(method: Method) -> str:
    if method.position == "none":
        return "none"
    return "per-head" if REGISTRY[method.position].per_head else "input"


def cell(summary: dict) -> str:
    return " / ".join(f"{summary['averaged'][k]:.1f}" for k in summary["metrics"])


def markdown_table(rows: list[dict], task_names: list[str]) -> str:
    head = ["Method", "Position", "Segment", "Sharing", "Params", "MLM loss", "PPL"] + task_names + ["Avg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        scores = [r["tasks"][t]["score"] for t in task_names if t in r["tasks"]]
        avg = f"{sum(scores) / len(scores):.1f}" if len(scores) == len(task_names) and scores else ""
        vals = [r["method"], r["place"], r["segment"], r["sharing"], f"{r['parameters'] / 1e6:.2f}M",
                f"{r['val_loss']:.3f}", f"{r['perplexity']:.2f}"]
        vals += [cell(r["tasks"][t]) if t in r["tasks"] else "…" for t in task_names] + [avg]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def metric_legend(rows: list[dict], task_names: list[str]) -> str:
    parts = []
    for t in task_names:
        for r in rows:
            if t in r["tasks"]:
                s = r["tasks"][t]
                sets = ", ".join(s["per_set"])
                parts.append(f"{t}: {' / '.join(s['metrics'])} on {sets}")
                break
    return "; ".join(parts)


def write_csvs(out: Path, rows: list[dict], task_names: list[str]) -> None:
    table = io.StringIO()
    w = csv.writer(table)
    w.writerow(["method", "position", "segment", "sharing", "parameters", "val_mlm_loss", "perplexity", "task",
                "eval_set", "metric", "value", "best_lr"])
    runs = io.StringIO()
    rw = csv.writer(runs)
    rw.writerow(["method", "task", "lr", "seed", "best_step", "eval_set", "metric", "value", "seconds"])
    for r in rows:
        base = [r["method"], r["position"], r["segment"], r["sharing"], r["parameters"], f"{r['val_loss']:.5f}",
                f"{r['perplexity']:.4f}"]
        for t in task_names:
            s = r["tasks"].get(t)
            if not s:
                continue
            for name, values in s["per_set"].items():
                for k, v in values.items():
                    w.writerow(base + [t, name, k, f"{v:.4f}", s["best_lr"]])
            for run in s["runs"]:
                for name, values in run["best"]["metrics"].items():
                    for k, v in values.items():
                        rw.writerow([r["method"], t, run["lr"], run["seed"], run["best"]["step"], name, k,
                                     f"{v:.4f}", f"{run['seconds']:.1f}"])
    (out / "results.csv").write_text(table.getvalue(), encoding="utf-8")
    (out / "runs.csv").write_text(runs.getvalue(), encoding="utf-8")


def plot_curves(out: Path, rows: list[dict], task_names: list[str]) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        c = r["curves"]
        if c.get("train_loss"):
            ax1.plot(*zip(*c["train_loss"]), label=r["method"], lw=1)
        if c.get("eval_loss"):
            ax2.plot(*zip(*c["eval_loss"]), marker="o", ms=3, label=r["method"], lw=1)
    for ax, title in ((ax1, "pre-training loss (train)"), (ax2, "validation MLM loss")):
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "pretrain_loss.png", dpi=110)
    plt.close(fig)
    files.append("pretrain_loss.png")
    for t in task_names:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for r in rows:
            s = r["tasks"].get(t)
            if s and s.get("curve"):
                ax.plot(*zip(*s["curve"]), marker="o", ms=3, lw=1, label=r["method"])
        ax.set_xlabel("fine-tuning step")
        ax.set_ylabel(f"{t} dev score ({'/'.join(s['metrics'][:1]) if s else ''})")
        ax.set_title(f"{t}: best learning rate, seed 0")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        name = f"finetune_{t}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(name)
    return files


def write_report(out: Path, rows: list[dict], task_names: list[str], info: dict, final: bool) -> None:
    write_json_atomic(out / "results.json", {"settings": info, "methods": rows})
    write_csvs(out, rows, task_names)
    figures = plot_curves(out, rows, task_names) if rows else []
    status = "" if final else "\n**Partial report: the comparison is still running or was interrupted; rerun " \
                              "the same command to continue.**\n"
    pre, fin = info["pretrain"], info["finetune"]
    text = f"""# diet compare: position methods, pre-trained and fine-tuned alike
{status}
Command: `{info['command']}`

Corpus: {info['corpus']}. Tasks: {', '.join(f'{t} ({p})' for t, p in info['tasks'].items())}.
Model: `{pre['size']}` size; {pre['steps']} pre-training steps of batch {pre['batch_size']} x
{pre['max_length']} tokens, lr {pre['lr']:g}, warm-up {pre['warmup']:g}; fine-tuning lr grid {', '.join(f'{x:g}' for x in fin['lrs'])}
x {fin['seeds']} seed(s), {fin['epochs']:g} epochs, batch {fin['batch_size']}, warm-up {fin['warmup']:g}.
Wall time so far: {info['seconds'] / 60:.1f} min, {info.get('jobs', 1)} method(s) at a time.

{markdown_table(rows, task_names)}

Position: where position enters (`input` embeddings or `per-head` in attention). MLM loss: validation
cross-entropy over masked tokens (same masked positions for every method), PPL = exp(MLM loss).
Task cells: {metric_legend(rows, task_names)}; each number is the median over seeds of a run's best evaluation,
at the learning rate whose median is best (the papers' protocol); several evaluation sets (languages) are
averaged. Avg: mean of the tasks' first metrics.

Files: `results.json` (everything, including per-language scores and every run), `results.csv` (the table's
numbers), `runs.csv` (every fine-tuning run), {', '.join(f'`{f}`' for f in figures)}.
"""
    indexes = {r["method"]: r["analysis"] for r in rows if r.get("analysis")}
    if indexes:
        from diet.analysis import compare_section
        text += "\n" + compare_section(indexes, out)
    if info.get("builtin"):
        text += """
Built-in tasks: `order` (is the animal or the fruit first; the same words either way) and `pair-order` (two
segments, each with an animal and a fruit; which one puts the animal first) need word order, so `none` (no
position information) stays at chance (50); `topic` needs only the words, a control every method should solve.
"""
    (out / "report.md").write_text(text, encoding="utf-8")


# -- main ----------------------------------------------------------------------------------------------------

def main(args) -> int:
    out = V.check_output_dir(args.output_dir, "-o")
    with V.created_only_on_success(out, disposable=("run_settings.json",)):
        return _main(args)


def _main(args) -> int:
    from diet.data.synthetic import write_builtin

    start = time.time()
    set_threads(args.threads)
    out = Path(args.output_dir)
    builtin = args.corpus is None and args.tasks is None
    if (args.corpus is None) != (args.tasks is None):
        raise ConfigError("give both --corpus and --tasks, or neither (the built-in data)")
    args.recipe = args.recipe or ("toy" if builtin else "cpu")
    args.ft_recipe = args.ft_recipe or ("toy" if builtin else "cpu")
    methods = parse_methods(args.methods or ("papers+none" if builtin else "papers"))
    s_pre = pt.settings(args)
    s_ft = ft.settings(args)
    for m in methods:
        # the pre-trained models' tables end at the pre-training length
        check_length(m.position, s_ft["max_length"], s_pre["max_length"], "fine-tuning length ",
                     "lower --ft-max-length or raise --max-length", ConfigError)
        pt.check_before_work(m, s_pre, args.device_batch_size)  # the model at this size, the batch layout

    # What the shared data depends on, recorded before anything is written (each pre-training and fine-tuning
    # folder inside records its own settings): a rerun with another corpus or vocabulary is refused.
    check_run_settings(out, dict(
        task="compare", builtin=builtin, builtin_size=args.builtin_size if builtin else None,
        corpus=local_path(args.corpus), tokenizer=local_path(args.tokenizer), vocab_size=s_pre["vocab_size"],
        max_length=s_pre["max_length"], max_documents=args.max_documents, max_validation=args.max_validation,
        seed=args.seed), "another -o (or delete the folder)", products=("tokenizer", "pretrain", "finetune", "report.md"))
    if builtin:
        paths = write_builtin(out / "data", seed=args.seed, train=args.builtin_size,
                              dev=max(100, min(500, args.builtin_size // 4)))
        corpus = str(paths["corpus"])
        task_args = [(str(paths[t]), t) for t in ("order", "pair-order", "topic")]
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
    for name, data in tasks.items():  # refused now rather than after every method's pre-training
        if data.spec.kind != "qa" and len(data.train) < s_ft["batch_size"]:
            raise DataError(f"{data.source}: {len(data.train)} training examples of {name}, fewer than one "
                            f"fine-tuning batch of {s_ft['batch_size']} (--ft-batch-size)")

    log = (lambda m: print(f"[compare] {m}", file=sys.stderr)) if is_main_process() else (lambda m: None)
    out.mkdir(parents=True, exist_ok=True)
    prepared = pt.prepare_data(corpus, None, args.tokenizer, s_pre["vocab_size"], s_pre["max_length"], out,
                               args.max_documents, log, args.max_validation)
    info = dict(command="diet " + " ".join(shlex.quote(a) for a in sys.argv[1:]), corpus=corpus, builtin=builtin,
                tasks={t: d.source for t, d in tasks.items()}, methods=[m.name for m in methods],
                pretrain=s_pre, finetune={k: v for k, v in s_ft.items()}, seconds=0.0,
                processes=int(os.environ.get("WORLD_SIZE", "1")))
    jobs = args.jobs or max(1, min(len(methods), (os.cpu_count() or 1) // (args.threads or 1)))
    if jobs > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--jobs > 1 runs methods side by side in one launch; under torchrun use --jobs 1")
    info["jobs"] = jobs
    log(f"{len(methods)} methods x ({len(tasks)} tasks x {len(s_ft['lrs'])} lr x {s_ft['seeds']} seeds), "
        f"{jobs} at a time")
    work = dict(corpus=corpus, out=str(out), s_pre=s_pre, s_ft=s_ft, seed=args.seed, threads=args.threads,
                device_batch_size=args.device_batch_size, train_language=args.train_language,
                quiet=jobs > 1, total=len(methods))
    rows: dict[int, dict] = {}

    def finished(i: int, row: dict) -> None:
        rows[i] = row
        info["seconds"] = time.time() - start
        ordered = [rows[k] for k in sorted(rows)]
        if is_main_process():
            write_report(out, ordered, task_names, info, final=len(rows) == len(methods))
            log(f"[{i}/{len(methods)}] {row['method']}: MLM loss {row['val_loss']:.3f}; "
                + ", ".join(f"{t} {cell(row['tasks'][t])}" for t in task_names)
                + f" ({info['seconds'] / 60:.1f} min so far)")

    if jobs == 1:
        for i, method in enumerate(methods, 1):
            finished(i, run_method(i, method, tasks, prepared, work))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_method, i, m, tasks, prepared, work): i for i, m in enumerate(methods, 1)}
            for future in _as_completed(futures):
                finished(futures[future], future.result())
    ordered = [rows[k] for k in sorted(rows)]
    if is_main_process():
        print(markdown_table(ordered, task_names))
        print(f"\nreport: {out / 'report.md'} ({info['seconds'] / 60:.1f} min)")
    return 0


def _as_completed(futures):
    from concurrent.futures import as_completed
    return as_completed(futures)


def run_method(i: int, method: Method, tasks: dict, prepared, work: dict) -> dict:
    """Pre-train one method and fine-tune it on every task (in this process or a worker)."""
    set_threads(work["threads"])
    out, n = Path(work["out"]), work["total"]
    if work["quiet"]:
        print(f"[compare] [{i}/{n}] {method.name}: started", file=sys.stderr, flush=True)
    res = pt.run_pretrain(work["corpus"], method, out / "pretrain" / method.slug, work["s_pre"], seed=work["seed"],
                          device_batch_size=work["device_batch_size"], quiet=work["quiet"],
                          description=f"[{i}/{n}] pretrain {method.name}", prepared=prepared)
    row_analysis = analyze_method(res["model_dir"], prepared, out / "analysis" / method.slug, method.name)
    if work["quiet"]:
        print(f"[compare] [{i}/{n}] {method.name}: pre-trained, MLM loss {res['val_loss']:.3f} "
              f"({res['seconds']:.0f}s); fine-tuning", file=sys.stderr, flush=True)
    row = dict(method=method.name, position=method.position, place=position_place(method),
               segment=method.segment, sharing=method.sharing, parameters=res["parameters"],
               val_loss=res["val_loss"], perplexity=res["perplexity"], pretrain_seconds=res["seconds"],
               curves=res["curves"], analysis=str(row_analysis), tasks={})
    for name, data in tasks.items():
        folder = out / "finetune" / method.slug / name
        summary = ft.run_finetune(res["model_dir"], data, folder, work["s_ft"],
                                  train_language=work["train_language"], quiet=work["quiet"],
                                  label=f"[{i}/{n}] {method.name} ")
        run0 = next(iter(_runs(folder, summary)), None)
        summary["curve"] = [(h["step"], h["score"]) for h in run0["history"]] if run0 else []
        row["tasks"][name] = summary
    return row


def analyze_method(model_dir, prepared, folder: Path, title: str, batch_size: int = 8) -> Path:
    """The papers' pictures (rank, position patterns, segments, cosine) for one pre-trained model, on
    validation windows of the pre-training length; returns the index.md path."""
    import torch

    from diet.analysis import report
    from diet.models import DietForMaskedLM

    _, _, val_blocks = prepared
    length = max(len(b) for b in val_blocks)
    flat = [t for b in val_blocks for t in b]
    n = min(batch_size, len(flat) // length)
    batch = torch.tensor(flat[: n * length]).view(n, length)
    model = DietForMaskedLM.from_pretrained(model_dir).eval()
    return report(model, batch, folder, title=title)


def _runs(folder: Path, summary: dict):
    """The best learning rate's seed-0 run (its full history), for the curves."""
    from diet.tasks.checkpoints import read_json
    path = folder / f"lr{float(summary['best_lr']):g}-seed0" / ft.RESULT
    if path.is_file():
        yield read_json(path)
