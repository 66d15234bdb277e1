"""Position-only terms kept between inference forwards (DIET §3.1: "cache the computed matrix before running
inference"): built once while parameters and positions stay the same, rebuilt after any change to them, even
one that leaves the version counters alone (fused AdamW), never kept in training or for custom positions."""

import pytest
import torch

from dietpe import DietForMaskedLM
from dietpe.positions import method as method_module
from dietpe.positions.registry import REGISTRY
from tests.conftest import batch, tiny

# every method with a position-only logit term (no query in it), and DIET-ABS with one table for all layers
KEPT = [(p, "none") for p, m in REGISTRY.items() if "logits" in m.entry and not m.query_terms] + [
    ("diet-abs", "layer")]


@pytest.fixture
def builds(monkeypatch):
    """Count the builds of kept terms (a build is a cache miss)."""
    count = []
    real = method_module.PositionMethod.kept

    def kept(self, ctx, name, tensors, elements, build):
        def counted():
            count.append(name)
            return build()
        return real(self, ctx, name, tensors, elements, counted)

    monkeypatch.setattr(method_module.PositionMethod, "kept", kept)
    return count


def _fresh_copy(model):
    other = DietForMaskedLM(model.config).eval()
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("position,sharing", KEPT)
def test_kept_terms_are_built_once_and_rebuilt_after_any_change(builds, position, sharing):
    wide = dict(position_rank=16) if REGISTRY[position].uses("position_rank") else {}  # rank 8: folded into q/k
    model = DietForMaskedLM(tiny(position=position, sharing=sharing, **wide)).eval()
    ids, mask, seg = batch(9)
    with torch.no_grad():
        first = model(ids, attention_mask=mask, token_type_ids=seg).logits
        n = len(builds)
        assert n > 0
        torch.testing.assert_close(model(ids, attention_mask=mask, token_type_ids=seg).logits, first, rtol=0, atol=0)
        assert len(builds) == n  # the second forward reused every kept term
        model(ids[:, :7], attention_mask=mask[:, :7], token_type_ids=seg[:, :7])
        assert len(builds) == 2 * n  # another length: rebuilt

    # a fused AdamW step changes the parameters without bumping their version counters
    model.train()
    assert "_kept" not in model.diet.positions.method.__dict__  # training frees what inference kept
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    model(ids, attention_mask=mask, token_type_ids=seg, labels=ids).loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        after = model(ids, attention_mask=mask, token_type_ids=seg).logits
        expected = _fresh_copy(model)(ids, attention_mask=mask, token_type_ids=seg).logits
        torch.testing.assert_close(after, expected, rtol=0, atol=0)
        assert not torch.allclose(after, first)
        for p in model.diet.positions.parameters():  # an in-place edit under no_grad
            p.mul_(1.5)
        edited = model(ids, attention_mask=mask, token_type_ids=seg).logits
        torch.testing.assert_close(edited, _fresh_copy(model)(ids, attention_mask=mask, token_type_ids=seg).logits,
                                   rtol=0, atol=0)


def test_nothing_is_kept_in_training_or_for_custom_positions(builds):
    model = DietForMaskedLM(tiny(position="diet-abs", position_rank=16))
    ids, mask, seg = batch(9)
    model(ids, attention_mask=mask, token_type_ids=seg, labels=ids).loss.backward()  # a gradient to track
    model.eval()
    with torch.no_grad():
        model(ids, attention_mask=mask, token_type_ids=seg, position_ids=torch.arange(9) + 2)
        model(ids, attention_mask=mask, token_type_ids=seg, position_ids=torch.arange(9)[None].expand(2, -1))
    assert builds == []
    assert "_kept" not in model.diet.positions.method.state_dict()


def test_nothing_is_kept_off_the_cpu_where_comparing_would_sync_the_host():
    """Comparing the kept copy reads device memory from the host: on a GPU a stall per term and forward, and
    not allowed while a CUDA graph is captured. The meta device stands in for the GPU here."""
    from types import SimpleNamespace

    method = REGISTRY["diet-rel"].build(tiny(position="diet-rel"))

    def ctx(device):
        pos = torch.arange(4, device=device)[None]
        return SimpleNamespace(q_start=0, k_start=0, q_pos=pos, k_pos=pos)
    with torch.no_grad():
        on_cpu = method.kept(ctx("cpu"), "t", (torch.zeros(3),), 16, lambda: 1)
        off_cpu = method.kept(ctx("meta"), "t", (torch.zeros(3, device="meta"),), 16, lambda: 1)
    assert on_cpu is not None and on_cpu() == 1
    assert off_cpu is None
