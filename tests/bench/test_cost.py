"""The bench machinery: ratios and medians, one row per method, parameter counts (DIET Table 6), the CLI's
outputs. No timing assertions: speed goals live in the benchmark itself."""

import json

import pytest
import torch

from dietpe.bench import cost, report
from dietpe.cli import main
from dietpe.errors import ConfigError


def test_median_of_per_cycle_ratios_not_ratio_of_medians():
    base = [1.0, 2.0, 4.0]
    times = [1.1, 2.2, 2.0]  # ratios 1.1, 1.1, 0.5: a loaded cycle slows both candidates alike
    assert cost.median_ratio(times, base) == pytest.approx(1.1)
    with pytest.raises(ValueError):
        cost.median_ratio([1.0], [1.0, 2.0])


def test_ratio_spread_is_the_interquartile_range():
    lo, hi = cost.ratio_spread([1, 2, 3, 4, 5, 6, 7, 8], [1] * 8)
    assert lo < 3 < 6 < hi


def test_interleaved_times_runs_every_candidate_once_per_cycle_after_warmup():
    calls = []
    steps = {name: (lambda n=name: calls.append(n)) for name in ("a", "b", "c")}
    times = cost.interleaved_times(steps, repeats=4, warmup=1)
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert len(calls) == 15
    assert calls[3:6] == ["a", "b", "c"] and calls[6:9] == ["b", "c", "a"]  # the order rotates


def test_variant_labels_and_refusals():
    v = cost.Variant.parse("diet-rel+seg")
    assert (v.position, v.segment, v.label) == ("diet-rel", "per-head", "diet-rel+seg")
    assert cost.Variant.parse("t5").segment == "input"
    for bad in ("diet-rell", "diet-rel+segs"):
        with pytest.raises(ConfigError, match="allowed"):
            cost.Variant.parse(bad)


def test_diet_abs_adds_two_tables_per_layer_and_head():
    """DIET Table 6: DIET-ABS adds P_Q and P_K, L·H·2·n·d_p parameters."""
    counts = {m: cost.parameter_count(cost.build_model(cost.model_config("bert-tiny", cost.Variant.parse(m))))
              for m in ("none", "diet-abs", "diet-rel")}
    layers, heads, n, d_p = 2, 2, 512, 64
    assert counts["diet-abs"] - counts["none"] == layers * heads * 2 * n * d_p
    assert counts["diet-rel"] - counts["none"] == layers * heads * (2 * n - 1)


def test_measure_gives_a_row_per_method_with_ratios_to_none():
    rows = cost.measure("bert-tiny", 8, 1, [cost.Variant.parse(m) for m in ("diet-abs", "t5")], repeats=2,
                        warmup=0)
    assert [r.method for r in rows] == ["none", "diet-abs", "t5"]
    none = rows[0]
    assert none.train_ratio == 1.0 and none.infer_ratio == 1.0 and none.params_increase == 0.0
    assert all(r.train_ms > 0 and r.infer_ms > 0 for r in rows)
    text = report.markdown(rows, [], {"threads": 1, "repeats": 2, "warmup": 0})
    assert all(f"| {m} |" in text for m in ("none", "diet-abs", "t5"))


def test_candidate_groups_fit_the_memory_budget():
    labels = [f"m{i}" for i in range(17)]
    assert cost.candidate_groups(labels, 100, None) == [labels]
    assert cost.candidate_groups(labels, 100, 10_000) == [labels]
    groups = cost.candidate_groups(labels, 100, 500)  # 4 candidates + the group's own `none`
    assert [len(g) for g in groups] == [4, 4, 4, 4, 1] and sum(groups, []) == labels
    assert cost.candidate_groups(labels, 100, 50) == [[x] for x in labels]  # never empty groups


