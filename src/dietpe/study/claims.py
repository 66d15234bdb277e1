"""The papers' claims as data, and their verdicts from a comparison's per-seed measurements.

A claim is a list of comparisons; each names two rows of the comparison (method specs, as `Method.name`
writes them), a measure and the direction the paper claims. The measures are per pre-training seed:

    score       fine-tuning score, mean over the tasks (each task: the median over fine-tuning seeds at the
                best learning rate, the papers' protocol, for that pre-trained model)
    mlm         validation MLM loss at the end of pre-training (lower is better)
    early_mlm   validation MLM loss at the first evaluation (a quarter of the steps by default)
    rank        mean numerical rank of the full attention logits over layers and heads (Theorem 1)
    rank_max    the largest such rank of any layer and head

Differences are paired over pre-training seeds (a seed gives both rows the same initialisation of their
shared weights, data order and masks) and summarised by a t interval (`dietpe.analysis.stats`); the verdict
follows `stats.RULE`. A claim is supported when all its comparisons were run and are supported, contradicted when
any one is (a claim over several rows says all of them), otherwise not resolved; a claim none of whose rows were
run is "not run" (never "not resolved"). A seed whose measure is not finite (a run that diverged) is left out of
the differences and named beside them, and the verdict that leaving it out could have made is not given: a
divergence of the row claimed better never lets the comparison read supported, one of the other row never lets
it read contradicted. Saturation (the gain from 8 to 32 smaller than from 2 to 8) is supported only where the
gain from 2 to 8 is itself shown.
Theorem 1's rank bounds hold by construction: they are checks of the implementation, reported in their own
table and never counted beside the empirical claims. The cost claim (DIET Table 1) is quoted, without a
verdict: timings are not a pure function of the command line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dietpe.analysis import stats

MEASURES = {  # name: (description, higher is better)
    "score": ("fine-tuning score, mean over tasks", True),
    "mlm": ("validation MLM loss", False),
    "early_mlm": ("validation MLM loss at the first evaluation", False),
    "rank": ("mean rank of the attention logits", True),
    "rank_max": ("largest rank of the attention logits", True),
}


@dataclass(frozen=True)
class Comparison:
    """`better` is claimed better than `worse` on `measure` (for `kind="bound"`: `better`'s measure is claimed
    to stay at or below `bound`, a per-row value such as the head size, in every seed; for `kind="above"`: to
    exceed it)."""

    better: str
    worse: str | None
    measure: str
    kind: str = "difference"  # difference | bound | above | gain-shrinks (better, worse, third)
    bound: str | None = None  # "head_size" or "head_size+position_rank" (read from the row)
    third: str | None = None  # gain-shrinks: (better - worse) < (worse - third)
    primary: bool = True  # secondary comparisons are shown as evidence but do not decide the claim's verdict

    def label(self) -> str:
        if self.kind == "bound":
            return f"{self.better}: {self.measure} ≤ {self.bound}"
        if self.kind == "above":
            return f"{self.better}: {self.measure} − {self.bound}"
        if self.kind == "gain-shrinks":
            return f"({self.better} − {self.worse}) − ({self.worse} − {self.third})"
        return f"{self.better} − {self.worse}"


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    source: str
    comparisons: tuple[Comparison, ...]
    note: str = ""
    check: bool = False  # holds by construction (Theorem 1): a check of the implementation, not a finding


@dataclass
class Result:
    comparison: Comparison
    estimate: stats.Estimate | None
    verdict: str
    values: list[float] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    diverged: dict[str, list] = field(default_factory=dict)  # row -> its seeds whose measure is not finite
    note: str = ""
    direction: int = 1  # the sign of the values the claim expects


def C(better, worse, measure="score", **kw) -> Comparison:
    return Comparison(better, worse, measure, **kw)


def with_mlm(*comparisons: Comparison) -> tuple[Comparison, ...]:
    """The papers' measure (fine-tuning score) decides; the same pairs on validation MLM loss are shown as
    secondary evidence."""
    return comparisons + tuple(Comparison(c.better, c.worse, "mlm", c.kind, c.bound, c.third, primary=False)
                               for c in comparisons)


# The built-in study's claims (the rows of `dietpe.methods.STUDY_METHODS`).
CLAIMS: tuple[Claim, ...] = (
    Claim("per-head-position", "Per-head position beats input position, absolute and relative",
          "DIET Tables 2-4",
          with_mlm(C("diet-abs", "absolute"), C("diet-rel", "absolute"))),
    Claim("per-head-segments", "Per-head segments ≥ input segments", "DIET Tables 5, 8",
          with_mlm(C("diet-abs", "diet-abs:segment=input"), C("diet-rel", "diet-rel:segment=input"))),
    Claim("layer-sharing-abs", "Layer sharing helps DIET-ABS", "DIET Tables 5, 9",
          with_mlm(C("diet-abs:sharing=layer", "diet-abs"))),
    Claim("layer-sharing-rel", "Layer sharing hurts DIET-REL", "DIET Tables 5, 9",
          with_mlm(C("diet-rel", "diet-rel:sharing=layer"))),
    Claim("head-sharing", "Head sharing is worse than layer sharing", "DIET Tables 5, 9",
          with_mlm(C("diet-abs:sharing=layer", "diet-abs:sharing=head"),
                   C("diet-rel:sharing=layer", "diet-rel:sharing=head"))),
    Claim("rank-more", "DIET-ABS rank d_p: more helps (d_p = 8 over 2) ...", "DIET Table 5",
          with_mlm(C("diet-abs", "diet-abs:position_rank=2"))),
    Claim("rank-saturates", "... up to a point, then saturates (the gain from 8 to 32 is smaller than from 2 to 8)",
          "DIET Table 5",
          with_mlm(C("diet-abs:position_rank=32", "diet-abs", kind="gain-shrinks", third="diet-abs:position_rank=2"))),
    Claim("theorem1-input", "Theorem 1: input-position logits have rank ≤ d_h", "DIET Thm. 1, Fig. 2",
          (C("absolute", None, "rank_max", kind="bound", bound="head_size"),), check=True),
    Claim("theorem1-per-head", "Theorem 1: per-head position reaches beyond d_h", "DIET Thm. 1, Fig. 2, 8",
          (C("diet-abs", None, "rank", kind="above", bound="head_size"),
           C("diet-rel", None, "rank", kind="above", bound="head_size")), check=True),
    Claim("tupe-converges-faster", "TUPE converges faster than BERT's absolute positions", "TUPE Fig. 5",
          (C("tupe-r", "absolute", "early_mlm"), C("tupe-r", "absolute", "mlm", primary=False)),
          note="validation MLM loss at the first evaluation, lower is better"),
)

# DIET Table 1 ("costs nothing extra") is a timing claim: timings are not a pure function of the command line,
# so the report quotes `dietpe bench` (docs/bench.md, bert-small, 1 thread, median of cycle ratios; ratios moved
# by ±3% between runs on that machine) at both lengths measured, the longer the less favourable.
BENCH = {"source": "docs/bench.md (dietpe bench --shapes bert-small --threads 1, training step / none)",
         "spread": 0.03, "ratios": {"diet-abs": (1.02, 1.06), "diet-rel": (1.01, 1.05), "absolute": (0.99, 1.01)},
         "lengths": (128, 512)}


NOT_RUN = "not run"


def _series(rows: dict, name: str, measure: str) -> tuple[dict, list]:
    """A row's finite values by seed, and the seeds whose value is not finite (NaN or inf: a diverged run)."""
    values, diverged = {}, []
    for seed, measures in (rows.get(name) or {"seeds": {}})["seeds"].items():
        v = measures.get(measure)
        if v is None:
            continue
        if math.isfinite(v):
            values[seed] = float(v)
        else:
            diverged.append(seed)
    return values, diverged


