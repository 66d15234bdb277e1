"""The GPU profile script's variants, checked without a GPU: `/jit`, `/score` and `/rows` after a method run its
step with the kernels launched through Triton, the offset tables read per score, their gradients summed in the dQ
kernel, and nothing else is accepted."""


import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def profile_script():
    return load_script("scripts/gpu_profile.py", "gpu_profile")


def test_suffixes_are_parsed_and_checked(profile_script):
    assert profile_script._parse("diet-rel@fused") == ("diet-rel@fused", set())
    assert profile_script._parse("diet-rel+seg@fused/score/jit") == ("diet-rel+seg@fused", {"score", "jit"})
    with pytest.raises(SystemExit, match="unknown suffix \\['fast'\\]; allowed: jit, score, rows"):
        profile_script._parse("fire@fused/fast")
    for label in profile_script.METHODS.split(","):
        profile_script._parse(label)


def test_a_variant_runs_its_step_under_its_settings(profile_script):
    pytest.importorskip("triton")
    from dietpe.attention.kernels import attention, launch

    seen = []

    def step():
        seen.append((attention.current_table_read(), launch.cached(), attention.TABLE_GRAD.current()))
    plain = profile_script._variant(step, set())
    assert plain is step
    profile_script._variant(step, {"score"})()
    profile_script._variant(step, {"jit", "score"})()
    profile_script._variant(step, {"rows"})()
    step()
    default_launch, default_grad = seen[-1][1], seen[-1][2]
    assert seen[0] == ("score", default_launch, default_grad)
    assert seen[1] == ("score", False, default_grad)
    assert seen[2] == (attention.TABLE_READ.read(), default_launch, "rows")
    assert seen[3][0] == attention.TABLE_READ.read()  # restored after the step
    assert default_grad == attention.TABLE_GRAD.read()


def test_the_graphs_table_times_each_call_and_its_replay(profile_script, monkeypatch):
    """Its plumbing on the CPU, with stand-ins for the CUDA graph API: each method's forward runs on its own
    (warm-up on the side stream, capture, the timed calls) and as the capture's replay, and the table gives
    both times and ratios to the first method's; the fused kernel runs under the interpreter."""
    import contextlib

    import torch

    captured, replays = [], []

    class Graph:
        def replay(self):
            replays.append(1)

    @contextlib.contextmanager
    def graph(g):
        captured.append(g)
        yield

    stream = type("Stream", (), {"wait_stream": lambda self, other: None})
    for name, value in (("Stream", stream), ("current_stream", stream), ("stream", lambda s: contextlib.nullcontext()),
                        ("CUDAGraph", Graph), ("graph", graph), ("synchronize", lambda: None)):
        monkeypatch.setattr(torch.cuda, name, value)
    lines = profile_script.graphs_table(["none", "diet-rel@fused"], "bert-tiny", 16, 2, 3, device="cpu")
    assert len(captured) == 2 and len(replays) == 2 * 3
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| none") or line.startswith("| diet-rel")]
    assert [r[0].strip() for r in rows] == ["none", "diet-rel@fused"]
    assert [rows[0][i].strip() for i in (2, 4, 6)] == ["1.000"] * 3  # the first divides by itself
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and float(r[3]) >= 0 and float(r[4]) > 0 for r in rows)
    assert all(0 < float(r[5]) <= float(r[1]) + 0.01 for r in rows)  # the host's part of the call


