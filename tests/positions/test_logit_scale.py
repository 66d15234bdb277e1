"""The logit-unit parametrization: per-head logit tables stored over `logit_scale` and used multiplied back.

The equations (tests/positions/test_references.py) read the effective table; here: effective = stored × scale,
the init is the same in logit units at every scale, the gradient in logit units is the same and the stored
one is scale ×, one AdamW step moves the effective table by scale × lr, and a checkpoint whose config lacks the
field (written before it existed) is read with scale 1, its tables as stored.
"""

import json

import pytest
import torch

from dietpe import DietForMaskedLM, DietModel
from dietpe.config import LOGIT_SCALE
from dietpe.positions.registry import REGISTRY
from tests.conftest import batch, method_fields, tiny

# (position, segment): every method with logit-unit parameters, with its papers' segments (per head for DIET)
CASES = [(p, m.segment) for p, m in REGISTRY.items() if m.method.logit_parameters]


def logit_tables(model) -> dict[str, tuple]:
    """{name: (method, parameter name)} of every logit-unit parameter of a DietModel."""
    out = {}
    for prefix, module in model.named_modules():
        for name in getattr(module, "logit_parameters", ()):
            if name in dict(module.named_parameters(recurse=False)):
                out[f"{prefix}.{name}"] = (module, name)
    return out


def same_effective(scale: float, position: str, segment: str, seed: int = 0):
    """A model at `scale` and one at scale 1 holding the same effective tables (and every other weight)."""
    torch.manual_seed(seed)
    a = DietModel(tiny(position=position, segment=segment, logit_scale=scale, attn_backend="eager"))
    with torch.no_grad():  # tables of order 1 in logit units, so a dropped scale shows
        for module, name in logit_tables(a).values():
            getattr(module, name).normal_(std=1.0 / scale)
    b = DietModel(tiny(position=position, segment=segment, logit_scale=1.0, attn_backend="eager"))
    state = a.state_dict()
    for key in logit_tables(a):
        state[key] = state[key] * scale
    b.load_state_dict(state)
    return a, b


def loss(model, inputs):
    # a fixed random readout: the squared mean of a LayerNorm's output would be a constant
    out = model(*inputs).last_hidden_state
    return (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))).sum()


def test_new_configs_default_to_the_scale():
    assert tiny(position="t5").logit_scale == LOGIT_SCALE > 1
    model = DietModel(tiny(position="diet-rel", segment="per-head"))
    assert {m.logit_scale for m, _ in logit_tables(model).values()} == {LOGIT_SCALE}


@pytest.mark.parametrize("position,segment", CASES)
def test_effective_table_is_the_stored_one_times_the_scale(position, segment):
    a, b = same_effective(7.0, position, segment)
    tables = logit_tables(a)
    assert len(tables) >= (2 if segment == "per-head" else 1)
    for key, (module, name) in tables.items():
        stored = getattr(module, name)
        assert torch.equal(module.logit(name), stored * 7.0), key
        assert not torch.equal(module.logit(name), stored), key
    # the model computes with the effective table: same outputs as the scale-1 model holding it
    ids, mask, segments = batch()
    with torch.no_grad():
        torch.testing.assert_close(a(ids, mask, segments).last_hidden_state, b(ids, mask, segments).last_hidden_state,
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position,segment", CASES)
def test_init_is_the_same_in_logit_units_at_every_scale(position, segment):
    stds = {}
    for scale in (1.0, 10.0, 100.0):
        torch.manual_seed(0)
        model = DietModel(tiny(position=position, segment=segment, logit_scale=scale, max_position_embeddings=512,
                               **method_fields(position, t5_num_buckets=256, t5_max_distance=128)))
        effective = torch.cat([m.logit(n).detach().flatten() for m, n in logit_tables(model).values()])
        stored = torch.cat([getattr(m, n).detach().flatten() for m, n in logit_tables(model).values()])
        stds[scale] = float(effective.std())
        assert float(stored.std()) == pytest.approx(stds[scale] / scale, rel=1e-5)
    for scale in stds:
        assert stds[scale] == pytest.approx(model.config.initializer_range, rel=0.15)


@pytest.mark.parametrize("position,segment", CASES)
def test_gradient_in_logit_units_is_unchanged_and_the_stored_one_is_scale_times(position, segment):
    a, b = same_effective(10.0, position, segment)
    ids, mask, segments = batch()
    for model in (a, b):
        loss(model, (ids, mask, segments)).backward()
    ta, tb = logit_tables(a), logit_tables(b)
    for key in ta:
        ga, gb = getattr(*ta[key]).grad, getattr(*tb[key]).grad
        assert gb.abs().sum() > 0, key
        # d loss / d stored = scale × d loss / d effective; d loss / d effective is the scale-1 model's gradient
        torch.testing.assert_close(ga, 10.0 * gb, atol=1e-6 * float(ga.abs().max()), rtol=1e-3)


@pytest.mark.parametrize("scale", [1.0, 10.0])
@pytest.mark.parametrize("position,segment", CASES)
def test_one_adamw_step_moves_the_effective_table_by_scale_times_lr(position, segment, scale):
    torch.manual_seed(0)
    model = DietModel(tiny(position=position, segment=segment, logit_scale=scale, attn_backend="eager"))
    tables = logit_tables(model)
    before = {k: m.logit(n).detach().clone() for k, (m, n) in tables.items()}
    lr = 1e-3
    # one optimizer, one learning rate; eps small beside the gradients, so Adam's first step is lr · sign(g)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, eps=1e-14)
    loss(model, batch()).backward()
    opt.step()
    for key, (m, n) in tables.items():
        grad = getattr(m, n).grad
        moved = (m.logit(n).detach() - before[key])[grad.abs() > 1e-11]
        assert moved.numel() > 0, key
        torch.testing.assert_close(moved.abs(), torch.full_like(moved, scale * lr), atol=0, rtol=0.02)


def test_a_checkpoint_without_the_field_reads_its_tables_as_stored(tmp_path):
    torch.manual_seed(0)
    old = DietForMaskedLM(tiny(position="diet-rel", segment="per-head", logit_scale=1.0))
    old.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    fields = json.loads(path.read_text())
    del fields["logit_scale"]  # as every checkpoint written before the field existed
    path.write_text(json.dumps(fields))
    loaded = DietForMaskedLM.from_pretrained(tmp_path)
    assert loaded.config.logit_scale == 1.0
    ids, mask, segments = batch()
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids, mask, segments).logits, old.eval()(ids, mask, segments).logits)
    # a new checkpoint records its scale and reads back the same
    new = DietForMaskedLM(tiny(position="diet-rel", segment="per-head"))
    new.save_pretrained(tmp_path / "new")
    again = DietForMaskedLM.from_pretrained(tmp_path / "new")
    assert again.config.logit_scale == LOGIT_SCALE
    with torch.no_grad():
        assert torch.equal(again.eval()(ids, mask, segments).logits, new.eval()(ids, mask, segments).logits)


def test_bad_scale_is_refused_in_one_line():
    from dietpe.errors import ConfigError

    for bad in (0, -1.0, float("inf"), True, "10"):
        with pytest.raises(ConfigError, match="logit_scale="):
            tiny(position="t5", logit_scale=bad)