def test_measure_in_memory_groups_keeps_every_row_and_ratio():
    """bert-base's 17 candidates do not fit 24 GiB at once: a small budget splits them, each group beside its
    own `none`, and the rows come back as with one group."""
    methods = [cost.Variant.parse(m) for m in ("diet-abs", "t5", "diet-rel")]
    one = cost.model_config("bert-tiny", cost.BASELINE)
    weights = 4 * cost.parameter_count(cost.build_model(one))
    logs = []
    rows = cost.measure("bert-tiny", 8, 1, methods, repeats=2, warmup=0, peers=["hf-bert"],
                        memory_budget=3 * 3 * weights, log=logs.append)  # two candidates per group
    assert [r.method for r in rows] == ["none", "diet-abs", "t5", "diet-rel", "hf-bert"]
    assert all(r.train_ratio > 0 and r.infer_ratio > 0 for r in rows) and rows[0].train_ratio == 1.0
    assert sum("group 1 of 2" in m for m in logs) == 2 and sum("group 2 of 2" in m for m in logs) == 2


def test_cli_writes_markdown_and_json(tmp_path, capsys):
    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    code = main(["bench", "--shapes", "bert-tiny", "--lengths", "8", "--batch", "1", "--methods", "diet-rel+seg",
                 "--repeats", "1", "--warmup", "0", "--threads", "1", "--no-memory", "--json", str(out_json),
                 "--markdown", str(out_md)])
    assert code == 0
    data = json.loads(out_json.read_text())
    assert [r["method"] for r in data["rows"]] == ["none", "diet-rel+seg"]
    assert "diet-rel+seg" in out_md.read_text() and "diet-rel+seg" in capsys.readouterr().out


def test_cli_long_inputs_table_with_memory(tmp_path, capsys):
    out_json = tmp_path / "b.json"
    code = main(["bench", "--shapes", "bert-tiny", "--lengths", "8", "--modes", "infer", "--methods", "alibi",
                 "--repeats", "1", "--warmup", "0", "--threads", "1", "--no-memory", "--long", "--long-length", "32",
                 "--long-methods", "none,alibi", "--json", str(out_json)])
    assert code == 0
    long = json.loads(out_json.read_text())["long"]
    assert [(r["method"], r["length"]) for r in long] == [("none", 32), ("alibi", 32)]
    assert long[0]["peak_ratio"] in (1.0, None) and long[0]["rss_ratio"] == 1.0
    assert all(r["rss_mib"] > 0 and r["peak_mib"] >= 0 and r["infer_ms"] > 0 for r in long)
    assert "### long inputs: bert-tiny, inference, length 32" in capsys.readouterr().out