def _hard(values: list[float], above: bool) -> str:
    """A bound that must hold in every seed: supported when it does, contradicted when no seed meets it."""
    holds = [v > 1e-9 if above else v <= 1e-9 for v in values]
    if not values:
        return stats.UNRESOLVED
    return stats.SUPPORTED if all(holds) else stats.UNRESOLVED if above and any(holds) else stats.CONTRADICTED


def _guarded(verdict: str, diverged: dict, c: Comparison) -> str:
    """The verdict, less what leaving the diverged seeds out could have made: a divergence of the row claimed
    better cannot support the claim, one of the other row cannot contradict it (of a third row, neither)."""
    if verdict == stats.SUPPORTED and (diverged.get(c.better) or diverged.get(c.third)):
        return stats.UNRESOLVED
    if verdict == stats.CONTRADICTED and (diverged.get(c.worse) or diverged.get(c.third)):
        return stats.UNRESOLVED
    return verdict


def evaluate(claim: Claim, rows: dict[str, dict]) -> list[Result]:
    """`rows`: method name -> {"seeds": {seed: {measure: value}}, "head_size": d_h, "position_rank": d_p}."""
    results = []
    for c in claim.comparisons:
        names = [n for n in (c.better, c.worse, c.third) if n]
        missing = [n for n in names if n not in rows]
        if missing:
            results.append(Result(c, None, NOT_RUN, missing=missing))
            continue
        results.append(_compare(c, rows))
    return results


