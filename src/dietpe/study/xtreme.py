"""The cross-lingual study (`dietpe compare --suite xtreme`): DIET Tables 3 and 5 as rows, measures, claims and
a report.

Rows. The DIET paper's dimensions scale here with the model's head size d_h (64 in its BERT-base): Table 3's
DIET-ABS has d_p = 128 = 2 d_h with layer-wise sharing; Table 5 varies d_p over d_h, 2 d_h, 4 d_h and 8 d_h (64 to
512); its Linformer rows project keys to a quarter of the length (32 at length 128, the paper's GLUE setting).
`xtreme` is Table 3's rows, `xtreme-table5` Table 5's, `xtreme-all` both and the Linformer rows; `xtreme-core`
(the built-in default) the four Table 3 rows its main claims compare.

Measures, per pre-training seed (each the median over fine-tuning seeds at the best learning rate, as the
English study): each task's metric per language (`XNLI:de:accuracy`, `XQuAD:de:f1`, `XQuAD:de:exact_match`),
its mean over languages (XTREME's average, English included: `XNLI:accuracy`) and over the languages other
than the fine-tuning one (`XNLI:zero-shot:accuracy`), and `score`, Table 3's Avg: the mean of every task's
numbers (XNLI accuracy, then F1 and exact match of each QA task), so that Table 3's claims read it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dietpe.methods import parse_method
from dietpe.study import claims as CL
from dietpe.study.claims import C, Claim, with_mlm
from dietpe.study.report import environment, est_cell
from dietpe.study.results import seed_measures, write_csvs
from dietpe.tasks.checkpoints import write_json_atomic

SHORT = {"accuracy": "acc", "f1": "F1", "exact_match": "EM"}


#: Shaw's row as `papers` has it: ±1024, the range Table 6's parameter count implies (docs/recipes.md)
SHAW = "shaw:shaw_max_distance=1024"


def table3_methods(d_h: int) -> tuple[str, ...]:
    """DIET Table 3's rows: BERT's input positions, Shaw (±1024, as `papers`: Table 6's count), T5, TUPE, DIET-REL
    with input and per-head segments, DIET-ABS with d_p = 2 d_h shared across layers."""
    return ("absolute", SHAW, "t5", "tupe-r", "diet-rel:segment=input", "diet-rel",
            f"diet-abs:sharing=layer:position_rank={2 * d_h}")


def table5_methods(d_h: int) -> tuple[str, ...]:
    """DIET Table 5's rows: DIET-REL's sharing x segments, DIET-ABS's segments, sharing and rank."""
    rel = tuple(f"diet-rel:segment={s}:sharing={h}" for s in ("input", "per-head") for h in ("none", "head", "layer"))
    abs_ = ("diet-abs:segment=input", "diet-abs", f"diet-abs:position_rank={2 * d_h}",
            f"diet-abs:position_rank={8 * d_h}", "diet-abs:segment=input:sharing=layer", "diet-abs:sharing=layer")
    ranks = tuple(f"diet-abs:sharing=layer:position_rank={k * d_h}" for k in (2, 4, 8))
    return rel + abs_ + ranks


def linformer_methods(max_length: int) -> tuple[str, ...]:
    """Table 3's Linformer rows, "(dp=256)" at 512 tokens: k = d_p = half the length (docs/recipes.md)."""
    k = max(1, max_length // 2)
    return (f"absolute:attention=linformer:linformer_k={k}",
            f"diet-abs:segment=input:attention=linformer:linformer_k={k}:position_rank={k}")


def core_methods(d_h: int) -> tuple[str, ...]:
    """The built-in suite's rows: the Table 3 rows its main claims compare (input vs per-head positions,
    input vs per-head segments, DIET-ABS vs DIET-REL), what fits minutes on two CPU cores."""
    return ("absolute", "diet-rel:segment=input", "diet-rel", f"diet-abs:sharing=layer:position_rank={2 * d_h}")


def method_list(name: str, d_h: int, max_length: int) -> tuple[str, ...] | None:
    """A named list of the suite's rows (`xtreme-core`, `xtreme`, `xtreme-table5`, `xtreme-all`), else None."""
    lists = {"xtreme-core": core_methods(d_h), "xtreme": table3_methods(d_h), "xtreme-table5": table5_methods(d_h),
             "xtreme-all": table3_methods(d_h) + table5_methods(d_h) + linformer_methods(max_length)}
    if name not in lists:
        return None
    return tuple(dict.fromkeys(parse_method(s).name for s in lists[name]))


def expand_methods(text: str, d_h: int, max_length: int) -> str:
    """`--methods` with the suite's named lists expanded (other names and specs left to `parse_methods`)."""
    out: list[str] = []
    for item in (x.strip() for x in text.split(",")):
        named = method_list(item, d_h, max_length)
        out.extend(named if named is not None else ([item] if item else []))
    return ",".join(out)


def xtreme_claims(d_h: int, max_length: int) -> tuple[Claim, ...]:
    """DIET Tables 3 and 5's claims over the rows above (the measure: Table 3's Avg per seed)."""
    n = (lambda spec: parse_method(spec).name)
    absolute, rel, rel_in = n("absolute"), n("diet-rel"), n("diet-rel:segment=input")
    abs_share = n(f"diet-abs:sharing=layer:position_rank={2 * d_h}")
    others = [n(s) for s in (SHAW, "t5", "tupe-r")] + [rel]
    lin_abs, lin_diet = (n(s) for s in linformer_methods(max_length))
    return (
        Claim("xtreme-per-head", "Per-head position beats input position (every per-head row over BERT's)",
              "DIET Table 3", with_mlm(*(C(m, absolute) for m in others + [rel_in, abs_share]))),
        Claim("xtreme-diet-abs-best", "DIET-ABS (d_p = 2 d_h, layer-shared) beats the other per-head methods",
              "DIET Table 3", with_mlm(*(C(abs_share, m) for m in others))),
        Claim("xtreme-segments", "Per-head segments beat input segments", "DIET Tables 3, 5",
              with_mlm(C(rel, rel_in), C(n("diet-rel:sharing=layer"), n("diet-rel:segment=input:sharing=layer")),
                       C(n("diet-abs"), n("diet-abs:segment=input")),
                       C(n("diet-abs:sharing=layer"), n("diet-abs:segment=input:sharing=layer")))),
        Claim("xtreme-head-sharing", "Head-wise sharing is worse than layer-wise (DIET-REL)", "DIET Table 5",
              with_mlm(C(n("diet-rel:sharing=layer"), n("diet-rel:sharing=head")),
                       C(n("diet-rel:segment=input:sharing=layer"), n("diet-rel:segment=input:sharing=head")))),
        Claim("xtreme-sharing-rel", "Sharing hurts DIET-REL", "DIET Table 5",
              with_mlm(C(rel, n("diet-rel:sharing=layer")), C(rel_in, n("diet-rel:segment=input:sharing=layer")))),
        Claim("xtreme-sharing-abs", "Layer-wise sharing helps DIET-ABS (d_p = d_h)", "DIET Table 5",
              with_mlm(C(n("diet-abs:sharing=layer"), n("diet-abs")),
                       C(n("diet-abs:segment=input:sharing=layer"), n("diet-abs:segment=input")))),
        Claim("xtreme-rank-more", "DIET-ABS rank: d_p = 2 d_h beats d_p = d_h (layer-shared)", "DIET Table 5",
              with_mlm(C(abs_share, n("diet-abs:sharing=layer")))),
        Claim("xtreme-rank-saturates", "... then saturates: the gain from 2 d_h to 8 d_h is smaller than from d_h "
              "to 2 d_h", "DIET Table 5",
              with_mlm(C(n(f"diet-abs:sharing=layer:position_rank={8 * d_h}"), abs_share, kind="gain-shrinks",
                         third=n("diet-abs:sharing=layer")))),
        Claim("xtreme-linformer", "With Linformer, DIET-ABS-LIN beats input positions", "DIET Table 3",
              with_mlm(C(lin_diet, lin_abs))),
    )


# -- measures --------------------------------------------------------------------------------------------------

def task_numbers(summary: dict, train_language: str) -> dict[str, float]:
    """One task's numbers for one pre-trained model: per language, averaged, and zero-shot averaged."""
    out = {}
    for metric in summary["metrics"]:
        per = {lang: float(v[metric]) for lang, v in summary["per_set"].items()}
        for lang, v in per.items():
            out[f"{lang}:{metric}"] = v
        out[metric] = float(np.mean(list(per.values())))
        zero_shot = [v for lang, v in per.items() if lang != train_language]
        if zero_shot:
            out[f"zero-shot:{metric}"] = float(np.mean(zero_shot))
    return out


def measures_for(train_language: str):
    """The per-seed measures of a unit (`dietpe.study.results.aggregate`'s `measures`)."""
    def measures(unit: dict, task_names: list[str]) -> dict:
        m = seed_measures(unit, task_names)
        m.pop("score", None)
        table, zero_shot = [], []
        for t in task_names:
            if t not in unit["tasks"]:
                continue
            summary = unit["tasks"][t]
            numbers = task_numbers(summary, train_language)
            m.update({f"{t}:{k}": v for k, v in numbers.items()})
            table += [numbers[metric] for metric in summary["metrics"]]
            zero_shot += [numbers[f"zero-shot:{metric}"] for metric in summary["metrics"]
                          if f"zero-shot:{metric}" in numbers]
        if table and all(t in unit["tasks"] for t in task_names):
            m["score"] = float(np.mean(table))
            if len(zero_shot) == len(table):
                m["zero_shot_score"] = float(np.mean(zero_shot))
        return m
    return measures


# -- report ----------------------------------------------------------------------------------------------------

def claims_section(rows: list[dict], claims: tuple[Claim, ...]) -> tuple[str, list]:
    """The Claims section over the claims with a primary comparison whose rows were run (its other comparisons
    read "rows not run", and the claim is not supported by a part of it), and a line naming the claims none of
    whose comparisons were (their rows: `--methods xtreme-all`)."""
    from dietpe.study.results import claim_rows

    ran = {r["method"] for r in rows}
    kept, idle = [], []
    for claim in claims:
        if any(c.primary and all(n in ran for n in (c.better, c.worse, c.third) if n) for c in claim.comparisons):
            kept.append(claim)
        else:
            idle.append(claim.text)
    md, forest = CL.claims_markdown(claim_rows(rows), tuple(kept))
    md = md.split("\n### Implementation checks")[0]  # no Theorem 1 checks or cost quote in this suite
    if idle:
        md += ("\n\n**Not run** (their rows were not in this run; `--methods xtreme-all` runs every row): "
               + "; ".join(idle) + ".\n")
    return md, forest


def _cell(row: dict, key: str) -> str:
    return est_cell(row, key, 1)


def overview_table(rows: list[dict], tasks: dict[str, dict]) -> str:
    """Table 3's layout: one column per task (QA: F1 / EM), the average, the zero-shot average."""
    head = ["Method", "Position", "Segment", "Sharing", "Params", "Seeds", "MLM loss"]
    head += [f"{t} ({'acc' if info['kind'] != 'qa' else 'F1 / EM'})" for t, info in tasks.items()]
    head += ["Avg", "Avg zero-shot"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        vals = [r["method"], r["place"], r["segment"], r["sharing"], f"{r['parameters'] / 1e6:.3f}M",
                str(len(r["seeds"])), est_cell(r, "mlm")]
        vals += [" / ".join(_cell(r, f"{t}:{m}") for m in info["metrics"]) for t, info in tasks.items()]
        vals += [_cell(r, "score"), _cell(r, "zero_shot_score")]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def language_table(rows: list[dict], task: str, info: dict, metric: str, train_language: str) -> str:
    """One task's metric per language (mean ± half-width over pre-training seeds), with chance for accuracy."""
    langs = info["languages"]
    head = ["Method"] + [f"{lang}*" if lang == train_language else lang for lang in langs] + ["avg", "zero-shot avg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        vals = [r["method"]] + [_cell(r, f"{task}:{lang}:{metric}") for lang in langs]
        vals += [_cell(r, f"{task}:{metric}"), _cell(r, f"{task}:zero-shot:{metric}")]
        lines.append("| " + " | ".join(vals) + " |")
    chance = info.get("chance") or {}
    if metric == "accuracy" and chance and rows:
        vals = ["*chance*"] + [f"*{chance[lang]:.1f}*" if lang in chance else "…" for lang in langs]
        known = [chance[lang] for lang in langs if lang in chance]
        zs = [chance[lang] for lang in langs if lang in chance and lang != train_language]
        vals += [f"*{np.mean(known):.1f}*" if known else "…", f"*{np.mean(zs):.1f}*" if zs else "…"]
        lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(lines)


def sampling_table(mixture: dict | None) -> str:
    if not mixture:
        return ""
    lines = ["| Language | Sentences | Share p | Sampled q | Times used |", "|---|---|---|---|---|"]
    for code, d in mixture.items():
        lines.append(f"| {code} | {d['sentences']:,} | {d['p']:.3f} | {d['q']:.3f} | {d['rate']:.2f} |")
    return "\n".join(lines)


def setup_text(info: dict) -> str:
    """The report's opening: data, protocol, model and time."""
    pre, fin, lang = info["pretrain"], info["finetune"], info["train_language"]
    tasks = "; ".join(f"{t} ({d['train_examples']:,} training examples from {d['source']}; "
                      f"{len(d['languages'])} languages)" for t, d in info["tasks"].items())
    cap = f", at most {fin['max_eval']} examples per language" if fin.get("max_eval") else ""
    return "\n".join([
        f"Command: `{info['command']}`", "",
        f"Pre-training corpus: {info['corpus_text']}. {info['data_note']}",
        f"Fine-tuning on {lang} only, evaluation in every language given (zero-shot for the others): {tasks}.",
        f"Model: `{pre['size']}` size; {pre['steps']} pre-training steps of batch {pre['batch_size']} x "
        f"{pre['max_length']} tokens, lr {pre['lr']:g}, warm-up {pre['warmup']:g}; tokenizer {info['tokenizer']}.",
        f"Fine-tuning: lr grid {', '.join(f'{x:g}' for x in fin['lrs'])} x {fin['seeds']} seed(s), "
        f"{fin['epochs']:g} epochs, batch {fin['batch_size']}, length {fin['max_length']}{cap}; the checkpoint of "
        f"each run is chosen on {lang} (XTREME's zero-shot rule). Pre-training seeds "
        f"{', '.join(map(str, info['pretrain_seeds']))}.",
        f"This invocation's wall time: {info['seconds'] / 60:.1f} min, {info.get('jobs', 1)} run(s) at a time "
        f"(runs finished by an earlier invocation are reused)."])


RESULTS_NOTE = """Mean ± half-width of the 95% t interval over pre-training seeds; "(n=k)": only k of the row's seeds
have that number (a run not finished, or diverged). Each pre-trained model's number is
the median over fine-tuning seeds at its best learning rate. Avg: the mean of the task columns' numbers (XNLI
accuracy, each QA task's F1 and exact match), as DIET Table 3's Avg, over all languages (XTREME's average, {lang}
included); Avg zero-shot: the same over the languages other than {lang}."""

PER_LANGUAGE_NOTE = """`*`: the fine-tuning language (not zero-shot). Accuracy tables end with *chance*, the majority
class's accuracy on each language's evaluation labels; span QA's chance is 0."""


def write_report(out: Path, rows: list[dict], info: dict, claims: tuple[Claim, ...], final: bool) -> None:
    """`report.md`, `results.json` and the CSVs, rewritten after every finished unit."""
    tasks, lang = info["tasks"], info["train_language"]
    claims_md, forest = claims_section(rows, claims)
    write_json_atomic(out / "results.json", {"settings": info, "methods": rows})
    write_csvs(out, rows, list(tasks))
    figures = []
    if rows and final:  # figures cost seconds: drawn for the final report only
        from dietpe.study.plots import plot_figures
        figures = plot_figures(out, rows, list(tasks), forest)
    parts = ["# dietpe compare --suite xtreme: cross-lingual zero-shot transfer (DIET Tables 3 and 5)", ""]
    if not final:
        parts += ["**Partial report: the suite is still running or was interrupted; rerun the same command to "
                  "continue.**", ""]
    parts += [setup_text(info), "", claims_md]
    if "claims_forest.png" in figures:
        parts += ["![claims](claims_forest.png)", ""]
    parts += ["## Environment", "", environment(info), "", "## Results", "", RESULTS_NOTE.format(lang=lang), "",
              overview_table(rows, tasks), ""]
    if info.get("mixture"):
        parts += ["## Languages sampled for pre-training", "",
                  f"Exponent rule q_i ∝ p_i^α, α = {info['alpha']:g}:", "", sampling_table(info["mixture"]), ""]
    parts += ["## Per language", "", PER_LANGUAGE_NOTE, ""]
    for t, data in tasks.items():
        for metric in data["metrics"]:
            parts += [f"### {t}: {metric.replace('_', ' ')} per language", "",
                      language_table(rows, t, data, metric, lang), ""]
    parts += ["Files: `results.json` (everything), `results.csv` (means and intervals of every measure), `seeds.csv`, "
              "`runs.csv` (every fine-tuning run, every language)" + "".join(f", `{f}`" for f in figures) + "."]
    (out / "report.md").write_text("\n".join(parts) + "\n", encoding="utf-8")


def task_info(name: str, data, train_language: str, max_eval: int | None = None) -> dict:
    """What the report says of a task: its metrics, languages, source, size and per-language chance (on the
    examples fine-tuning scores: each language's first `max_eval`)."""
    from dietpe.data import metrics as M

    chance = {}
    if data.spec.kind != "qa":
        for lang, examples in data.scored(max_eval).items():
            gold = [ex.label for ex in examples]
            chance[lang] = M.chance(["accuracy"], gold, data.spec.num_labels)["accuracy"] if gold else math.nan
    langs = sorted(data.evals, key=lambda x: (x != train_language, x))
    return dict(kind=data.spec.kind, metrics=list(data.spec.metrics), languages=langs, source=data.source,
                train_examples=len(data.train), chance=chance)
