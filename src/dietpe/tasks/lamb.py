"""LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76 Minutes", Algorithm 2):
Adam's direction with a per-tensor trust ratio, the optimizer of BERT's large-batch recipe that DIET's Table 7
(batch 4096, lr 0.0018 ≈ 5 / (2^1.5 · 10^3), warm-up 1/40) matches (docs/recipes.md).

    m_t = β1 m + (1 - β1) g          v_t = β2 v + (1 - β2) g²          m̂, v̂ = m_t / (1 - β1^t), v_t / (1 - β2^t)
    u   = m̂ / (√v̂ + ε) + λ x                                          (λ: the group's weight decay)
    x  ← x - η · φ(‖x‖) / ‖u‖ · u                                     φ(z) = z; the ratio is 1 if either norm is 0

Groups with `adapt=False` (biases and layer norms, which also take no weight decay: the exclusions of the
authors' BERT code) take the plain step x ← x - η u. Written here because neither torch nor transformers ships
LAMB; `Trainer`'s scheduler sets each group's `lr` as for any torch optimizer.
"""

from __future__ import annotations

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, adapt: bool = True):
        if not lr > 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1 or not eps > 0 or weight_decay < 0:
            raise ValueError(f"Lamb: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay} out of range")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adapt=adapt))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                g = p.grad
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                update = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt_().add_(group["eps"]))
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                if group["adapt"]:
                    acc = torch.float64 if p.dtype == torch.float64 else torch.float32  # norms of bf16 in fp32
                    w_norm, u_norm = p.norm(dtype=acc), update.norm(dtype=acc)
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                    update.mul_(ratio.to(update.dtype))
                p.add_(update, alpha=-group["lr"])
        return loss
