"""The analysis of a model on a GPU: every number reaches NumPy, the plots and JSON through host memory. A model
whose tensors refuse `.numpy()` until moved to the CPU (`OffHost`, as CUDA tensors do) stands in for one on a
GPU, and the `meta` device for another device that the model's inputs must be moved to."""

import json

import numpy as np
import pytest
import torch

from dietpe import DietConfig, DietForMaskedLM
from dietpe.analysis import analyze, attention_logits, position_pattern, report, segment_pattern, two_segments
from tests.conftest import OffHost, off_host


def tiny_mlm(position, segment="none"):
    cfg = DietConfig.from_preset("bert-tiny", position=position, segment=segment, vocab_size=60,
                                 max_position_embeddings=24, hidden_size=32, intermediate_size=64)
    return DietForMaskedLM(cfg).eval()


def test_off_host_tensors_refuse_numpy_like_gpu_tensors():
    t = torch.ones(2, 3).as_subclass(OffHost)
    for convert in (lambda x: x.numpy(), np.asarray, lambda x: (x * 2).sum(0).numpy()):
        with pytest.raises(TypeError, match="cuda"):
            convert(t)
    assert type(t.cpu()) is torch.Tensor and type(t.to("cpu")) is torch.Tensor and type(t.float()) is OffHost
    assert t.sum().item() == 6.0 and t.tolist() == [[1.0] * 3] * 2


# every part of the report: ranks, patterns and profiles, per-head segment tables, position embeddings
@pytest.mark.parametrize("position, segment", [("diet-abs", "per-head"), ("absolute", "input"),
                                               ("diet-rel", "per-head"), ("tupe-a", "none")])
def test_the_report_of_a_model_on_a_device_goes_through_host_memory(tmp_path, position, segment):
    model = tiny_mlm(position, segment)
    ids = torch.randint(5, 60, (2, 12))
    want = analyze(model, ids).summary()
    index = report(off_host(model), {"input_ids": ids}, tmp_path / position)
    got = json.loads((index.parent / "summary.json").read_text())
    assert got == json.loads(json.dumps(want))  # the same numbers as on the host
    assert (index.parent / "ranks.png").is_file()


def test_patterns_and_segments_run_where_the_model_is(tmp_path):
    """The segment input and positions the analysis makes itself go to the model's device (meta here)."""
    model = tiny_mlm("diet-rel", "per-head").to("meta")
    assert all(p.device.type == "meta" for p in segment_pattern(model, two_segments(16, 8)))
    assert all(p.device.type == "meta" for p in position_pattern(model, 10))
    logits = attention_logits(model, {"input_ids": torch.randint(5, 60, (2, 12), device="meta")})
    assert logits[0].full.shape == (2, 2, 12, 12)
