"""Claims as data: verdicts from per-seed rows, missing rows, bounds and diminishing returns."""

from dietpe.analysis import stats
from dietpe.study import claims as CL


def row(values, measure="score", head_size=8, position_rank=0):
    return {"seeds": {s: {measure: v} for s, v in enumerate(values)}, "head_size": head_size,
            "position_rank": position_rank}


def test_a_difference_in_the_claimed_direction_is_supported_and_the_other_way_contradicted():
    claim = CL.Claim("k", "a beats b", "src", (CL.C("a", "b"),))
    rows = {"a": row([80, 82, 81]), "b": row([70, 71, 72])}
    (r,) = CL.evaluate(claim, rows)
    assert r.verdict == stats.SUPPORTED and r.values == [10, 11, 9]
    rows = {"a": row([70, 71, 72]), "b": row([80, 82, 81])}
    assert CL.evaluate(claim, rows)[0].verdict == stats.CONTRADICTED
    rows = {"a": row([70, 90, 80]), "b": row([80, 82, 79])}
    assert CL.evaluate(claim, rows)[0].verdict == stats.UNRESOLVED


def test_losses_are_better_when_lower_and_missing_rows_are_named():
    claim = CL.Claim("k", "a learns faster", "src", (CL.C("a", "b", "early_mlm"), CL.C("a", "c", "early_mlm")))
    rows = {"a": row([1.0, 1.1, 1.05], "early_mlm"), "b": row([2.0, 2.2, 2.1], "early_mlm")}
    first, second = CL.evaluate(claim, rows)
    assert first.verdict == stats.SUPPORTED
    assert second.missing == ["c"] and second.verdict == CL.NOT_RUN
    # a claim over two rows is not supported by one of them
    assert CL.overall([first, second]) == f"{stats.UNRESOLVED} (1 of 2 not run)"
    assert CL.overall([first]) == stats.SUPPORTED
    against = CL.evaluate(CL.Claim("k", "b learns faster", "src", (CL.C("b", "a", "early_mlm"),)), rows)[0]
    assert CL.overall([against, second]) == stats.CONTRADICTED  # a contradiction stands


def test_the_multiple_comparisons_note_counts_what_was_judged():
    md, _ = CL.claims_markdown({"absolute": row([70, 71, 72]), "diet-abs": row([75, 74, 78])})
    assert "1 primary comparisons judged over 1 claims" in md
    line = next(x for x in md.splitlines() if x.startswith("| Per-head position beats input position"))
    assert line.endswith(f"**{stats.UNRESOLVED} (1 of 2 not run)** |")  # diet-rel was not run


def test_a_bound_must_hold_in_every_seed_and_above_needs_an_interval():
    bound = CL.Claim("k", "rank <= d_h", "src", (CL.C("a", None, "rank_max", kind="bound", bound="head_size"),))
    assert CL.evaluate(bound, {"a": row([8, 8, 7], "rank_max")})[0].verdict == stats.SUPPORTED
    assert CL.evaluate(bound, {"a": row([8, 9, 8], "rank_max")})[0].verdict == stats.CONTRADICTED
    above = CL.Claim("k", "rank > d_h", "src", (CL.C("a", None, "rank", kind="above", bound="head_size"),))
    assert CL.evaluate(above, {"a": row([12, 13, 12.5], "rank")})[0].verdict == stats.SUPPORTED
    assert CL.evaluate(above, {"a": row([6, 7, 6], "rank")})[0].verdict == stats.CONTRADICTED


def test_saturation_is_a_shrinking_gain():
    claim = CL.Claim("k", "saturates", "src", (CL.C("r32", "r8", kind="gain-shrinks", third="r2"),))
    rows = {"r2": row([60, 61, 62]), "r8": row([70, 72, 71]), "r32": row([71, 72, 72])}
    (r,) = CL.evaluate(claim, rows)
    # gains 8->32: 1, 0, 1; 2->8: 10, 11, 9 -> differences -9, -11, -8: the later gain is smaller
    assert r.values == [-9, -11, -8] and r.verdict == stats.SUPPORTED
    rows["r32"] = row([90, 95, 93])
    assert CL.evaluate(claim, rows)[0].verdict == stats.CONTRADICTED


