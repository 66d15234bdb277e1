"""The rotary kernel (`dietpe.attention.kernels.rotary`, q and k in one launch) against RoFormer's rotation as
`apply_rotary` computes it: values and the gradients of q and k, positions shared or per example, strided
inputs, fp32 and bf16; and the rotary method on CUDA takes it."""

import pytest
import torch

from dietpe.positions.functional import apply_rotary, rotary_angles
from tests.attention.kernels.conftest import NO_TRITON, sizes

pytest.importorskip("triton", reason=NO_TRITON)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_example", [False, True])
def test_rotary_kernel_matches_apply_rotary_with_gradients(dtype, per_example, device):
    from dietpe.attention.kernels.rotary import rotary_qk

    b, h, lq, lk, d = 2, 3, sizes(7, 131), sizes(9, 200), 24
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, lq, h, d, generator=g).to(device, dtype).transpose(1, 2).requires_grad_()  # strided
    k = torch.randn(b, h, lk, d, generator=g).to(device, dtype).requires_grad_()
    q_pos = torch.randint(0, 500, (b, lq), generator=g) if per_example else torch.arange(lq) + 3
    k_pos = torch.randint(0, 500, (b, lk), generator=g) if per_example else torch.arange(lk)
    qa, ka = rotary_angles(q_pos.to(device), d), rotary_angles(k_pos.to(device), d)
    got, want = rotary_qk(q, k, *qa, *ka), (apply_rotary(q, *qa), apply_rotary(k, *ka))
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-5)
    w = [torch.randn(x.shape, generator=g).to(device, dtype) for x in want]
    grads = torch.autograd.grad(sum((x.float() * y.float()).sum() for x, y in zip(got, w)), (q, k))
    want_grads = torch.autograd.grad(sum((x.float() * y.float()).sum() for x, y in zip(want, w)), (q, k))
    for a, r in zip((*got, *grads), (*want, *want_grads)):
        torch.testing.assert_close(a, r, **tol)


def test_the_rotary_method_takes_the_kernel_on_cuda_only(device, monkeypatch):
    from dietpe.attention.kernels import rotary as kernel
    from dietpe.positions.rotary import Rotate

    calls = []
    real = kernel.rotary_qk
    monkeypatch.setattr(kernel, "rotary_qk", lambda *a: calls.append(1) or real(*a))
    q, k = torch.randn(1, 2, 5, 16, device=device), torch.randn(1, 2, 5, 16, device=device)
    angles = rotary_angles(torch.arange(5, device=device), 16)
    got = Rotate(angles, angles)(q, k)
    assert bool(calls) == (device.type == "cuda")
    torch.testing.assert_close(got[0], apply_rotary(q, *angles), atol=1e-6, rtol=1e-5)
