"""Fold vs dense for wide low-rank terms (DIET-ABS d_p = d_h, TUPE d_h + 2), per shape: one interleaved run,
ratios to `none` and to each other (medians of per-cycle ratios)."""
import sys, torch
from dietpe.attention import backends
from dietpe.bench import cost
torch.set_num_threads(1)
shape, length, batch, mode, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
make = cost.training_step if mode == "train" else cost.inference_step
inputs = cost.make_inputs(batch, length, cost.DietConfig.from_preset(shape).vocab_size)
steps = {}
for method in ("none", "diet-abs", "tupe-a"):
    model = cost.build_model(cost.model_config(shape, cost.Variant.parse(method), 512))
    step = make(model, inputs)
    if method == "none":
        steps["none"] = step
        continue
    for name, limit in (("dense", 8), ("fold", 10**9)):
        def run(step=step, limit=limit):
            old = backends.FOLD_MAX_RANK
            backends.FOLD_MAX_RANK = limit
            try:
                step()
            finally:
                backends.FOLD_MAX_RANK = old
        steps[f"{method}/{name}"] = run
times = cost.interleaved_times(steps, repeats, 2)
base = times["none"]
out = {k: round(cost.median_ratio(t, base), 3) for k, t in times.items()}
print(shape, length, batch, mode, out, "fold/dense:",
      {m: round(cost.median_ratio(times[f"{m}/fold"], times[f"{m}/dense"]), 3) for m in ("diet-abs", "tupe-a")},
      flush=True)