def test_the_report_section_lists_every_claim_with_a_verdict():
    md, forest = CL.claims_markdown({"absolute": row([1, 2, 3]), "diet-abs": row([2, 3, 5])})
    assert md.startswith("## Claims")
    for claim in CL.CLAIMS:
        assert claim.text in md
    assert "costs nothing extra" in md and stats.RULE in md
    assert [f[0] for f in forest] == ["per-head-position: diet-abs − absolute"]  # the mlm row has no data


def test_a_claim_whose_rows_were_not_run_reads_not_run():
    claim = CL.Claim("k", "a beats b", "src", (CL.C("a", "b"),))
    (r,) = CL.evaluate(claim, {})
    assert r.verdict == CL.NOT_RUN and CL.overall([r]) == CL.NOT_RUN
    md, _ = CL.claims_markdown({}, (claim,))
    assert "| a beats b | score | `a − b` rows not run: a, b | **not run** |" in md
    table = [x for x in md.split("### Claims in detail")[0].splitlines() if x.startswith("| a beats b")]
    assert len(table) == 1 and stats.UNRESOLVED not in table[0]


def test_theorem_1_is_an_implementation_check_in_its_own_table():
    rows = {"absolute": row([8, 8, 8], "rank_max"), "diet-abs": row([1, 2, 3])}
    rows["absolute"]["seeds"] = {s: dict(v, score=1.0 + s) for s, v in rows["absolute"]["seeds"].items()}
    md, forest = CL.claims_markdown(rows)
    top, checks = md.split("### Implementation checks")
    assert "Theorem 1" not in top and "Theorem 1" in checks and "| holds |" in checks
    assert all(m not in ("rank", "rank_max") for *_, m in forest)  # no 'higher is better' drawn for a bound
    assert "Multiple comparisons" in top


def test_the_cost_claim_is_quoted_without_a_verdict():
    md, _ = CL.claims_markdown({})
    cost = md.split("### Cost (quoted, not measured in this run)")[1]
    assert "quoted from" in cost and "no verdict" in cost
    for v in (stats.SUPPORTED, stats.CONTRADICTED, stats.UNRESOLVED):
        assert v not in cost


def test_the_top_table_has_one_line_per_empirical_claim():
    md, _ = CL.claims_markdown({"absolute": row([1, 2, 3]), "diet-abs": row([2, 3, 5])})
    top = md.split("### Claims in detail")[0]
    lines = [x for x in top.splitlines() if x.startswith("| ") and not x.startswith("| Claim")]
    assert len(lines) == sum(1 for c in CL.CLAIMS if not c.check)
    assert "| Per-head position beats input position, absolute and relative | score | `diet-abs − absolute` " in top


def test_chance_is_the_best_constant_predictor_on_the_evaluation_labels():
    from dietpe.data import metrics as M

    gold = [1, 1, 1, 0]
    c = M.chance(["accuracy", "f1", "mcc"], gold, 2)
    assert c["accuracy"] == 75.0 and c["mcc"] == 0.0
    assert abs(c["f1"] - 100 * 2 * 3 / (2 * 3 + 1)) < 1e-9  # all-positive
    assert M.chance(["accuracy"], [2, 2, 0, 1, 2], 3)["accuracy"] == 60.0
    assert M.chance(["pearson"], [0.5, 1.0, 4.0], 1)["pearson"] == 0.0  # predicting the mean