def test_cli_refuses_bad_options(capsys):
    assert main(["bench", "--shapes", "bert-huge", "--no-memory"]) == 2
    assert "bert-huge" in capsys.readouterr().err
    assert main(["bench", "--long", "--long-methods", "diet-abs", "--no-memory"]) == 2
    assert main(["bench", "--lengths", "8,16", "--batch", "1,2,3"]) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # argparse's choices: one line, exit code 2
        main(["bench", "--compile", "fast", "--no-memory"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1
    assert "--compile" in err and "'fast'" in err and "reduce-overhead" in err


def test_compiled_candidates_are_timed_compiled_with_eager_outputs(monkeypatch):
    compiled = []
    real = cost.compile_model

    def spy(model, how):
        out = real(model, how)
        compiled.append((type(model).__name__, type(out).__name__))
        return out

    monkeypatch.setattr(cost, "compile_model", spy)
    logs = []
    rows = cost.measure("bert-tiny", 8, 1, [cost.Variant.parse("diet-rel+seg")], repeats=1, warmup=0,
                        log=logs.append, compile="aot_eager")
    assert [r.method for r in rows] == ["none", "diet-rel+seg"]
    assert all(r.train_ratio > 0 and r.infer_ratio > 0 for r in rows)
    # every candidate, none included, in both modes, went through torch.compile
    assert compiled == [("DietModel", "OptimizedModule")] * 4 and all("compiled (aot_eager)" in m for m in logs)
    model = cost.build_model(cost.model_config("bert-tiny", cost.Variant.parse("diet-rel+seg"))).eval()
    inputs = cost.make_inputs(2, 8, 100)
    with torch.no_grad():
        assert torch.equal(cost.compile_model(model, "aot_eager")(**inputs).last_hidden_state,
                           model(**inputs).last_hidden_state)


def test_hitting_the_recompile_limit_fails_instead_of_running_eager():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)
    with cost.compile_limits("eager", 0):  # room for 8 compiled entries
        for rank in range(1, 9):
            f(torch.zeros((1,) * rank))  # each rank a new entry
        with pytest.raises(Exception, match="recompile|cache"):
            f(torch.zeros((1,) * 9))
    torch._dynamo.reset()


def test_peak_memory_in_a_fresh_process():
    from dietpe.bench.memory import measure_peak

    m = measure_peak({"shape": "bert-tiny", "method": "diet-rel+seg", "length": 16, "batch": 1, "mode": "infer",
                      "max_length": 512, "threads": 1})
    assert m["peak_mib"] >= m["idle_mib"] > 0 and m["step_mib"] >= 0


def test_bench_writes_each_finished_phase_so_a_stopped_run_keeps_them(tmp_path, monkeypatch):
    real, calls = cost.measure, []

    def measure_then_stop(*args, **kwargs):
        calls.append(args[:2])
        if len(calls) == 3:  # the third phase never finishes (a time limit, a kill)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cost, "measure", measure_then_stop)
    md, js = tmp_path / "bench.md", tmp_path / "bench.json"
    with pytest.raises(KeyboardInterrupt):
        main(["bench", "--shapes", "bert-tiny", "--lengths", "8,16", "--repeats", "1", "--warmup", "0",
              "--threads", "1", "--methods", "diet-rel", "--no-memory", "--markdown", str(md), "--json", str(js)])
    text = md.read_text()
    assert "Partial results**: 2 of 4 phases done" in text
    assert "bert-tiny, length 8" in text and "bert-tiny, length 16" not in text
    rows = json.loads(js.read_text())["rows"]
    assert {(r["length"], r["method"]) for r in rows} == {(8, "none"), (8, "diet-rel")}
    assert all(r["train_ratio"] is not None and r["infer_ratio"] is not None for r in rows)


def test_timings_wait_for_the_device_before_and_after_each_step():
    """On CUDA a step returns when its kernels are queued: the clock starts and stops after a synchronise."""
    events = []
    steps = {"a": lambda: events.append("a"), "b": lambda: events.append("b")}
    cost.interleaved_times(steps, repeats=2, warmup=0, sync=lambda: events.append("sync"))
    assert events == ["sync", "a", "sync", "sync", "b", "sync", "sync", "b", "sync", "sync", "a", "sync"]


def test_bench_on_cuda_without_cuda_is_one_line(capsys):
    import pytest

    from dietpe.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "--device", "cuda", "--shapes", "bert-small", "--lengths", "8"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dietpe bench: error:") and "CUDA is not available" in err[0]


def test_bench_runs_in_bfloat16_on_the_cpu():
    rows = cost.measure("bert-small", 8, 1, [cost.Variant.parse("alibi")], repeats=1, warmup=0, modes=("train",),
                        max_length=16, precision="bf16")
    assert [r.method for r in rows] == ["none", "alibi"] and all(r.train_ms > 0 for r in rows)


def test_variants_on_backends_and_the_baseline_on_sdpa():
    v = cost.Variant.parse("diet-rel+seg@fused")
    assert (v.position, v.segment, v.backend, v.label) == ("diet-rel", "per-head", "fused", "diet-rel+seg@fused")
    assert cost.Variant.parse("t5").on("sdpa").label == "t5@sdpa" and cost.Variant.parse("t5").backend == "auto"
    assert cost.Variant.parse("none") == cost.BASELINE and cost.BASELINE.backend == "sdpa"  # flash on a GPU
    assert cost.BASELINE.on("fused") == cost.BASELINE and cost.Variant.parse("none@fused").label == "none@fused"
    assert cost.model_config("bert-tiny", v, attention_probs_dropout_prob=0.0).attn_backend == "fused"
    with pytest.raises(ConfigError, match="not one of"):
        cost.Variant.parse("t5@fast")


def test_lm_shapes_are_the_causal_lm_without_segments():
    from dietpe.models.causal import DietCausalConfig

    config = cost.model_config("lm-bert-tiny", cost.Variant.parse("alibi"), 2048)
    assert isinstance(config, DietCausalConfig) and config.max_position_embeddings == 2048
    assert type(cost.build_model(config)).__name__ == "DietCausalModel"
    with pytest.raises(ConfigError, match="no segments"):
        cost.model_config("lm-bert-tiny", cost.Variant.parse("diet-rel+seg"))
    with pytest.raises(ConfigError, match="lm-"):
        cost.model_config("lm-bert-huge", cost.BASELINE)


def test_candidates_a_backend_refuses_are_left_out_with_a_log_line():
    logs = []
    methods = [cost.Variant.parse(m) for m in ("alibi@sdpa", "xlnet@fused", "diet-rel+seg")]
    rows = cost.measure("lm-bert-tiny", 8, 1, methods, repeats=1, warmup=0, modes=("infer",), log=logs.append)
    assert [r.method for r in rows] == ["none", "alibi@sdpa"]
    assert any("xlnet@fused left out" in m and "tile" in m for m in logs)  # XLNet's term reads the query
    assert any("diet-rel+seg left out" in m and "segments" in m for m in logs)


def test_cli_refuses_the_fused_backend_off_cuda(capsys):
    assert main(["bench", "--shapes", "bert-tiny", "--backends", "fused", "--attention-dropout", "0",
                 "--no-memory", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--device cuda" in err
    assert main(["bench", "--attention-dropout", "1.5", "--no-memory"]) == 2


def test_a_method_named_with_its_backend_runs_there_alone():
    import argparse

    from dietpe.bench.cli import _parse

    args = argparse.Namespace(repeats=1, warmup=0, threads=1, attention_dropout=None, json=None, markdown=None,
                              modes=["train"], backends=["fused", "sdpa"], long=False, long_methods=None,
                              long_length=None, shapes=["bert-tiny"], peers=False,
                              methods=["none@fused", "rotary@auto", "diet-rel", "t5@sdpa"])
    variants = _parse(args)[0]
    assert [(v.position, v.backend) for v in variants] == [
        ("none", "fused"), ("rotary", "auto"), ("diet-rel", "fused"), ("diet-rel", "sdpa"), ("t5", "sdpa")]


def test_a_failed_memory_measurement_is_one_line_naming_it(monkeypatch):
    import subprocess

    from dietpe.bench import memory
    from dietpe.errors import DietError

    killed = subprocess.CompletedProcess([], -9, stdout="", stderr="")  # as the out-of-memory killer leaves it
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: killed)
    spec = memory._spec("bert-small", "diet-rel", 512, 8, "train", 1, "cpu", "fp32")
    with pytest.raises(DietError, match=r"memory measurement of diet-rel at bert-small, length 512, batch 8 \(train\) "
                                        r"failed: killed by signal 9; --no-memory skips it"):
        memory.measure_peak(spec)


def test_a_method_with_its_own_fields_is_a_row_of_its_own():
    from dietpe.bench.cost import Variant, model_config
    from dietpe.errors import ConfigError

    v = Variant.parse("shaw:shaw_max_distance=1024")
    assert v.label == "shaw:shaw_max_distance=1024" and v != Variant.parse("shaw")
    assert model_config("bert-tiny", v).shaw_max_distance == 1024
    seg = Variant.parse("diet-abs:position_rank=8:sharing=layer+seg@sdpa")
    assert (seg.segment, seg.backend) == ("per-head", "sdpa")
    assert dict(seg.fields) == {"position_rank": 8, "sharing": "layer"}
    config = model_config("bert-tiny", seg)
    assert (config.position_rank, config.sharing, config.segment) == (8, "layer", "per-head")
    with pytest.raises(ConfigError, match="'\\+seg'"):
        Variant.parse("diet-rel:segment=input")
    with pytest.raises(ConfigError, match="shaw_max_distanc"):
        Variant.parse("shaw:shaw_max_distanc=3")
