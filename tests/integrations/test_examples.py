"""The ways in that docs/integrate.md shows run: the nanoGPT example trains, `dietpe lm --arch llama` builds
and trains an attached Llama, the standalone form equals diet's own model."""

import importlib.util
from pathlib import Path

import pytest
import torch

from dietpe import ConfigError, InputError, Positions
from dietpe.tasks.lm import causal_config, length_perplexities, train_lm

ROOT = Path(__file__).resolve().parents[2]


def test_nanogpt_example_trains():
    spec = importlib.util.spec_from_file_location("nanogpt", ROOT / "examples" / "nanogpt.py")
    nanogpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nanogpt)
    losses = nanogpt.train("diet-rel", steps=25, length=32, batch=8, lr=1e-2)
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5


def test_lm_trains_an_attached_llama():
    config = causal_config("alibi", "toy", 30, 16, 0)
    stream = [i % 29 + 1 for i in range(400)]
    model, _, losses = train_lm(config, stream, 20, 4, 16, 3e-3, 0, log=lambda m: None, arch="llama")
    assert type(model).__name__ == "LlamaForCausalLM" and model.model.diet_positions.spec == "alibi"
    assert losses[-1] < losses[0]
    ppl = length_perplexities(model, None, stream, 16, (1, 2), 64)
    assert set(ppl) == {1, 2} and all(v is not None and v > 1 for v in ppl.values())
    absolute = train_lm(causal_config("absolute", "toy", 30, 16, 0), stream, 2, 4, 16, 3e-3, 0,
                        log=lambda m: None, arch="llama")[0]
    assert length_perplexities(absolute, None, stream, 16, (1, 2), 64)[2] is None  # beyond its table


def test_standalone_positions_follow_the_mask_and_positions():
    torch.manual_seed(0)
    pos = Positions("diet-rel", num_layers=1, num_heads=2, head_size=4, max_length=16, causal=True)
    with torch.no_grad():
        pos.encoding.method.r.normal_()
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))
    out = pos.attend(q, k, v, pos.context(torch.arange(6)))
    # causal: the first 3 outputs do not see keys 3.. ; relative: a shift of positions changes nothing
    short = pos.attend(q[:, :, :3], k[:, :, :3], v[:, :, :3], pos.context(torch.arange(3) + 5))
    torch.testing.assert_close(out[:, :, :3], short, atol=1e-6, rtol=0)
    keep = torch.tensor([[True, True, True, True, False, False]])
    # the same table in an encoder (causal attention clips DIET-REL at half the length by default)
    masked = Positions("diet-rel:diet_rel_max_distance=8", num_layers=1, num_heads=2, head_size=4, max_length=16,
                       causal=False)
    masked.load_state_dict(pos.state_dict())
    a = masked.attend(q, k, v, masked.context(torch.arange(6)), mask=keep)
    b = masked.attend(q, k[:, :, :4], v[:, :, :4], masked.context(torch.arange(6), torch.arange(4)))
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_standalone_positions_refuse_what_they_were_not_built_for():
    """Shapes, layers and fields a Positions was not built for: one error naming the limit, not torch's."""
    pos = Positions("diet-rel", num_layers=2, num_heads=4, head_size=8)
    q = torch.randn(2, 4, 6, 8)
    ctx = pos.context(torch.arange(6))
    assert pos.attend(q, q, q, ctx, layer=1).shape == q.shape
    for layer in (2, -1, "0"):
        with pytest.raises(InputError, match=r"built for 2 layers \(0 to 1\)"):
            pos.attend(q, q, q, ctx, layer=layer)
    grouped = torch.randn(2, 2, 6, 8)
    with pytest.raises(InputError, match=r"k has shape \(2, 2, 6, 8\); this Positions was built for 4 heads"):
        pos.attend(q, grouped, grouped, ctx)
    with pytest.raises(InputError, match="the batch sizes must match"):
        pos.attend(q, q[:1], q[:1], ctx)
    with pytest.raises(ConfigError, match="attention is a field of the model"):
        Positions("diet-abs:attention=linformer", num_layers=1, num_heads=4, head_size=8)


def test_standalone_positions_take_a_tokenizers_integer_mask_as_a_keep_mask():
    """A 0/1 integer mask (what a tokenizer returns) keeps where 1, as a boolean one; it was added as logits."""
    torch.manual_seed(0)
    pos = Positions("t5", num_layers=1, num_heads=2, head_size=4)
    q, k, v = (torch.randn(2, 2, 6, 4) for _ in range(3))
    ctx = pos.context(torch.arange(6))
    keep = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    want = pos.attend(q, k, v, ctx, mask=keep.bool())
    for mask in (keep, keep.int()):
        torch.testing.assert_close(pos.attend(q, k, v, ctx, mask=mask), want)


def test_standalone_positions_name_a_context_mask_or_segments_that_do_not_fit():
    pos = Positions("diet-rel:segment=per-head", num_layers=1, num_heads=2, head_size=4)
    q = torch.randn(2, 2, 6, 4)
    segments = torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)
    ctx = pos.context(torch.arange(6), segments=segments)
    with pytest.raises(InputError, match="the context holds 6 query and 6 key positions for q of length 5"):
        pos.attend(q[:, :, :5], q[:, :, :5], q[:, :, :5], ctx)
    with pytest.raises(InputError, match=r"mask has shape \(2, 1, 1, 5\); give \(B, 6\)"):
        pos.attend(q, q, q, ctx, mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(InputError, match="per-head segments need segment ids"):
        pos.context(torch.arange(6))
    with pytest.raises(InputError, match=r"token_type_ids must lie in \[0, 1\]"):
        pos.context(torch.arange(6), segments=segments + 1)