def _compare(c: Comparison, rows: dict[str, dict]) -> Result:
    sign = 1 if MEASURES[c.measure][1] else -1
    series = {n: _series(rows, n, c.measure) for n in (c.better, c.worse, c.third) if n}
    diverged = {n: d for n, (_, d) in series.items() if d}
    a = series[c.better][0]
    if c.kind in ("bound", "above"):  # Theorem 1's bounds hold in every seed, not on average
        bound = sum(float(rows[c.better][k]) for k in c.bound.split("+"))
        values = [a[s] - bound for s in sorted(a)]
        est = stats.t_interval(values) if values else None
        return Result(c, est, _guarded(_hard(values, c.kind == "above"), diverged, c), values, diverged=diverged)
    b = series[c.worse][0]
    diffs, note, direction = stats.paired(a, b), "", sign
    if c.kind == "gain-shrinks":
        third = series[c.third][0]
        gain_low = dict(zip(sorted(set(b) & set(third)), stats.paired(b, third)))
        gain_high = dict(zip(sorted(set(a) & set(b)), diffs))
        diffs, direction = stats.paired(gain_high, gain_low), -sign  # claimed: the later gain is smaller
        est = stats.t_interval(diffs) if diffs else None
        v = stats.verdict(est, direction) if est else stats.UNRESOLVED
        low = stats.t_interval(gain_low.values()) if gain_low else None
        if v == stats.SUPPORTED and (low is None or stats.verdict(low, sign) != stats.SUPPORTED):
            v, note = stats.UNRESOLVED, f"the gain from {c.third} to {c.worse} is not shown, so nothing saturates"
    else:
        est = stats.t_interval(diffs) if diffs else None
        v = stats.verdict(est, sign) if est else stats.UNRESOLVED
    return Result(c, est, _guarded(v, diverged, c), diffs, diverged=diverged, note=note, direction=direction)


def overall(results: list[Result]) -> str:
    """The claim's verdict from its primary comparisons: "not run" when none was run; contradicted when any one
    run is (whatever the others read: the claim says all of them); supported only when every one was run and
    supported."""
    primary = [r.verdict for r in results if r.comparison.primary]
    verdicts = [v for v in primary if v != NOT_RUN]
    if not verdicts:
        return NOT_RUN
    if stats.CONTRADICTED in verdicts:  # a claim over several rows says every one of them
        return stats.CONTRADICTED
    if all(v == stats.SUPPORTED for v in verdicts):
        missing = len(primary) - len(verdicts)
        return stats.SUPPORTED if not missing else f"{stats.UNRESOLVED} ({missing} of {len(primary)} not run)"
    return stats.UNRESOLVED


def bench_lines() -> list[str]:
    """The cost claim, quoted at each length measured, ± the run-to-run spread of the quoted bench; no verdict."""
    short, long = BENCH["lengths"]
    return [f"{what}: {r_short:.2f} at {short} tokens, {r_long:.2f} at {long} (± {BENCH['spread']:.2f} between runs)"
            for what, (r_short, r_long) in BENCH["ratios"].items()]


def _cell(r: Result) -> str:
    if r.missing:
        return f"rows not run: {', '.join(r.missing)}"
    text = "no common seeds" if r.estimate is None else r.estimate.text(3, signed=True)
    if r.diverged:
        text += "; diverged, left out: " + ", ".join(f"{n} (seed {', '.join(map(str, s))})"
                                                     for n, s in r.diverged.items())
    return text + (f"; {r.note}" if r.note else "")


MULTIPLE = ("Multiple comparisons: {n} primary comparisons judged over {k} claims, each judged by its own 95% interval "
            "with no correction; if no effect were real, each could still read supported or contradicted by chance "
            "about 1 time in 20, and at least one of the {n} about {family:.0%} of the time (were they independent). "
            "Read a single verdict with that in mind; the secondary (MLM) rows show whether the pre-training loss "
            "agrees.")