def test_the_ops_table_times_causal_rows_against_flashs_causal_in_both_orders(profile_script, monkeypatch):
    """Its plumbing on the CPU, with a stand-in for Triton's timer (each op run once, then a time by its row): the
    causal rows divide by flash's causal row, and the index-order rows run under that setting."""
    pytest.importorskip("triton")
    import triton.testing

    from dietpe.attention.kernels import attention

    times, calls = [], []
    real = attention.fused_attention

    def fused_attention(*args):
        calls.append((len(args) > 6 and args[6].causal, attention.ORDER.current()))
        return real(*args)

    def do_bench(fn, warmup=0, rep=0, return_mode="median", grad_to_none=None):
        fn()
        times.append(float(len(times) + 1))
        return times[-1]
    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    monkeypatch.setattr(attention, "fused_attention", fused_attention)
    lines = profile_script.ops_table([(1, 2, 24, 16)], device="cpu")
    rows = {r[1].strip(): r for r in (line.split("|")[1:-1] for line in lines if line.startswith("| 1x2x24x16"))}
    assert len(rows) == 10 and len(times) == 20
    assert rows["sdpa flash"][4].strip() == rows["sdpa flash, causal"][4].strip() == "1.00"
    # times are 1, 2, 3, ...: the seventh op's forward is the 13th call, each ratio to its own group's first row
    assert float(rows["fused, causal, no term"][4]) == pytest.approx(13 / 11, abs=0.01)
    assert [c for c in calls if c[0]] == [(True, "longest")] * 2 + [(True, "index")] * 2 + \
        [(True, "longest")] * 2 + [(True, "index")] * 2


def test_the_tiles_table_tunes_every_kernel_over_shipped_and_swept_tiles_then_restores_them(profile_script,
                                                                                           monkeypatch):
    """Its plumbing on the CPU: the kernels run under the interpreter but tune as on a GPU, with a stand-in for
    the tuner's timer (a time by tile); each kernel's row gives the best shipped tile and the best of all, and
    afterwards the shipped lists, the tuner's repeats and what it had chosen are back."""
    pytest.importorskip("triton")
    import ast

    from dietpe.attention.kernels import attention

    monkeypatch.setattr(profile_script, "TILE_SWEEP", {"FORWARD_CONFIGS": [(32, 16, 4, 2)],
                                                        "BACKWARD_Q_CONFIGS": [(16, 16, 8, 1)],
                                                        "BACKWARD_KV_CONFIGS": [(16, 16, 4, 3)]})
    swept = {c for extra in profile_script.TILE_SWEEP.values() for c in extra}
    timed = []

    def seconds(launch):
        timed.append(attention.TUNE_REPEATS)
        launch()
        return 1e-6 * (1 + timed_config[-1][1] / 100) if timed_config[-1] not in swept else 1e-7

    timed_config = []
    real_run = attention._run

    def run(kernel, spec, tensors, seed):
        c = spec.constants
        blk = c.get("BLK")  # the band kernel's square tile
        timed_config.append((c.get("BM", blk), c.get("BN", blk), c["num_warps"], c["num_stages"]))
        return real_run(kernel, spec, tensors, seed)
    monkeypatch.setattr(attention, "_seconds", seconds)
    monkeypatch.setattr(attention, "_run", run)
    monkeypatch.setattr(attention, "interpreting", lambda: False)
    monkeypatch.setattr(attention, "_tuning", lambda: True)
    shipped = {name: getattr(attention, name) for name in ("FORWARD_CONFIGS", "BACKWARD_Q_CONFIGS",
                                                           "BACKWARD_KV_CONFIGS")}
    attention._chosen[("kept",)] = (1, 2, 3, 4)
    lines = profile_script.tiles_table([(1, 2, 32, 16)], device="cpu", repeats=7)
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| 1x2x32x16")]
    kernels = [(r[1].strip(), r[2].strip()) for r in rows]
    assert kernels == [("none", "fwd"), ("none", "dq"), ("none", "dkdv"),
                       ("offset table", "fwd"), ("offset table", "dq"), ("offset table", "dkdv"),
                       ("offset table", "band")]
    assert timed and set(timed) == {7}
    for r in rows:
        if r[2].strip() == "band":  # no tile swept: the best is a shipped one
            assert r[3].strip() == r[5].strip() and r[7].strip() == "1.00"
        else:  # the swept tile timed quickest, against the shipped list's best
            assert ast.literal_eval(r[5]) in swept and ast.literal_eval(r[3]) not in swept
            assert float(r[7]) < 1
    assert any("(32, 16, 4, 2) 0.1" in line for line in lines)  # the details list every tile tried
    assert {name: getattr(attention, name) for name in shipped} == shipped
    assert attention.TUNE_REPEATS == 3 and attention._chosen.pop(("kept",)) == (1, 2, 3, 4)
    attention._chosen.clear()
