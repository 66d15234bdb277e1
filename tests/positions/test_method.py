"""`PositionMethod.layer_table`: a per-layer parameter read through one `unbind` per forward gives every layer
the same slice, and the parameter the same gradient, as indexing it layer by layer; TUPE's table read as a
slice for the default positions gives what the gather gives."""

import pytest
import torch

from dietpe import DietModel
from dietpe.positions import method as method_module
from dietpe.positions.context import Context
from dietpe.positions.tupe import TUPE
from tests.conftest import batch, tiny

PER_LAYER = [("diet-abs", "per-head", "none"), ("diet-rel", "per-head", "none"), ("diet-abs", "per-head", "head"),
             ("diet-rel", "input", "layer")]


def _grads(config, inputs) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = DietModel(config)
    ids, mask, segments = inputs
    out = model(input_ids=ids, attention_mask=mask, token_type_ids=segments).last_hidden_state
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))).sum().backward()  # real gradients
    return {n: p.grad for n, p in model.named_parameters() if n.startswith("positions.")}


@pytest.mark.parametrize("position,segment,sharing", PER_LAYER)
def test_layer_table_gives_the_gradient_of_indexing_each_layer(monkeypatch, position, segment, sharing):
    config = tiny(position=position, segment=segment, sharing=sharing, num_hidden_layers=3, attn_backend="eager")
    inputs = batch()
    got = _grads(config, inputs)
    monkeypatch.setattr(method_module.PositionMethod, "layer_table",
                        lambda self, ctx, name, layer, stored=False:
                        (getattr(self, name) if stored else self.logit(name))[layer])
    want = _grads(config, inputs)
    assert got.keys() == want.keys() and got
    for name in want:
        assert torch.equal(got[name], want[name]), name
        assert got[name].abs().sum() > 0, name  # every table gets a gradient: no layer read a wrong slice


def test_layer_table_is_one_unbind_per_forward():
    method = method_module.PositionMethod()
    method.table = torch.nn.Parameter(torch.randn(3, 2, 5))
    ctx = Context(torch.arange(4), torch.arange(4))
    slices = [method.layer_table(ctx, "table", layer) for layer in (2, 0, 1)]
    assert [torch.equal(s, method.table[i]) for s, i in zip(slices, (2, 0, 1))] == [True] * 3
    assert len(ctx._cache) == 1  # the three layers share one unbind
    again = method.layer_table(Context(torch.arange(4), torch.arange(4)), "table", 2)
    assert again is not slices[0]  # a new forward takes its own


def test_tupe_slice_for_default_positions_equals_the_gather():
    torch.manual_seed(0)
    tupe = TUPE(16, 2, 24, 1e-12, reset=True, relative=False, num_buckets=8, max_distance=16)
    for p in tupe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    pos = torch.arange(3, 13)
    weights = None
    results = []
    for starts in ((3, 3), (None, None)):  # a slice of the table, then the gather
        factors = tupe.correlation_factors(pos, pos, starts)
        weights = weights or [torch.randn_like(f) for f in factors]
        loss = sum((f * w).sum() for f, w in zip(factors, weights))
        results.append(list(factors) + list(torch.autograd.grad(loss, list(tupe.parameters()))))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
