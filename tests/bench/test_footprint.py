"""The step's memory modelled on the meta device (`dietpe.bench.footprint`): the live-bytes counter against
allocations written out, and the fused kernel's path holding no (L, L) tensor at 4,096 tokens, where the eager
reference holds the (1, H, L, L) bias."""

import gc

import pytest
import torch

from dietpe.bench import footprint
from dietpe.bench.footprint import LiveBytes, step_footprint

pytest.importorskip("triton", reason="the fused kernel's host path imports triton (pip install triton)")

SHAPE, L = "lm-bert-mini", 4096
#: the terms the kernel reads inside its tiles from a table (no wider q and k)
TABLES = ("diet-rel", "t5", "alibi", "kerple", "fire")
#: every method the fused kernel serves in a causal LM
SERVED = (*TABLES, "none", "absolute", "sinusoidal", "rotary", "diet-abs", "tupe-a", "tupe-r")
MIB = 2**20


def test_counts_what_the_ops_create_while_it_is_alive():
    before = torch.empty(1000, device="meta")  # existed before: never counted, nor what reads or writes it
    with LiveBytes() as live:
        before.mul_(2)
        view = before.view(10, 100)
        a = torch.empty(1000, device="meta")  # 4,000 bytes
        b = a + 1  # 8,000
        assert (live.current, live.peak) == (8000, 8000)
        del a  # 4,000
        c = torch.empty(250, dtype=torch.float64, device="meta")  # 6,000
        b.add_(1)  # in place: nothing new
        d = b[:10]  # a view: nothing new
        assert (live.current, live.peak) == (6000, 8000)
        del b  # its view d keeps the storage alive
        assert live.current == 6000
        del d
        assert live.current == 2000
    assert live.largest == (4000, "empty", (1000,))
    assert view.shape == (10, 100) and c.numel() == 250


def test_counts_what_autograd_keeps_for_the_backward():
    x = torch.empty(1000, device="meta", requires_grad=True)
    with LiveBytes() as live:
        y = x.exp()  # kept for exp's backward: 4,000
        z = y.sum()
        assert live.current == 4000 + 4  # y and z
        del y
        assert live.current == 4000 + 4  # the graph keeps y
        z.backward()  # x.grad (4,000) is created; the graph and y go
        del z
    assert live.current == 4000
    assert live.peak == 4000 + 4 + 4 + 4000  # y, z, z's gradient and x.grad (exp's product, kept) at once


@pytest.mark.parametrize("method", SERVED)
def test_the_fused_path_holds_no_length_squared_tensor(method, monkeypatch):
    from dietpe.attention.kernels import attention

    calls = []
    real = attention.attention_backward
    monkeypatch.setattr(attention, "attention_backward", lambda *a, **k: calls.append(1) or real(*a, **k))
    f = step_footprint(SHAPE, method, L, 1)
    assert len(calls) == 2 * 4  # the kernel's own host path ran, once per layer in each of the two steps
    assert f.largest_mib * MIB < L * L * 2, (f.largest_op, f.largest_shape)  # less than one bf16 (L, L)


def test_the_eager_reference_holds_the_bias_which_the_check_sees():
    f = step_footprint(SHAPE, "diet-rel@eager", L, 1)
    assert f.largest_mib * MIB >= 4 * L * L * 2 and f.largest_shape[-2:] == (L, L)  # (1, H, L, L)
    assert f.step_mib > 10 * step_footprint(SHAPE, "none", L, 1).step_mib


@pytest.mark.parametrize("method", TABLES)
def test_a_table_term_adds_at_most_5_percent_of_nones_step_memory(method):
    none = step_footprint(SHAPE, "none", L, 1)
    assert step_footprint(SHAPE, method, L, 1).step_mib <= 1.05 * none.step_mib


def test_the_meta_device_allocates_what_the_cpu_allocates():
    """The same eager step counted on CPU tensors (computed) and on meta ones (shapes only): the same bytes."""
    from dietpe.bench import cost

    def peak(device):
        v = cost.Variant.parse("diet-rel@eager")
        with torch.device(device):
            model = cost.build_model(cost.model_config("lm-bert-tiny", v, 512)).to(torch.bfloat16)
        ids = cost.make_inputs(2, 128, 100)["input_ids"].to(device)
        step = cost.training_step(model, {"input_ids": ids})
        step()
        gc.collect()
        with LiveBytes() as live:
            step()
        return live.peak, live.largest

    assert peak("meta") == peak("cpu")


def test_inference_keeps_less_than_training():
    train, infer = (step_footprint(SHAPE, "diet-rel", 1024, 2, mode) for mode in ("train", "infer"))
    assert 0 < infer.step_mib < train.step_mib


@pytest.mark.parametrize("argv, message", [
    (["--methods", "diet-rel@sdpa"], "backend 'sdpa' is not modelled on the meta device"),
    (["--methods", "diet-rel+seg"], "a causal LM has no segments"),
    (["--length", "0"], "--length and --batch must be at least 1"),
    (["--shape", "bert-huge"], "shape 'bert-huge' is not one of"),
    (["--methods", "diet-rell"], "method 'diet-rell' is not a position method"),
])
def test_bad_input_is_one_line_before_any_row(argv, message, capsys):
    assert footprint.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "[footprint]" not in err and "Traceback" not in err


def test_the_table_names_the_ratio_and_the_largest_tensor(capsys):
    assert footprint.main(["--shape", "lm-bert-tiny", "--length", "256", "--batch", "2",
                           "--methods", "diet-rel,diet-rel@eager"]) == 0
    out = capsys.readouterr().out
    assert "| none@fused |" in out and "| 1.000 |" in out and "| diet-rel@eager |" in out


@pytest.mark.parametrize("method", ["tupe-a", "tupe-r"])
def test_tupes_reset_adds_no_wider_q_and_k(method):
    """In an encoder TUPE resets [CLS]'s row and column: the kernel reads the reset as a table and the rank-d_h
    correlation as its own head part, so q and k are kept at their width for the backward (concatenated with
    the d_h + 2 factors they were 1.15 × `none`'s step)."""
    none = step_footprint("bert-mini", "none", 1024, 2)
    assert step_footprint("bert-mini", method, 1024, 2).step_mib <= 1.05 * none.step_mib


def test_diet_abs_adds_one_table_not_its_scaled_copies():
    """DIET-ABS's P_Q, P_K are as large as a layer's keys per layer at long lengths. The kernel reads P_K's rows
    as stored and P_Q's scaled once (`ScaledLowRank.folded`): the step's peak holds one table's bytes beyond
    `none`'s, where scaling both tables whole every forward, and keeping both copies, held two."""
    none = step_footprint(SHAPE, "none", L, 1)
    diet = step_footprint(SHAPE, "diet-abs", L, 1)
    layers, heads, dh = 4, 4, 64  # bert-mini
    table_mib = layers * heads * L * dh * 2 / MIB  # one of P_Q, P_K in bf16
    assert diet.step_mib - none.step_mib <= 1.05 * table_mib
