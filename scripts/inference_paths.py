"""This session's inference changes, each against what it replaced, in one interleaved run (medians of per-cycle
ratios to `none`): position-only terms kept between forwards vs built every forward (DIET-ABS, TUPE-A,
DIET-REL), and Shaw's inference paths (banded / dense) vs the eager reference.

    python scripts/inference_paths.py SHAPE LENGTH BATCH REPEATS
"""
import sys

import torch

from dietpe.attention import banded
from dietpe.bench import cost
from dietpe.positions import method as method_module

torch.set_num_threads(1)
shape, length, batch, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
inputs = cost.make_inputs(batch, length, cost.DietConfig.from_preset(shape).vocab_size)


def without(module, name, value, step):
    def run():
        old = getattr(module, name)
        setattr(module, name, value)
        try:
            step()
        finally:
            setattr(module, name, old)
    return run


steps = {}
for method in ("none", "diet-abs", "tupe-a", "diet-rel", "shaw"):
    step = cost.inference_step(cost.build_model(cost.model_config(shape, cost.Variant.parse(method), 512)), inputs)
    steps[method] = step
    if method in ("diet-abs", "tupe-a", "diet-rel"):
        steps[f"{method}/every forward"] = without(method_module, "KEEP_ELEMENTS", -1, step)
    if method == "shaw":
        steps["shaw/eager"] = without(banded, "plan", lambda *a: None, step)
times = cost.interleaved_times(steps, repeats, 2)
base = times["none"]
for name, t in times.items():
    print(f"{shape} {length}x{batch} {name:24s} {cost.median_ratio(t, base):.3f}", flush=True)
