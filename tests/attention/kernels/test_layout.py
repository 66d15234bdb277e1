"""The kernel's output and gradients are laid out as its inputs: token-major (B, L, H, D) in memory where q, k
and v are heads split from a (B, L, H·D) projection (the models', transformers'), so the heads merge back by a
view, as FlashAttention's output does, and no copy follows each attention call; dense for any other layout.
The values are the same bits either way."""

import pytest
import torch

from dietpe import DietConfig, DietModel
from tests.attention.kernels.conftest import NO_TRITON
from tests.conftest import TEST_DEVICE

pytest.importorskip("triton", reason=NO_TRITON)

B, H, L, D = 2, 3, 19, 16


def _qkv(layout: str):
    """q, k, v (B, H, L, D) with the same values in three layouts, each requiring grad through its own leaf."""
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(B, H, L, D, generator=g).to(TEST_DEVICE) for _ in range(3)]
    if layout == "dense":
        leaves = [x.clone().requires_grad_() for x in values]
        return leaves, leaves
    if layout == "token-major":  # (B, L, H·D) projections split into heads
        leaves = [x.transpose(1, 2).reshape(B, L, H * D).clone().requires_grad_() for x in values]
        return leaves, [x.view(B, L, H, D).transpose(1, 2) for x in leaves]
    fused = torch.stack([x.transpose(1, 2) for x in values], 2).reshape(B, L, 3 * H * D)  # one qkv projection
    leaf = fused.clone().requires_grad_()
    split = leaf.view(B, L, 3, H, D)
    return [leaf], [split[:, :, i].transpose(1, 2) for i in range(3)]


def _run(layout: str):
    from dietpe.attention.kernels.attention import fused_attention

    leaves, (q, k, v) = _qkv(layout)
    table = torch.linspace(-1, 1, 2 * L - 1, device=TEST_DEVICE).expand(H, -1).contiguous().requires_grad_()
    seen = {}
    for i, x in enumerate((q, k, v)):
        x.register_hook(lambda g, i=i: seen.setdefault(i, g))  # the gradient the kernel returns for each input
    out = fused_attention(q, k, v, D ** -0.5, table)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(TEST_DEVICE)
    (out * w).sum().backward()
    return out, [seen[i] for i in range(3)], table.grad


@pytest.mark.parametrize("layout, token_major", [("token-major", True), ("dense", False), ("split", False)])
def test_outputs_and_gradients_are_laid_out_as_the_inputs_with_the_same_bits(layout, token_major):
    out, grads, d_table = _run(layout)
    want_out, want_grads, want_table = _run("dense")
    merged = lambda x: x.transpose(1, 2).is_contiguous()  # noqa: E731 (heads merge back by a view)
    assert merged(out) == token_major and all(merged(g) == token_major for g in grads)
    assert all(x.is_contiguous() for x in (want_out, *want_grads))
    assert torch.equal(out, want_out) and torch.equal(d_table, want_table)
    assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))


def test_a_fused_training_step_copies_no_attention_output_or_gradient():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        found: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # (Triton's interpreter copies its kernels' arguments back as flat tensors: not the model's copies)
            if func.overloadpacket in (torch.ops.aten.clone, torch.ops.aten._unsafe_view) or (
                    func.overloadpacket is torch.ops.aten.copy_ and args[0].dim() > 1):
                self.found.append((str(func), tuple(args[0].shape)))
            return func(*args, **(kwargs or {}))

    cfg = DietConfig.from_preset("bert-tiny", vocab_size=100, position="diet-rel", attn_backend="fused",
                                 max_position_embeddings=64, hidden_dropout_prob=0.0)
    model = DietModel(cfg).to(TEST_DEVICE).train()
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0)).to(TEST_DEVICE)
    with Copies() as copies:
        model(ids).last_hidden_state.square().mean().backward()
    assert copies.found == []


def test_diet_rel_slices_every_layers_table_at_once():
    """The kernel reads each layer's R at the diagonals' columns: the layers' slices are one view of R a forward,
    so the backward copies into R's gradient once, not once a layer (a zero fill and a copy each on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Slices(TorchDispatchMode):
        found: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten.slice_backward:
                self.found.append(tuple(args[1]))  # the sliced tensor's shape
            return func(*args, **(kwargs or {}))

    cfg = DietConfig.from_preset("bert-tiny", vocab_size=100, position="diet-rel", attn_backend="fused",
                                 max_position_embeddings=64, hidden_dropout_prob=0.0, num_hidden_layers=4)
    model = DietModel(cfg).to(TEST_DEVICE).train()
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0)).to(TEST_DEVICE)
    w = torch.randn(2, 24, cfg.hidden_size, generator=torch.Generator().manual_seed(1)).to(TEST_DEVICE)
    with Slices() as slices:
        (model(ids).last_hidden_state * w).sum().backward()  # a loss whose gradient reaches R (not LayerNorm's ~0)
    r = model.positions.method.r
    assert slices.found == [tuple(r.shape)] and r.grad is not None and r.grad.abs().sum() > 0
