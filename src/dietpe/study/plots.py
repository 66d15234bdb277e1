"""The study's figures, one colour and marker per method (`dietpe.analysis.style`): pre-training curves
(mean over seeds, band = min..max), the claims' forest plot (95% t intervals) and each task's scores per seed."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from dietpe.analysis import stats
from dietpe.analysis.style import method_styles
from dietpe.study import claims as CL


def plot_figures(out: Path, rows: list[dict], task_names: list[str], forest: list[tuple]) -> list[str]:
    """Every figure of the report, written in `out`; returns their file names."""
    from dietpe.extras import need

    need("matplotlib").use("Agg")
    import matplotlib.pyplot as plt

    styles = method_styles([r["method"] for r in rows])
    files = [plot_curves(plt, out, rows, styles)]
    if forest:
        files.append(plot_forest(plt, out, forest))
    return files + plot_task_scores(plt, out, rows, task_names, styles)


def plot_curves(plt, out: Path, rows: list[dict], styles: dict) -> str:
    """Training and validation MLM loss per method."""
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
    return "pretrain_loss.png"



def plot_forest(plt, out: Path, forest: list[tuple]) -> str:
    """Each claim's difference with its 95% interval, one panel per measure."""
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
    return "claims_forest.png"



def plot_task_scores(plt, out: Path, rows: list[dict], task_names: list[str], styles: dict) -> list[str]:
    """Per task: each pre-training seed's score, the mean and its 95% interval, per method."""
    files = []
    for t in task_names:
        fig, ax = plt.subplots(figsize=(8, 0.5 + 0.35 * len(rows)))
        for y, r in enumerate(reversed(rows)):
            colour, marker = styles[r["method"]]
            vals = [v[f"task:{t}"] for v in r["seeds"].values() if f"task:{t}" in v]
            diverged = sum(not math.isfinite(x) for x in vals)
            vals = [x for x in vals if math.isfinite(x)]  # as the table: a diverged seed is left out, and said
            if diverged:
                ax.annotate(f"{diverged} diverged", (0, y), xycoords=("axes fraction", "data"), fontsize=6,
                            color=colour, va="center")
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
