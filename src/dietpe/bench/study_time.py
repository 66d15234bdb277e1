"""How long a `dietpe compare --plan` study takes: its step times measured on this machine, times its plan.

    python -m dietpe.bench.study_time --plan gpu-hour --device cuda --precision bf16      (about a minute)

For every method of the plan: a pre-training step (MLM forward, loss, backward, the recipe's optimizer step)
at the recipe's size and batch, and a fine-tuning step (sequence-pair classification, AdamW, batch 32 at
`--ft-length` tokens), each the median of `--steps` timed steps after warm-up steps; plus what a fine-tuning run
spends besides its steps (loading the model, saving a checkpoint with its optimizer state), measured once.
The plan multiplies them: pre-training steps x methods x seeds, fine-tuning steps of every run of the grid
(`--ft-train` examples of each task, CoLA's and STS-B's by default), evaluations as forward passes over
`--ft-eval` examples, and a checkpoint saved at each.

On a CPU the figures are scaled to a GPU with `--gpu-tflops T`: the ratio R is T over the CPU's FLOP/s on the
absolute model's pre-training step (FLOPs counted from the model's sizes), a GPU step is the CPU step / R +
`--gpu-floor` seconds (docs/recipes.md states T and the floor); on a GPU the figures are measured.
Written here because the study's own code (the `Trainer`, the scheduler) adds data preparation and I/O that a
one-minute measurement cannot run; the steps it times are the ones the study runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from dietpe import validate as V
from dietpe.methods import METHOD_LISTS, parse_method
from dietpe.tasks.recipes import FINETUNE_RECIPES, PRETRAIN_RECIPES, build_config
from dietpe.tasks.recipes import STUDY_PLANS
from dietpe.tasks.runtime import autocast, resolve_device, set_determinism


def _timed(step, steps: int, warmup: int, device: torch.device) -> float:
    """Median seconds of `steps` calls of `step` after `warmup` untimed ones, synchronised on CUDA."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _optimizer(model, name: str, lr: float):
    from dietpe.tasks.lamb import Lamb

    return Lamb(model.parameters(), lr=lr, weight_decay=0.01) if name == "lamb" else \
        torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def pretrain_step_seconds(config, batch: int, length: int, optimizer: str, device, precision: str, steps: int,
                          warmup: int) -> float:
    """One MLM step on random tokens, 15% of them scored, the head on those alone as `dietpe pretrain` trains."""
    from dietpe import DietForMaskedLM

    torch.manual_seed(0)
    config = copy.deepcopy(config)
    config.sparse_prediction = True
    model = DietForMaskedLM(config).to(device).train()
    opt = _optimizer(model, optimizer, 1e-4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (batch, length), generator=g).to(device)
    labels = torch.where(torch.rand(batch, length, generator=g).to(device) < 0.15, ids, -100)

    def step():
        with autocast(device, precision):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    seconds = _timed(step, steps, warmup, device)
    del model, opt
    return seconds


