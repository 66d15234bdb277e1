"""--position-lr-scale: position parameters (everything under diet.positions) in their own AdamW groups."""

import pytest
import torch

from diet import DietConfig, DietForMaskedLM
from diet.tasks.optim import parameter_groups, position_parameter_names


def model(**kw):
    return DietForMaskedLM(DietConfig.from_preset("bert-tiny", vocab_size=50, max_position_embeddings=16, **kw))


@pytest.mark.parametrize("position,segment,expected", [
    ("absolute", "input", {"method.weight", "input_segments.weight"}),
    ("diet-rel", "per-head", {"method.r", "head_segments"}),
    ("t5", "input", {"method.bias", "input_segments.weight"}),
    ("none", "none", set()),
])
def test_position_parameters_are_those_of_the_position_encoding(position, segment, expected):
    m = model(position=position, segment=segment)
    names = position_parameter_names(m)
    assert all(".positions." in n for n in names)
    for part in expected:
        assert any(part in n for n in names), (part, names)
    assert not any("word_embeddings" in n or "attention" in n for n in names)


def test_groups_scale_only_position_parameters_and_cover_every_parameter_once():
    m = model(position="diet-rel", segment="input")
    decay = {n for n, _ in m.named_parameters() if "bias" not in n and "LayerNorm" not in n}
    groups = parameter_groups(m, 1e-3, 0.01, decay, position_lr_scale=10)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(m.parameters()))
    position = {id(p) for n, p in m.named_parameters() if n in position_parameter_names(m)}
    for g in groups:
        kinds = {id(p) in position for p in g["params"]}
        assert len(kinds) == 1
        assert g["lr"] == pytest.approx(1e-2 if kinds.pop() else 1e-3)
    opt = torch.optim.AdamW(groups, lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    opt.step()
    sched.step()
    assert sorted({g["lr"] for g in opt.param_groups}) == pytest.approx([5e-4, 5e-3])
