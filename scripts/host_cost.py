"""Host time the fused kernel's path costs per layer, measured on the CPU with its launches stubbed out.

At bert-base, 512 tokens × 8, bf16, an H100's training step was bound by the host (docs/kernels.md, "Where the
time goes"): what the attention call costs in Python and aten ops before and after its kernels is then what a
method costs. This times that part alone, without a GPU: a small model (tiny sizes, so the CPU's arithmetic is
negligible) trains with `attn_backend="fused"` on CPU tensors along the GPU's host path (tile lists, the kept-
kernel launcher's keys and calls), each kernel replaced by a stand-in whose launch does nothing, so only the
host's work is timed; the same model with a trivial autograd Function in the attention's place (two
allocations forward, three backward) is the floor. Printed per method: the forward call (the backend function)
and the Function's backward in µs per layer, the floor's, the difference (medians over interleaved cycles),
and the Python calls per layer above the floor's (cProfile's count: exact, where the times drift with the
machine). The figures are this CPU's: a GPU host differs by a factor, not in which changes help.

    TRITON_INTERPRET=1 python scripts/host_cost.py --methods none,diet-rel,diet-abs,diet-rel+seg

With `--whole train` or `--whole infer` it models the bench's own figure instead: whole steps (forward, loss,
backward and a foreach AdamW step, or a forward under inference mode) of bert-base's 12 layers at tiny widths,
bf16 autocast, the presets' attention dropout, each `@fused` method's kernels stubbed as above and `none` on
sdpa with sdpa itself replaced by one aten op (FlashAttention's host cost: one call, one backward node), with
no dense term kept between inference forwards (`keep` returns at once, as off the CPU; the per-forward objects
DIET-REL and T5 keep on every device are kept, as on a GPU). Printed: ms a step and × `none`, medians over
interleaved cycles. Where the GPU's step is bound by its host (bert-base 512 × 8, docs/gpu.md), these ratios
are what the bench measures: inference as called on the H200 gave `none@fused` 1.21 and DIET-REL 1.38 (1.13 ×
`none@fused`), this model of the same code 1.135 × `none@fused`.

    TRITON_INTERPRET=1 python scripts/host_cost.py --whole infer --methods none,none@fused,diet-rel@fused
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


class _Compiled:
    """A compiled kernel whose launch does nothing."""

    function = packed_metadata = None

    def run(self, *args):
        pass


class _StubKernel:
    """Stands in for a jit kernel: its parameters (what the kept-kernel launcher reads) and `kernel[grid](...)`
    returning a compiled kernel that launches nothing."""

    def __init__(self, real):
        from triton.runtime.jit import JITFunction

        fn = getattr(real, "fn", real)
        self.params = JITFunction(fn).params

    def __getitem__(self, grid):
        return lambda *args, **constants: _Compiled()


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0


def _setup():
    """The GPU's host path with nothing launched: no interpreter, the tile lists a GPU uses (fixed, untimed), the
    kept-kernel launcher keyed and called as on a GPU, each kernel a stand-in whose launch does nothing."""
    os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors accepted; every kernel below is a stand-in
    os.environ["DIETPE_FUSED_AUTOTUNE"] = "0"
    import torch

    import dietpe.attention.fused as F
    import dietpe.attention.kernels.attention as A
    from dietpe.attention.kernels import launch as L

    F.device_problem = lambda t: None
    A.interpreting = L.interpreting = lambda: False
    L._driver, L._hooked = _Driver, lambda: False
    for name in ("_forward_kernel", "_backward_q_kernel", "_backward_kv_kernel", "_offset_sum_kernel", "_band_kernel",
                 "_band_sum_kernel"):
        setattr(A, name, _StubKernel(getattr(A, name)))
    return torch, F, A


class _Timed:
    """Accumulates the seconds spent in the wrapped forward and backward calls."""

    def __init__(self):
        self.seconds = [0.0, 0.0]

    def forward(self, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds[0] += time.perf_counter() - start
            return out
        return call

    def backward(self, fn):
        def call(ctx, grad):
            start = time.perf_counter()
            out = fn(ctx, grad)
            self.seconds[1] += time.perf_counter() - start
            return out
        return staticmethod(call)


def _floor_function(torch):
    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out = torch.empty(q.shape[:3] + v.shape[3:], dtype=v.dtype)
            ctx.save_for_backward(q, k, v, out, torch.empty(q.shape[:3]))
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    return Floor


def measure(methods: list[str], cycles: int, steps: int, layers: int = 4) -> dict[str, dict[str, float]]:
    """{method: {fused_fwd, fused_bwd, floor_fwd, floor_bwd, above}} in µs per layer, medians over cycles, and
    `calls`: Python calls per layer above the floor's."""
    import cProfile
    import pstats

    torch, F, A = _setup()
    from dietpe import DietConfig, DietModel
    from dietpe.attention import registry

    torch.set_num_threads(1)
    timed, floor = _Timed(), _floor_function(torch)
    for cls in (A.FusedAttention, floor):
        cls.backward = timed.backward(cls.backward)
    paths = {"fused": timed.forward(F.fused),
             "floor": timed.forward(lambda q, k, v, *rest, **kw: (floor.apply(q, k, v), None))}
    ids = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    segments = (torch.arange(12) >= 6).long().expand(2, 12)
    results = {}
    for spec in methods:
        position, _, seg = spec.partition("+")
        torch.manual_seed(0)
        config = DietConfig(vocab_size=50, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=32, position=position,
                            segment="per-head" if seg else "input", attn_backend="fused",
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.1)
        model = DietModel(config).to(torch.bfloat16)
        runs, calls = {"fused": [], "floor": []}, {}
        for _ in range(cycles):
            for name, path in paths.items():
                object.__setattr__(registry.ALL_BACKENDS["fused"], "forward", path)
                step = lambda: model(ids, token_type_ids=segments).last_hidden_state.float().sum().backward()  # noqa: E731
                for _ in range(3):
                    step()
                timed.seconds = [0.0, 0.0]
                for _ in range(steps):
                    step()
                runs[name].append([s / steps / layers * 1e6 for s in timed.seconds])
                profile = cProfile.Profile()
                profile.runcall(step)
                calls[name] = pstats.Stats(profile).total_calls / layers
        object.__setattr__(registry.ALL_BACKENDS["fused"], "forward", F.fused)
        med = {f"{n}_{part}": statistics.median(r[i] for r in runs[n]) for n in runs
               for i, part in enumerate(("fwd", "bwd"))}
        med["above"] = statistics.median(f[0] + f[1] - b[0] - b[1] for f, b in zip(runs["fused"], runs["floor"]))
        med["calls"] = calls["fused"] - calls["floor"]
        results[spec] = med
    return results


