"""--logit-lr-scale: the position parameters added to the attention logits in their own AdamW groups."""

import pytest
import torch

from dietpe import DietConfig, DietForMaskedLM
from dietpe.tasks.optim import logit_parameter_names, parameter_groups


def model(**kw):
    return DietForMaskedLM(DietConfig.from_preset("bert-tiny", vocab_size=50, max_position_embeddings=16, **kw))


@pytest.mark.parametrize("position,segment,expected", [
    # per-head scalar tables, DIET-ABS's factors and per-head segments are logit units ...
    ("diet-rel", "per-head", {"method.r", "head_segments.table"}),
    ("diet-abs", "per-head", {"method.p_q", "method.p_k", "head_segments.table"}),
    ("t5", "input", {"method.bias"}),
    ("tupe-r", "input", {"method.bias", "method.cls_bias"}),
    # ... embedding-unit tables, projections and input segments are not
    ("absolute", "input", set()),
    ("tupe-a", "input", set()),
    ("shaw", "input", set()),
    ("xlnet", "input", set()),
    ("none", "none", set()),
])
def test_logit_parameters_are_named_by_each_method(position, segment, expected):
    m = model(position=position, segment=segment)
    names = logit_parameter_names(m)
    assert {n.split(".positions.")[1] for n in names} == expected
    every = dict(m.named_parameters())
    assert names <= set(every)


def test_groups_scale_only_logit_parameters_and_cover_every_parameter_once():
    m = model(position="diet-rel", segment="input")
    decay = {n for n, _ in m.named_parameters() if "bias" not in n and "LayerNorm" not in n}
    groups = parameter_groups(m, 1e-3, 0.01, decay, logit_lr_scale=10)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(m.parameters()))
    logit = {id(p) for n, p in m.named_parameters() if n in logit_parameter_names(m)}
    assert len(logit) == 1  # R; the input segment table stays at the global rate
    for g in groups:
        kinds = {id(p) in logit for p in g["params"]}
        assert len(kinds) == 1
        assert g["lr"] == pytest.approx(1e-2 if kinds.pop() else 1e-3)
    opt = torch.optim.AdamW(groups, lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    opt.step()
    sched.step()
    assert sorted({g["lr"] for g in opt.param_groups}) == pytest.approx([5e-4, 5e-3])


def test_trainer_builds_the_groups(tmp_path):
    from transformers import TrainingArguments

    from dietpe.tasks.optim import LogitLrTrainer

    m = model(position="t5", segment="input")
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=2e-3, report_to=[], use_cpu=True)
    opt = LogitLrTrainer(model=m, args=args, logit_lr_scale=10).create_optimizer()
    bias = dict(m.named_parameters())[next(iter(logit_parameter_names(m)))]
    for g in opt.param_groups:
        assert g["lr"] == pytest.approx(2e-2 if any(p is bias for p in g["params"]) else 2e-3)
    assert sum(any(p is bias for p in g["params"]) for g in opt.param_groups) == 1
    assert len(LogitLrTrainer(model=model(position="t5"), args=args).create_optimizer().param_groups) == 2