def test_the_report_marks_cells_at_chance_and_gives_each_tasks_chance():
    from dietpe.data.tasks import Example, TaskData, task_spec
    from dietpe.study.report import markdown_table
    from dietpe.study.results import chance_score

    data = TaskData(task_spec("mnli"), evals={
        "dev_matched": [Example("a", "b", label, "f:1") for label in (0, 0, 0, 1)],
        "dev_mismatched": [Example("a", "b", label, "f:1") for label in (1, 2)]})
    assert chance_score(data) == (75.0 + 50.0) / 2  # per set, then averaged as the task's score is
    assert chance_score(data, max_eval=3) == (100.0 + 50.0) / 2  # on the examples fine-tuning scores
    assert chance_score(TaskData(task_spec("cola"), evals={"dev": [Example("a", None, 1, "f:1")] * 3})) == 0.0

    def row(name, mean, low, high, n=3):
        return dict(method=name, place="input", segment="none", sharing="none", parameters=1e6, seeds={0: {}},
                    estimates={"task:t": [mean, low, high, n], "score": [mean, low, high, n]})

    rows = [row("learnt", 80.0, 75.0, 85.0), row("chance-ish", 55.0, 49.0, 61.0), row("below", 40.0, 38.0, 42.0),
            row("one-seed", 50.5, float("nan"), float("nan"), 1), row("just-above", 53.0, 51.5, 54.5)]
    text = markdown_table(rows, ["t"], {"t": 50.0})
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    assert "†" not in lines["learnt"] and "†" not in lines["just-above"]
    assert all("†" in lines[m] for m in ("chance-ish", "below", "one-seed"))
    assert "*50.0*" in lines["*chance*"]
    assert "†" not in markdown_table(rows, ["t"])  # no chance known: nothing marked, no chance row


def test_a_cell_behind_fewer_seeds_than_its_row_says_so_and_a_diverged_seed_is_left_out():
    from dietpe.methods import parse_method
    from dietpe.study.report import markdown_table
    from dietpe.study.results import aggregate

    def unit(score, tasks):
        return dict(val_loss=2.0, curves={}, parameters=1e6, head_size=8,
                    tasks={t: {"averaged": {"accuracy": v}, "metrics": ["accuracy"]} for t, v in tasks.items()})

    units = {("absolute", 0): unit(2.0, {"order": 90.0, "topic": 99.0}),
             ("absolute", 1): unit(2.1, {"order": 60.0, "topic": float("nan")}),
             ("absolute", 2): unit(2.2, {"order": 75.0})}
    (r,) = aggregate([parse_method("absolute")], units, ["order", "topic"])
    assert r["estimates"]["task:topic"][3] == 1 and r["estimates"]["score"][3] == 1
    line = markdown_table([r], ["order", "topic"]).splitlines()[-1]
    cells = [c.strip() for c in line.strip("| ").split(" | ")]
    assert cells[5] == "3" and cells[8] == "75.0 ± 37.3" and cells[9] == "99.0 (n=1)" and cells[10] == "94.5 (n=1)"
    rows = {"a": row([float("nan"), 80, 82, 81]), "b": row([70, 71, 72, 73])}
    (res,) = CL.evaluate(CL.Claim("k", "a beats b", "src", (CL.C("a", "b"),)), rows)
    assert res.values == [9, 10, 8] and res.diverged == {"a": [0]}  # seed 0 diverged: left out of the values
    # ... and leaving a's diverged seed out cannot be what supports a
    assert res.verdict == stats.UNRESOLVED and "diverged, left out: a (seed 0)" in CL._cell(res)


def test_a_divergence_never_makes_the_verdict_it_could_have_flattered():
    claim = CL.Claim("k", "a beats b", "src", (CL.C("a", "b"),))
    nan, inf = float("nan"), float("inf")
    a, b = [85, 86, 85.5, 86.2], [80, 81, 79, 80.5]
    verdicts = {}
    for name, rows in {"a wins, a diverged": {"a": row([nan, nan] + a[2:]), "b": row(b)},
                       "a wins, b diverged": {"a": row(a), "b": row([inf] + b[1:])},
                       "a loses, a diverged": {"a": row([nan] + b[1:]), "b": row(a)},
                       "a loses, b diverged": {"a": row(b), "b": row([nan] + a[1:])},
                       "every seed of a diverged": {"a": row([nan] * 4), "b": row(b)}}.items():
        (res,) = CL.evaluate(claim, rows)
        verdicts[name] = res.verdict
    assert verdicts == {"a wins, a diverged": stats.UNRESOLVED, "a wins, b diverged": stats.SUPPORTED,
                        "a loses, a diverged": stats.CONTRADICTED, "a loses, b diverged": stats.UNRESOLVED,
                        "every seed of a diverged": stats.UNRESOLVED}
    loss = CL.Claim("k", "a lower loss", "src", (CL.C("a", "b", "mlm"),))
    (res,) = CL.evaluate(loss, {"a": row([inf, 1.0, 1.1, 1.05], "mlm"), "b": row([2, 2.1, 2.2, 2.0], "mlm")})
    assert res.diverged == {"a": [0]} and res.verdict == stats.UNRESOLVED