def _flash_stand_in(q, k, v, attn_mask=None, dropout_p=0.0, scale=None, is_causal=False, **kwargs):
    """sdpa's place in the host model: one aten op over q, k and v, one backward node (flash's host cost)."""
    return v.addcmul(q, k, value=0.0)


def measure_whole(labels: list[str], mode: str, cycles: int, steps: int) -> dict[str, tuple[float, float]]:
    """{label: (median ms a step, median of per-cycle ratios to the first label)} of whole steps (`--whole`)."""
    torch, _, _ = _setup()
    import torch.nn.functional as functional

    import dietpe.positions.method as method
    from dietpe.bench import cost

    functional.scaled_dot_product_attention = _flash_stand_in
    # a GPU keeps no dense term between inference forwards: `keep` returns the term at once there
    method.KEEP_ELEMENTS = -1
    method.PositionMethod.keep = lambda self, ctx, name, tensors, term: term
    torch.set_num_threads(1)
    calls = {}
    for label in labels:
        variant = cost.Variant.parse(label)
        config = cost.model_config("bert-base", variant, 512, hidden_size=192, intermediate_size=64, vocab_size=64)
        model, inputs = cost.build_model(config), cost.make_inputs(2, 16, 64)
        if mode == "train":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)  # as on CUDA

            def step(model=model, inputs=inputs, opt=opt):
                model.train()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = cost.first_output(model(**inputs)).float().square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:
            step = cost.inference_step(model, inputs, "bf16")
        for _ in range(3):
            step()
        calls[label] = step
    times = _interleaved(calls, cycles, steps)
    base = times[labels[0]]
    return {label: (statistics.median(t), statistics.median(a / b for a, b in zip(t, base)))
            for label, t in times.items()}


def _interleaved(calls: dict, cycles: int, steps: int) -> dict[str, list[float]]:
    times = {label: [] for label in calls}
    for _ in range(cycles):
        for label, step in calls.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times[label].append((time.perf_counter() - start) / steps * 1e3)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="none,diet-rel,diet-abs,diet-rel+seg",
                   help="comma-separated methods, +seg for DIET's per-head segments")
    p.add_argument("--cycles", type=int, default=9)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--whole", choices=("train", "infer"), default=None,
                   help="time whole steps of the bench's model (labels as `dietpe bench` takes them) against the "
                        "first label, instead of the attention call against the floor")
    args = p.parse_args(argv)
    if args.whole:
        from dietpe.errors import ConfigError

        labels = args.methods.split(",")
        try:
            results = measure_whole(labels, args.whole, args.cycles, max(1, args.steps // 4))
        except ConfigError as e:
            p.error(str(e))
        print(f"| method ({args.whole}) | ms a step | × {labels[0]} |")
        print("|---|--:|--:|")
        for label, (ms, ratio) in results.items():
            print(f"| {label} | {ms:.2f} | {ratio:.3f} |")
        return 0
    results = measure(args.methods.split(","), args.cycles, args.steps)
    print("| method | forward µs | backward µs | floor forward | floor backward | above the floor | Python calls "
          "above the floor's |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for spec, r in results.items():
        print(f"| {spec} | {r['fused_fwd']:.1f} | {r['fused_bwd']:.1f} | {r['floor_fwd']:.1f} | "
              f"{r['floor_bwd']:.1f} | {r['above']:.1f} | {r['calls']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
