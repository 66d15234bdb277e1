"""A forward leaves no reference cycles: its position terms (dense biases on eager and sdpa, tables on the fused
kernel) are freed when it returns, by reference counting, not whenever Python's cycle collector next runs. With a
cycle, each step's terms would linger into the next step and add to its peak memory (a (1, H, L, L) bias per
layer at long lengths on sdpa)."""

import gc

import pytest
import torch

import dietpe
from dietpe import DietModel
from dietpe.bench.attach import llama
from dietpe.bench.footprint import LiveBytes
from dietpe.models.causal import DietForCausalLM
from dietpe.models.seq2seq import DietForConditionalGeneration
from dietpe.positions.registry import REGISTRY
from tests.conftest import tiny
from tests.models.test_causal import tiny_lm
from tests.models.test_seq2seq import source, tiny_s2s

CASES = [(name, segment) for name, info in REGISTRY.items()
         for segment in (("input", "per-head") if info.shareable else ("input",))]


def _ours(obj) -> bool:
    """A tensor, or an object or function of dietpe's (torch's own code may leave cycles on the meta device)."""
    if isinstance(obj, (torch.Tensor, torch.UntypedStorage)):
        return True
    module = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
    return isinstance(module, str) and module.startswith("dietpe")


def cyclic_garbage(step) -> list[str]:
    """What one call of `step` (after two untimed calls) leaves in reference cycles: tensors and dietpe's
    objects, by type."""
    step()
    step()
    for _ in range(5):  # until nothing is left: a collection may free more (weakref callbacks, e.g. dynamo's
        if not gc.collect():  # cache entries for a model an earlier test compiled)
            break
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        step()
        gc.collect()
        return sorted({type(o).__qualname__ if not callable(o) else o.__qualname__ for o in gc.garbage if _ours(o)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _encoder_step(model, train: bool):
    ids = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    segments = (torch.arange(12) >= 6).long().expand(2, 12)

    def step():
        model.train(train)
        with torch.set_grad_enabled(train):
            out = model(ids, token_type_ids=segments).last_hidden_state
            if train:
                out.square().mean().backward()

    return step


@pytest.mark.parametrize("backend", ["eager", "auto"])
@pytest.mark.parametrize("position,segment", CASES)
def test_a_training_step_and_a_forward_leave_no_cycles(position, segment, backend):
    model = DietModel(tiny(8, position=position, segment=segment, attn_backend=backend))
    assert cyclic_garbage(_encoder_step(model, True)) == []
    assert cyclic_garbage(_encoder_step(model, False)) == []


@pytest.mark.parametrize("position,segment", [("diet-rel", "per-head"), ("t5", "input"), ("tupe-r", "input"),
                                              ("alibi", "input"), ("fire", "input"), ("diet-abs", "per-head")])
def test_the_fused_kernels_host_path_leaves_no_cycles(position, segment):
    pytest.importorskip("triton", reason="the fused kernel's host path imports triton (pip install triton)")
    # on the meta device: the kernel's whole host path, nothing launched (Triton's interpreter makes cycles of
    # its own)
    with torch.device("meta"):
        model = DietModel(tiny(8, position=position, segment=segment, attn_backend="fused"))
    ids = torch.randint(1, 50, (2, 12), device="meta")

    def step():
        model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state.square().mean().backward()

    assert cyclic_garbage(step) == []


def test_a_forwards_terms_are_freed_when_it_returns():
    """The user-visible effect: at inference nothing a forward built outlives it (gc off: refcounting alone)."""
    model = DietModel(tiny(8, position="diet-rel", segment="per-head", attn_backend="sdpa")).eval()
    ids = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids)
    gc.disable()
    try:
        with torch.no_grad(), LiveBytes() as live:
            out = model(ids).last_hidden_state
            del out
        assert live.peak > 0 and live.current == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("position", ["diet-rel", "alibi", "t5"])
def test_the_causal_lm_and_the_translation_model_leave_no_cycles(position):
    lm = DietForCausalLM(tiny_lm(position))
    x = torch.randint(3, 20, (2, 10), generator=torch.Generator().manual_seed(0))
    assert cyclic_garbage(lambda: lm(x, labels=x).loss.backward()) == []
    s2s = DietForConditionalGeneration(tiny_s2s(position))
    ids, mask = source()
    assert cyclic_garbage(lambda: s2s(ids, attention_mask=mask, labels=ids).loss.backward()) == []


@pytest.mark.parametrize("spec", ["diet-rel", "t5", "alibi", "diet-abs"])
def test_an_attached_models_last_forward_goes_at_the_next(spec):
    model = dietpe.attach(llama(2, 32, 4, 2, 64, 64, "cpu", torch.float32), spec)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    assert cyclic_garbage(lambda: model(input_ids=x, labels=x, use_cache=False).loss.backward()) == []