def test_one_contradicted_comparison_contradicts_a_claim_over_several():
    claim = CL.Claim("k", "x and y beat b", "src", (CL.C("x", "b"), CL.C("y", "b")))
    rows = {"b": row([80, 81, 82]), "x": row([70, 72, 71]), "y": row([85, 86, 87.5])}
    results = CL.evaluate(claim, rows)
    assert [r.verdict for r in results] == [stats.CONTRADICTED, stats.SUPPORTED]
    assert CL.overall(results) == stats.CONTRADICTED


def test_a_difference_with_no_spread_between_seeds_is_not_resolved():
    claim = CL.Claim("k", "a beats b", "src", (CL.C("a", "b"),))
    (res,) = CL.evaluate(claim, {"a": row([80.2, 70.2, 60.2]), "b": row([80.0, 70.0, 60.0])})
    assert res.verdict == stats.UNRESOLVED and "no spread between seeds" in CL._cell(res)


def test_saturation_needs_a_first_gain_to_saturate():
    claim = CL.Claim("k", "saturates", "src", (CL.C("r32", "r8", kind="gain-shrinks", third="r2"),))
    # more rank hurts throughout: the later 'gain' (-20) is smaller than the first (-10), but nothing saturates
    rows = {"r2": row([80, 81, 82]), "r8": row([70, 72, 71]), "r32": row([50, 51, 52.5])}
    (res,) = CL.evaluate(claim, rows)
    assert res.verdict == stats.UNRESOLVED and "is not shown" in CL._cell(res)


def test_seeds_needed_says_when_the_mean_points_against_the_claim():
    md, _ = CL.claims_markdown({"absolute": row([75, 74.5, 78, 77]), "diet-abs": row([70, 75, 73, 76.5]),
                                "diet-rel": row([76, 74, 79, 77])})
    line = next(x for x in md.splitlines() if "| `diet-abs − absolute` | score |" in x)
    assert line.endswith("(against) |"), line


def test_the_family_wise_chance_of_a_false_verdict_is_stated():
    md, _ = CL.claims_markdown({"absolute": row([70, 71, 72]), "diet-abs": row([75, 74, 78]),
                                "diet-rel": row([75, 74, 78])})
    assert "2 primary comparisons" in md and "at least one of the 2 about 10% of the time" in md


def test_the_cost_quote_gives_both_lengths():
    lines = CL.bench_lines()
    assert any("1.02 at 128 tokens, 1.06 at 512" in x for x in lines)


def test_the_report_names_diverged_runs_and_says_what_none_did_on_the_position_tasks():
    from dietpe.methods import parse_method
    from dietpe.study.report import diverged_line, none_at_chance
    from dietpe.study.results import aggregate

    def unit(order, loss=2.0):
        return dict(val_loss=loss, curves={}, parameters=1e6, head_size=8,
                    tasks={"order": {"averaged": {"accuracy": order}, "metrics": ["accuracy"]}})

    units = {("none", 0): unit(50.0), ("none", 1): unit(51.0), ("none", 2): unit(49.5, float("inf")),
             ("absolute", 0): unit(90.0), ("absolute", 1): unit(float("nan"))}
    rows = aggregate([parse_method("none"), parse_method("absolute")], units, ["order"])
    assert diverged_line(rows) == ("Diverged (a measure not finite), left out of the cells and of the claims' "
                                   "differences: `none` seed 2 (mlm); `absolute` seed 1 (score, task:order).")
    assert rows[0]["estimates"]["mlm"][3] == 2  # inf left out like NaN
    assert "`none` is at chance (†) on order" in none_at_chance(rows, ["order"], {"order": 50.0})
    units.update({("none", k): unit(90.0 + k) for k in range(3)})
    rows = aggregate([parse_method("none")], units, ["order"])
    assert "`none` is above chance on order" in none_at_chance(rows, ["order"], {"order": 50.0})
    assert "no `none` row" in none_at_chance([], ["order"], {"order": 50.0})
