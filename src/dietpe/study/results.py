"""The study's numbers: per pre-training seed, the measures the claims read (`dietpe.study.claims.MEASURES`);
per method, their means with 95% t intervals (`dietpe.analysis.stats`); each task's chance; the CSVs."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from dietpe.analysis import stats
from dietpe.methods import Method
from dietpe.positions.registry import REGISTRY


def position_place(method: Method) -> str:
    """Where position enters: `none` (no entry point), `input` embeddings, or `per-head` in attention."""
    info = REGISTRY[method.position]
    if not info.entry:
        return "none"
    return "per-head" if info.per_head else "input"


def task_score(summary: dict) -> float:
    """A task's number for one pre-trained model: its first metric, averaged over evaluation sets, at the
    best learning rate (median over fine-tuning seeds)."""
    return float(summary["averaged"][summary["metrics"][0]])


def seed_measures(unit: dict, task_names: list[str]) -> dict:
    """One pre-training seed's numbers, as the claims read them (`dietpe.study.claims.MEASURES`)."""
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


def aggregate(methods: list[Method], units: dict, task_names: list[str], measures=None) -> list[dict]:
    """Per method: the per-seed measures (`measures(unit, task_names)`, default `seed_measures`) and their means
    with 95% t intervals."""
    measures = measures or seed_measures
    rows = []
    for method in methods:
        mine = {seed: u for (name, seed), u in sorted(units.items()) if name == method.name}
        if not mine:
            continue
        first = next(iter(mine.values()))
        seeds = {seed: measures(u, task_names) for seed, u in mine.items()}
        keys = sorted({k for v in seeds.values() for k in v})
        # a seed whose measure is not finite (its pre-training, or its fine-tuning at every learning rate,
        # diverged) is left out; the table says how many seeds stand behind the cell, the report which diverged
        finite = {k: [v[k] for v in seeds.values() if k in v and math.isfinite(v[k])] for k in keys}
        est = {k: stats.t_interval(values) for k, values in finite.items() if values}
        rows.append(dict(method=method.name, position=method.position, place=position_place(method),
                         segment=method.segment, sharing=method.sharing, parameters=first["parameters"],
                         head_size=first["head_size"], position_rank=first.get("position_rank") or 0,
                         seeds=seeds, estimates={k: [e.mean, e.low, e.high, e.n] for k, e in est.items()},
                         curves={seed: u["curves"] for seed, u in mine.items()},
                         analysis={seed: u["analysis"] for seed, u in mine.items() if u.get("analysis")},
                         tasks={seed: u["tasks"] for seed, u in mine.items()}))
    return rows


def diverged(rows: list[dict]) -> list[str]:
    """'method seed S (measures)' for every pre-training seed with a measure that is not finite."""
    found = []
    for r in rows:
        for seed, measures in r["seeds"].items():
            bad = [k for k, v in measures.items() if not math.isfinite(v)]
            if bad:
                found.append(f"`{r['method']}` seed {seed} ({', '.join(bad)})")
    return found


def claim_rows(rows: list[dict]) -> dict[str, dict]:
    """The rows as `dietpe.study.claims.claims_markdown` reads them."""
    return {r["method"]: {"seeds": r["seeds"], "head_size": r["head_size"], "position_rank": r["position_rank"]}
            for r in rows}


def chance_score(data, metric: str | None = None, max_eval: int | None = None) -> float:
    """A task's chance: the best constant predictor's score in `metric` (default: the task's first) on the
    evaluation labels fine-tuning scores (each set's first `max_eval`; majority-class accuracy, all-positive F1,
    0 for Matthews or a correlation), averaged over evaluation sets as `task_score` averages; 0 for span QA (a
    constant answer matches no span)."""
    from dietpe.data import metrics as M

    spec = data.spec
    if spec.kind == "qa":
        return 0.0
    primary = metric or spec.metrics[0]
    scores = [M.chance([primary], [ex.label for ex in examples], spec.num_labels)[primary]
              for examples in data.scored(max_eval).values() if examples]
    return float(np.mean(scores)) if scores else float("nan")


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
