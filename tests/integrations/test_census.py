"""A census of the large tensors an attached Llama creates (`dietpe.bench.attach.Census`: every op output of at
least B·H·L²/4 elements). The native model creates none in a training step; neither does the model with its own
scheme (`rotary`) or `none` attached (no dense (B, 1, L, L) mask: causality stays SDPA's `is_causal`). A
logit-bias method builds its (1, H, L, L) bias once per layer and never a (B, H, L, L) sum with a mask (on the
CPU at inference, where SDPA's fused kernel takes the bias; in CPU training SDPA's math kernel, the only one
that differentiates a bias there, builds the scores itself: the GPU's FlexAttention path is measured by
`python -m dietpe.bench.attach`)."""

import pytest
import torch

import dietpe
from dietpe.bench.attach import Census, llama, train_step

B, H, L = 2, 4, 512
THRESHOLD = B * H * L * L // 4


def model(spec: str):
    m = llama(layers=2, hidden=32, heads=H, kv_heads=2, length=L, vocab=64, device="cpu", dtype=torch.float32)
    return m if spec == "native" else dietpe.attach(m, spec)


def x():
    return torch.randint(0, 64, (B, L), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("spec", ["native", "none", "rotary"])
def test_a_training_step_creates_no_large_tensor(spec):
    m = model(spec).train()
    optimizer = torch.optim.AdamW(m.parameters(), lr=1e-4)
    with Census(THRESHOLD) as census:
        train_step(m, optimizer, x())
    assert census.big == []


@pytest.mark.parametrize("spec", ["diet-rel", "t5", "diet-abs", "alibi", "kerple"])
def test_a_bias_is_built_once_per_layer_and_never_per_example(spec):
    m = model(spec).eval()
    with torch.no_grad(), Census(THRESHOLD) as census:
        m(x(), use_cache=False)
    sizes = [torch.Size(s).numel() for _, s in census.big]
    assert max(sizes, default=0) <= H * L * L, census.big  # (1, H, L, L) and its views: shared by the batch
    assert len(sizes) <= 4 * 2, census.big  # a handful per layer: the term's views, term + causal mask