def claims_markdown(rows: dict[str, dict], claims: tuple[Claim, ...] = CLAIMS) -> tuple[str, list[tuple]]:
    """The report's Claims section and the forest plot's rows (label, estimate, verdict, measure): one line per
    empirical claim first, then the details, Theorem 1's implementation checks and the quoted cost."""
    evaluated = [(claim, evaluate(claim, rows)) for claim in claims]
    empirical = [(c, rs) for c, rs in evaluated if not c.check]
    checks = [(c, rs) for c, rs in evaluated if c.check]
    md = ["## Claims", "",
          f"Verdict rule: {stats.RULE}. Intervals: 95% Student-t over pre-training seeds of the paired per-seed "
          "difference (first row − second row; for `score` higher is better, for MLM losses lower is better). "
          "A claim whose rows were not run reads **not run**; one with only some of them run is not resolved, "
          "unless a comparison that was run contradicts it.", "",
          "| Claim | Measure | Difference, mean [95% CI] | Verdict |", "|---|---|---|---|"]
    forest, n_primary, n_claims = [], 0, 0
    for claim, results in empirical:
        primary = [r for r in results if r.comparison.primary]
        judged = sum(r.verdict != NOT_RUN for r in primary)
        n_primary, n_claims = n_primary + judged, n_claims + bool(judged)
        measure = ", ".join(dict.fromkeys(r.comparison.measure for r in primary))
        diff = "; ".join(f"`{r.comparison.label()}` {_cell(r)}" for r in primary)
        md.append(f"| {claim.text} | {measure} | {diff} | **{overall(results)}** |")
    md += ["", MULTIPLE.format(n=n_primary, k=n_claims, family=1 - stats.LEVEL ** n_primary), "",
           "### Claims in detail", "",
           "A claim's verdict is decided by its primary rows (the papers' measure: fine-tuning score; for TUPE's "
           "convergence the early MLM loss); rows marked secondary are evidence on validation MLM loss. Seeds "
           "needed: for a row not resolved, how many seeds the interval would need to exclude 0 if the mean and "
           "the seed-to-seed spread stayed as measured (a planning estimate; \"against\": the mean points the "
           "other way, so those seeds would contradict the claim).", "",
           "| Claim | Source | Comparison | Measure | Difference, mean [95% CI] | Seeds | Verdict | Seeds needed |",
           "|---|---|---|---|---|---|---|---|"]
    for claim, results in empirical:
        for r in results:
            c = r.comparison
            n = r.estimate.n if r.estimate is not None else 0
            if r.estimate is not None:
                forest.append((f"{claim.key}: {c.label()}", r.estimate, r.verdict, c.measure))
            measure = c.measure if c.primary else f"{c.measure} (secondary)"
            need = ""
            if r.verdict == stats.UNRESOLVED and r.values:
                k = stats.seeds_needed(r.values)
                against = sum(r.values) * r.direction < 0
                need = "—" if k is None else f"{k} (against)" if against else str(k)
            md.append(f"| {claim.text} | {claim.source} | `{c.label()}` | {measure} | {_cell(r)} | {n} | "
                      f"{r.verdict} | {need} |")
    md += ["", "### Implementation checks (Theorem 1, true by construction)", "",
           "Input-position logits cannot exceed rank d_h whatever the training; per-head terms can. These rows "
           "check that the implementation behaves as the theorem says; they are not findings of this run.", "",
           "| Check | Source | Row | Measured − d_h, mean [95% CI] | Seeds | Result |", "|---|---|---|---|---|---|"]
    for claim, results in checks:
        for r in results:
            n = r.estimate.n if r.estimate is not None else 0
            result = {stats.SUPPORTED: "holds", stats.CONTRADICTED: "FAILS"}.get(r.verdict, r.verdict)
            md.append(f"| {claim.text} | {claim.source} | `{r.comparison.label()}` | {_cell(r)} | {n} | {result} |")
    md += ["", "### Cost (quoted, not measured in this run)", "",
           f"DIET Table 1 (\"costs nothing extra\"): quoted from {BENCH['source']}, no verdict: "
           + "; ".join(bench_lines()) + ". Measure it on this machine with `dietpe bench`.", ""]
    return "\n".join(md), forest
