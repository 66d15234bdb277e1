"""The study's report: `report.md` (claims, environment, the results table with each task's chance, figures
and the analysis pictures) and `results.json`, rewritten after every finished run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dietpe.study import claims as CL
from dietpe.study.plots import plot_figures
from dietpe.study.results import claim_rows, diverged, write_csvs
from dietpe.tasks.checkpoints import write_json_atomic


def est_cell(row: dict, key: str, digits: int = 3) -> str:
    """mean ± half-width; "(n=k)" when fewer seeds than the row's Seeds column stand behind it."""
    e = row["estimates"].get(key)
    if not e:
        return "…"
    mean, low, high, n = e
    fewer = f" (n={n})" if n < len(row.get("seeds", ())) else ""
    if n < 2 or low is None or math.isnan(low):
        return f"{mean:.{digits}f}{fewer}"
    return f"{mean:.{digits}f} ± {(high - low) / 2:.{digits}f}{fewer}"


# A task cell is marked at chance when its 95% interval reaches up to chance + this many points (with one seed,
# no interval: when its mean does): the model may have learnt nothing about that task.
CHANCE_MARGIN = 1.0
CHANCE_MARK = "†"


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


def diverged_line(rows: list[dict]) -> str:
    found = diverged(rows)
    if not found:
        return "No run diverged."
    return (f"Diverged (a measure not finite), left out of the cells and of the claims' differences: "
            f"{'; '.join(found)}.")


POSITION_TASKS = ("order", "pair-order", "distance", "start")


def none_at_chance(rows: list[dict], task_names: list[str], chance: dict[str, float] | None) -> str:
    """What this run's `none` row shows on the built-in tasks that need position: the design says chance; a
    cell above it is named (it would mean position leaks in some other way, or too few evaluation examples)."""
    row = next((r for r in rows if r["method"] == "none"), None)
    tasks = [t for t in task_names if t in POSITION_TASKS and row and row["estimates"].get(f"task:{t}")]
    if not tasks or not chance:
        return "This run has no `none` row scored on them to show it."
    above = [t for t in tasks if not at_chance(row, f"task:{t}", chance.get(t))]
    if not above:
        return f"In this run `none` is at chance ({CHANCE_MARK}) on {', '.join(tasks)}."
    return (f"In this run `none` is above chance on {', '.join(above)}: read those tasks' differences with "
            f"care.")


def chance_note(chance: dict[str, float] | None) -> str:
    if not chance:
        return ""
    return (f" *chance*: each task's score of the best constant predictor on its evaluation labels (the "
            f"majority class for accuracy, all-positive for F1, 0 for Matthews and correlations). "
            f"{CHANCE_MARK}: at chance, the cell's 95% interval reaches up to chance + {CHANCE_MARGIN:g} point "
            f"(with one seed, its mean does); such a method has shown nothing on that task, and a difference "
            f"between two such cells says nothing about position.")


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

Mean ± half-width of the 95% t interval over pre-training seeds; "(n=k)": only k of the row's seeds have that
measure (a run not finished, failed or diverged). {diverged_line(rows)}

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
        text += f"""
Built-in tasks (docs/study.md): `order` (is the animal or the fruit first), `pair-order` (two segments; which
one puts the animal first), `distance` (are the animal and the fruit adjacent or at least four words apart) and
`start` (is the animal the first word after [CLS]) have the same words under both labels, so a model without
position information should stay at chance on them; `topic` needs only the words, a control every method should
solve. {none_at_chance(rows, task_names, info.get("chance"))}
"""
    (out / "report.md").write_text(text, encoding="utf-8")
