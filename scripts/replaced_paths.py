"""Four changes of issue 13's second pass, each against the code it replaced, in one interleaved run (medians of
per-cycle ratios to `none`, interquartile range in brackets):

- per-layer tables (DIET-ABS's P_Q, P_K, DIET-REL's R, per-head segment tables) read through one `unbind` per
  forward, against indexing the parameter in every layer (whose backward zero-fills a whole-parameter gradient
  per layer and adds them up);
- TUPE's table p read as a slice for the default positions, LN(p) once, against a gather and LN(p) twice;
- rotary in one product and two in-place updates, against negate, concatenate, two products and a sum;
- kept terms checked as 64-bit words, against a float comparison;
- at inference, per-head segments added to the bias up to 256 keys, against folding them into q/k channels.

    python scripts/replaced_paths.py SHAPE LENGTH BATCH MODE REPEATS      (MODE: train or infer)
"""
import math
import statistics
import sys

import torch

from dietpe.attention import backends
from dietpe.bench import cost
from dietpe.positions import method as method_module
from dietpe.positions import rotary as rotary_module
from dietpe.positions.tupe import TUPE

torch.set_num_threads(1)
shape, length, batch, mode, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
inputs = cost.make_inputs(batch, length, cost.DietConfig.from_preset(shape).vocab_size)


def old_layer_table(self, ctx, name, layer):
    return getattr(self, name)[layer]


def old_apply_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def old_same_bits(a, b):
    return a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


def old_correlation_factors(self, q_pos, k_pos, starts=(None, None)):
    scale = 1.0 / math.sqrt(2 * self.head_size)
    q_pos, k_pos = q_pos.view(-1, q_pos.shape[-1]), k_pos.view(-1, k_pos.shape[-1])
    fq = self._heads(self.norm(self.p[q_pos]), self.u_q) * scale
    fk = self._heads(self.norm(self.p[k_pos]), self.u_k)
    if self.reset:
        tq, tk = self._heads(self.norm(self.p_theta), self.u_q), self._heads(self.norm(self.p_theta), self.u_k)
        theta = (tq * tk).sum(-1) * scale
        if self.relative:
            theta = theta + self.cls_bias
        q_cls = (q_pos == 0).to(fq.dtype)[:, None, :]
        k_cls = (k_pos == 0).to(fk.dtype)[:, None, :]
        fq, fk = fq * (1 - q_cls[..., None]), fk * (1 - k_cls[..., None])
        col_q = torch.stack((theta[:, :1] * q_cls, theta[:, 1:] * (1 - q_cls)), dim=-1)
        col_k = torch.stack((torch.ones_like(k_cls), k_cls), dim=-1).expand(-1, self.num_heads, -1, -1)
        fq, fk = torch.cat((fq, col_q), -1), torch.cat((fk, col_k), -1)
    return fq, fk


REPLACED = {  # method -> what it ran with before: (label, [(owner, attribute, old value)])
    "diet-abs": [("unbind, kept check", [(method_module.PositionMethod, "layer_table", old_layer_table),
                                         (method_module, "same_bits", old_same_bits)])],
    "diet-rel+seg": [("unbind", [(method_module.PositionMethod, "layer_table", old_layer_table)]),
                     ("fold", [(backends, "ADD_LOW_RANK_KEYS", 0)])],
    "tupe-r": [("gather, kept check", [(TUPE, "correlation_factors", old_correlation_factors),
                                       (method_module, "same_bits", old_same_bits)])],
    "rotary": [("five passes", [(rotary_module, "apply_rotary", old_apply_rotary)])],
}


def replaced(patches, step):
    def run():
        saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
        for owner, name, value in patches:
            setattr(owner, name, value)
        try:
            step()
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
    return run


steps = {}
make = cost.training_step if mode == "train" else cost.inference_step
for method in ("none", *REPLACED):
    steps[method] = make(cost.build_model(cost.model_config(shape, cost.Variant.parse(method), 512)), inputs)
    for label, patches in REPLACED[method] if method in REPLACED else ():
        # its own model: the optimizers' states stay apart
        old_model = cost.build_model(cost.model_config(shape, cost.Variant.parse(method), 512))
        steps[f"{method} / {label}"] = replaced(patches, make(old_model, inputs))
times = cost.interleaved_times(steps, repeats, 2)
base = times["none"]
for name, t in times.items():
    lo, hi = cost.ratio_spread(t, base)
    print(f"{shape} {length}x{batch} {mode} {name:34s} {cost.median_ratio(t, base):.3f} [{lo:.3f}, {hi:.3f}] "
          f"{1e3 * statistics.median(t):.0f} ms", flush=True)