def finetune_step_seconds(config, batch: int, length: int, device, precision: str, steps: int,
                          warmup: int) -> tuple[float, float]:
    """(training step, evaluation forward) of sequence-pair classification at `length` tokens."""
    from dietpe import DietForSequenceClassification

    torch.manual_seed(0)
    model = DietForSequenceClassification(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, config.vocab_size, (batch, length), generator=g).to(device)
    types = torch.zeros_like(ids)
    types[:, length // 2:] = 1
    labels = torch.randint(0, 2, (batch,), generator=g).to(device)

    def train():
        model.train()
        with autocast(device, precision):
            loss = model(input_ids=ids, token_type_ids=types, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer():
        model.eval()
        with torch.inference_mode(), autocast(device, precision):
            model(input_ids=ids, token_type_ids=types)

    return _timed(train, steps, warmup, device), _timed(infer, steps, warmup, device)


def run_overhead_seconds(config) -> tuple[float, float]:
    """(loading a saved model, saving a checkpoint with AdamW's two moments): what each fine-tuning run does
    besides its steps, through the file system, so the same on a CPU or GPU machine."""
    from dietpe import DietForSequenceClassification

    model = DietForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        start = time.perf_counter()
        DietForSequenceClassification.from_pretrained(tmp)
        load = time.perf_counter() - start
        state = {k: v for k, v in model.state_dict().items()}
        moments = {f"{k}.{m}": torch.zeros_like(v) for k, v in state.items() for m in ("exp_avg", "exp_avg_sq")}
        start = time.perf_counter()
        model.save_pretrained(Path(tmp) / "ckpt")
        torch.save(moments, Path(tmp) / "ckpt" / "optimizer.pt")
        save = time.perf_counter() - start
    return load, save


def _counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def plan(args) -> dict:
    """The plan's counts: pre-trainings, their steps, fine-tuning runs, their steps and evaluations."""
    p = STUDY_PLANS[args.plan]
    pre, ft = PRETRAIN_RECIPES[p["recipe"]], FINETUNE_RECIPES[p["ft_recipe"]]
    methods = METHOD_LISTS[p["methods"]]
    if len(args.ft_train) != len(args.ft_eval):
        raise SystemExit(f"--ft-train lists {len(args.ft_train)} tasks, --ft-eval {len(args.ft_eval)}")
    return dict(methods=len(methods), seeds=p["pretrain_seeds"], pretrain_steps=pre.max_steps,
                pretrain_evals=pre.max_steps // pre.save_steps, validation=p["max_validation"],
                runs_per_model=len(ft.learning_rates) * ft.seeds,
                ft_steps=[n // ft.batch_size * int(ft.epochs) for n in args.ft_train], ft_evals=int(ft.epochs),
                ft_eval_examples=list(args.ft_eval))


def estimate(counts: dict, pre: dict[str, float], ft: dict[str, tuple[float, float]], load: float, save: float,
             batch: int) -> dict:
    """Seconds of the study, from the per-method step times (the pre-training's at the recipe's global batch)."""
    seeds, runs = counts["seeds"], counts["runs_per_model"]
    eval_pre = counts["pretrain_evals"] * counts["validation"] / batch  # forward passes of a batch, ~1/3 step
    pretraining = sum(seeds * t * (counts["pretrain_steps"] + eval_pre / 3) for t in pre.values())
    # one run of each task, summed over the tasks
    per_run = {m: sum(steps * train + counts["ft_evals"] * (n_eval / 32 * infer + save) + load
                      for steps, n_eval in zip(counts["ft_steps"], counts["ft_eval_examples"]))
               for m, (train, infer) in ft.items()}
    finetuning = sum(seeds * runs * t for t in per_run.values())
    return dict(pretraining=pretraining, finetuning=finetuning, total=pretraining + finetuning,
                per_finetuning_run=per_run)


def pretrain_flops(config, tokens: int, length: int) -> float:
    """FLOPs of one MLM training step (3 x the forward's multiply-adds x 2): the layers' projections and FFN,
    the attention products, the MLM head's transform and decoder. Position terms are left out (small)."""
    h, f, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    forward = 2 * (n * (4 * h * h + 2 * h * f) + h * h + h * config.vocab_size) + n * 4 * length * h
    return 3.0 * forward * tokens


def measure(args, device, pre_r, ft_r, methods) -> dict:
    """The step times of every method (pre-training scaled to the recipe's batch) and the run overheads."""
    batch = args.pretrain_batch or pre_r.batch_size
    pre, ft = {}, {}
    refused = []  # methods an op of which has no deterministic CUDA kernel: timed without determinism
    for m in methods:
        config = build_config(m, args.size or pre_r.size, pre_r.vocab_size, pre_r.max_length, 0, pre_r.max_positions)

        def both():
            return (pretrain_step_seconds(config, batch, pre_r.max_length, pre_r.optimizer, device, args.precision,
                                          args.steps, args.warmup) * pre_r.batch_size / batch,
                    finetune_step_seconds(config, ft_r.batch_size, args.ft_length, device, args.precision,
                                          args.steps, args.warmup))
        try:
            pre[m.name], ft[m.name] = both()
        except RuntimeError as e:
            if "deterministic" not in str(e):
                raise
            print(f"[study_time] {m.name}: {str(e).splitlines()[0]}; timed without deterministic algorithms",
                  file=sys.stderr)
            refused.append(m.name)
            torch.use_deterministic_algorithms(False)
            pre[m.name], ft[m.name] = both()
            torch.use_deterministic_algorithms(args.deterministic)
        print(f"[study_time] {m.name}: pre-training {pre[m.name] * 1e3:.1f} ms/step (batch {pre_r.batch_size} x "
              f"{pre_r.max_length}), fine-tuning {ft[m.name][0] * 1e3:.1f} ms/step, evaluation "
              f"{ft[m.name][1] * 1e3:.1f} ms/batch", file=sys.stderr, flush=True)
    load, save = run_overhead_seconds(config)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return dict(pre=pre, ft=ft, load=load, save=save, device=where, precision=args.precision,
                deterministic=args.deterministic and device.type == "cuda", nondeterministic=refused)


def scaled_to_gpu(measured: dict, ratio: float, floor: float) -> tuple[dict, dict]:
    """CPU step times as GPU ones: t / ratio + floor per training step, + floor / 3 per evaluation batch."""
    pre = {k: v / ratio + floor for k, v in measured["pre"].items()}
    ft = {k: (a / ratio + floor, b / ratio + floor / 3) for k, (a, b) in measured["ft"].items()}
    return pre, ft


def report(args, measured: dict, pre: dict, ft: dict, ratio: float | None, counts: dict, est: dict) -> str:
    head = f"plan {args.plan}: step times on {measured['device']} ({measured['precision']})"
    if ratio:
        head += (f" / {ratio:,.0f} (GPU/CPU throughput: {args.gpu_tflops:g} TFLOP/s against this CPU's "
                 f"{args.gpu_tflops * 1e3 / ratio:.1f} GFLOP/s) + {args.gpu_floor * 1e3:.0f} ms per step")
    lines = [head, "",
             "| method | pre-training s/step | fine-tuning s/step | evaluation s/batch | fine-tuning runs s (one per task) |",
             "|---|--:|--:|--:|--:|"]
    lines += [f"| {k} | {pre[k]:.4f} | {ft[k][0]:.4f} | {ft[k][1]:.4f} | {est['per_finetuning_run'][k]:.1f} |"
              for k in pre]
    lines += ["", f"model load {measured['load']:.2f} s, checkpoint save {measured['save']:.2f} s per evaluation",
              f"plan: {counts}",
              f"pre-training {est['pretraining'] / 60:.1f} min + fine-tuning {est['finetuning'] / 60:.1f} min = "
              f"{est['total'] / 60:.1f} min (one process; data preparation not counted)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dietpe.bench.study_time", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", default="gpu-hour", choices=sorted(STUDY_PLANS))
    ap.add_argument("--device", default=None, choices=("cpu", "cuda"))
    ap.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    ap.add_argument("--size", default=None, help="model size instead of the recipe's (a quick check of this tool)")
    ap.add_argument("--steps", type=V.positive_int, default=10, help="timed steps of each kind per method")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--pretrain-batch", type=int, default=None,
                    help="sequences per timed pre-training step (default: the recipe's global batch); the time is "
                         "scaled to the recipe's batch linearly (a CPU cannot hold it)")
    ap.add_argument("--ft-length", type=int, default=64, help="tokens per fine-tuning example (padded batch)")
    ap.add_argument("--ft-train", type=_counts, default=[8551, 5749],
                    help="training examples of each task (default: CoLA's 8,551 and STS-B's 5,749)")
    ap.add_argument("--ft-eval", type=_counts, default=[1043, 1500], help="evaluation examples of each task")
    ap.add_argument("--gpu-tflops", type=float, default=None,
                    help="on a CPU: the GPU's achieved TFLOP/s on these steps; the GPU/CPU ratio is it over the CPU's "
                         "FLOP/s on the absolute model's pre-training step (docs/recipes.md: 350 for an H100 in bf16)")
    ap.add_argument("--gpu-floor", type=float, default=0.008,
                    help="with --gpu-tflops: seconds a GPU training step spends besides its FLOPs (kernel launches, "
                         "elementwise passes, the Trainer's loop); a third of it per evaluation batch")
    ap.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                    help="deterministic CUDA algorithms, as `dietpe compare` runs by default")
    ap.add_argument("--measured", help="step times written earlier with --json: estimate again without measuring")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    p = STUDY_PLANS[args.plan]
    pre_r, ft_r = PRETRAIN_RECIPES[p["recipe"]], FINETUNE_RECIPES[p["ft_recipe"]]
    methods = [parse_method(spec) for spec in METHOD_LISTS[p["methods"]]]
    if args.measured:
        measured = json.loads(Path(args.measured).read_text())["measured"]
    else:
        device = resolve_device(args.device)
        set_determinism(device, args.deterministic)
        measured = measure(args, device, pre_r, ft_r, methods)
    pre, ft, ratio = measured["pre"], measured["ft"], None
    if args.gpu_tflops:
        config = build_config(methods[0], args.size or pre_r.size, pre_r.vocab_size, pre_r.max_length, 0)
        cpu = pretrain_flops(config, pre_r.batch_size * pre_r.max_length, pre_r.max_length) / pre[methods[0].name]
        ratio = args.gpu_tflops * 1e12 / cpu
        pre, ft = scaled_to_gpu(measured, ratio, args.gpu_floor)
    counts = plan(args)
    est = estimate(counts, pre, ft, measured["load"], measured["save"], pre_r.batch_size)
    print(report(args, measured, pre, ft, ratio, counts, est))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(measured=measured, gpu=dict(pre=pre, ft=ft, ratio=ratio),
                                                   counts=counts, estimate=est), indent=1))
    return 0


if __name__ == "__main__":
    from dietpe.errors import module_main

    sys.exit(module_main(main, "python -m dietpe.bench.study_time"))
