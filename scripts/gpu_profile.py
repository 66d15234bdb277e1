"""Where a step's time goes on the GPU, for the fused kernel's tuning (docs/gpu.md, docs/kernels.md).

    python scripts/gpu_profile.py OUT.md [--methods none,diet-rel@fused,...] [--ops] [--tiles] [--host none@fused,...]

Its parts, each a table in OUT.md:

* **steps** (bert-base, 512 x 8, bf16, the training step of `dietpe bench`): per method the wall time of a
  step between two synchronisations, the host's time to queue it (the step's Python and launches: when it is
  close to the wall time the host is the bottleneck, not the GPU), the GPU's kernel time in one profiled step
  and the kernels launched, the host syncs it asked for (`torch.cuda.set_sync_debug_mode`), and the GPU time
  by kind of kernel (attention, matrix products, the rest);
* **host** (`--host`): the host's time to queue one call of the attention operator (nothing waits for the GPU
  between calls), sdpa against the fused kernel, forward alone and forward + backward, and a cProfile of the
  fused training step's host side (the functions that take its time);
* **graphs** (`--graphs`): inference (bf16 autocast), each method's forward called as usual against the
  replay of a CUDA graph captured around it: the replay queues no Python and no launches, so its time is the
  GPU's alone, and the ratios between replays are what the methods cost on the GPU with the host's share gone;
  the host column is the call's time to return (its Python and launches, the GPU still running);
* **ops** (`--ops`): the attention operator alone, forward and forward + backward (`triton.testing.do_bench`,
  median), SDPA's flash kernel against the fused kernel without a term and with a per-head offset table (read
  by window, per score, and with its gradient summed in the dQ kernel);
* **tiles** (`--tiles`): each kernel tuned afresh over its shipped tiles and `TILE_SWEEP`'s (the autotuner's own
  timing, `TILE_REPEATS` launches a tile), bert-base's attention at 512 and 2,048 tokens, without a term and with
  an offset table: the best shipped tile against the best of all, kernel by kernel.

After a method, `/jit` launches its kernels through Triton's `kernel[grid]` every time, `/score` reads its
offset table with a load per score (`DIETPE_FUSED_TABLE=score`) instead of one window per tile, and `/rows` sums
the table's gradient in the dQ kernel (`DIETPE_FUSED_TABLE_GRAD=rows`) instead of by block diagonals: each the
same method timed in the same cycles against the kernels as they ship (`diet-rel@fused,diet-rel@fused/rows`).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

from dietpe.bench.cost import (Variant, build_model, first_output, make_inputs, max_length_for, model_config,
                               training_step)

METHODS = ("none,none@fused,diet-rel@fused,diet-rel@fused/rows,diet-rel@sdpa,diet-rel+seg@fused,t5@fused,"
           "t5@fused/rows,fire@fused")
SUFFIXES = ("jit", "score", "rows")
ATTENTION = ("flash", "fmha", "attention", "_forward_kernel", "_backward_q_kernel", "_backward_kv_kernel",
             "_offset_sum_kernel", "_band_kernel", "_band_sum_kernel", "efficient", "cutlass_f")
GEMM = ("gemm", "nvjet", "sm90_xmma", "cublas", "cutlass")


def _kind(name: str) -> str:
    low = name.lower()
    if any(a in low for a in ATTENTION):
        return "attention"
    if any(g in low for g in GEMM):
        return "gemm"
    return "other"


def _device_us(avg) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(avg, attr):
            return float(getattr(avg, attr))
    return 0.0


def profile_step(step) -> tuple[float, int, dict[str, float], list[tuple[str, float, int]]]:
    """(GPU kernel ms, kernels, ms by kind, top kernels) of one step."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kinds: Counter = Counter()
    top, total, count = [], 0.0, 0
    for avg in prof.key_averages():
        if avg.device_type != DeviceType.CUDA:
            continue
        us = _device_us(avg)
        total += us
        count += avg.count
        kinds[_kind(avg.key)] += us / 1e3
        top.append((avg.key[:70], us / 1e3, avg.count))
    top.sort(key=lambda t: -t[1])
    return total / 1e3, count, dict(kinds), top[:10]


def syncs(step) -> int:
    """Host syncs one step asks for (torch's sync debug mode warns at each)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


def _parse(label: str) -> tuple[str, set[str]]:
    """(method, suffixes) of `method/jit/score/rows`."""
    method, *suffixes = label.split("/")
    unknown = set(suffixes) - set(SUFFIXES)
    if unknown:
        raise SystemExit(f"gpu_profile: {label!r}: unknown suffix {sorted(unknown)}; allowed: {', '.join(SUFFIXES)}")
    return method, set(suffixes)


def _variant(step, suffixes: set[str]):
    """The step with every kernel launched through Triton's `kernel[grid]` (`jit`: no kept kernels) and the offset
    tables read per score (`score`), their gradients summed in the dQ kernel (`rows`), as asked."""
    from dietpe.attention.kernels.attention import table_gradient, table_read
    from dietpe.attention.kernels.launch import through_triton

    def run():
        with contextlib.ExitStack() as stack:
            if "jit" in suffixes:
                stack.enter_context(through_triton())
            if "score" in suffixes:
                stack.enter_context(table_read("score"))
            if "rows" in suffixes:
                stack.enter_context(table_gradient("rows"))
            step()
    return run if suffixes else step


def _cycles(names: list, repeats: int):
    """Each interleaved cycle's order: every name once, starting one further on at each cycle."""
    for cycle in range(repeats):
        shift = cycle % len(names)
        yield names[shift:] + names[:shift]


def steps_table(labels: list[str], shape: str, length: int, batch: int, repeats: int) -> list[str]:
    inputs = None
    steps = {}
    for label in labels:
        method, suffixes = _parse(label)
        config = model_config(shape, Variant.parse(method), max_length_for(length))
        model = build_model(config).cuda()
        if inputs is None:
            inputs = {k: t.cuda() for k, t in make_inputs(batch, length, config.vocab_size).items()}
        step = training_step(model, inputs, "bf16")
        steps[label] = _variant(step, suffixes)
    for _ in range(3):  # warm-up: compiles, autotunes
        for step in steps.values():
            step()
    wall, host = {k: [] for k in steps}, {k: [] for k in steps}
    names = list(steps)
    for order in _cycles(names, repeats):
        for name in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            steps[name]()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            wall[name].append(t2 - t0)
            host[name].append(t1 - t0)
    base = wall[names[0]]
    lines = [f"## steps: {shape}, {length} x {batch}, bf16, training step, {repeats} interleaved cycles", "",
             "| method | wall ms | x first | host ms | GPU kernel ms | kernels | syncs | attention ms | gemm ms | "
             "other ms |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    tops = []
    for name in names:
        ratio = statistics.median(t / b for t, b in zip(wall[name], base))
        gpu, count, kinds, top = profile_step(steps[name])
        n_sync = syncs(steps[name])
        lines.append(f"| {name} | {statistics.median(wall[name]) * 1e3:.2f} | {ratio:.3f} | "
                     f"{statistics.median(host[name]) * 1e3:.2f} | {gpu:.2f} | {count} | {n_sync} | "
                     f"{kinds.get('attention', 0):.2f} | {kinds.get('gemm', 0):.2f} | {kinds.get('other', 0):.2f} |")
        tops += ["", f"{name}: top kernels (ms, launches)"] + [f"    {ms:8.3f} {n:5d}  {k}" for k, ms, n in top]
        print(lines[-1], flush=True)
    return lines + tops


def _graphed(forward):
    """forward's CUDA graph, captured after warming up on a side stream as torch's docs ask: its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # tiles chosen, kernels compiled and kept
            forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    return graph.replay


def graphs_table(labels: list[str], shape: str, length: int, batch: int, repeats: int,
                 device: str = "cuda") -> list[str]:
    """Inference called as usual against its CUDA graph's replay, both × the first method's, interleaved."""
    inputs, calls = None, {}
    for label in labels:
        config = model_config(shape, Variant.parse(label), max_length_for(length))
        model = build_model(config).to(device).eval()
        if inputs is None:
            inputs = {k: t.to(device) for k, t in make_inputs(batch, length, config.vocab_size).items()}

        def forward(model=model):
            # no autocast weight cache: a graph would keep the first capture's casts (torch's docs)
            with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False):
                first_output(model(**inputs))
        calls[label] = {"call": forward, "replay": _graphed(forward)}
    times = {(label, kind): [] for label in calls for kind in ("call", "replay", "host")}
    names = [key for key in times if key[1] != "host"]
    for order in _cycles(names, repeats):
        for key in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            calls[key[0]][key[1]]()
            queued = time.perf_counter()  # the call's host side: its Python and launches, before the GPU ends
            torch.cuda.synchronize()
            times[key].append(time.perf_counter() - t0)
            if key[1] == "call":
                times[key[0], "host"].append(queued - t0)
    first = labels[0]
    lines = [f"## graphs: {shape}, {length} x {batch}, bf16 inference, called against a CUDA graph's replay, "
             f"{repeats} interleaved cycles (host ms: the call's return, before the GPU's end)", "",
             "| method | call ms | x first | replay ms | x first | host ms | x first |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for label in calls:
        row = [f"| {label} "]
        for kind in ("call", "replay", "host"):
            ratio = statistics.median(t / b for t, b in zip(times[label, kind], times[first, kind]))
            row.append(f"| {statistics.median(times[label, kind]) * 1e3:.2f} | {ratio:.3f} ")
        lines.append("".join(row) + "|")
        print(lines[-1], flush=True)
    return lines


def host_table(labels: list[str], shape: str, length: int, batch: int) -> list[str]:
    import cProfile
    import io
    import pstats

    import torch.nn.functional as F

    from dietpe.attention.kernels.attention import fused_attention
    from dietpe.attention.kernels.launch import through_triton

    lines = ["", "## host: time to queue one call (no wait for the GPU between calls), median of 5 x 50 calls", "",
             "| op | fwd us | fwd+bwd us |", "|---|--:|--:|"]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)
    table = (0.1 * torch.randn(12, 1023, device="cuda", generator=g)).requires_grad_(True)
    plain, tabled = (lambda: fused_attention(q, k, v, 0.125)), (lambda: fused_attention(q, k, v, 0.125, table))
    ops = {"sdpa": (lambda: F.scaled_dot_product_attention(q, k, v), False), "fused, no term": (plain, False),
           "fused, offset table": (tabled, False), "fused, no term, through Triton": (plain, True),
           "fused, offset table, through Triton": (tabled, True)}
    for name, (op, jit) in ops.items():
        cells = []
        for backward in (False, True):
            def call(op=op, jit=jit, backward=backward):
                with through_triton() if jit else contextlib.nullcontext():
                    out = op()
                    if backward:
                        out.backward(do)
            for _ in range(5):
                call()
            runs = []
            for _ in range(5):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(50):
                    call()
                runs.append((time.perf_counter() - t0) / 50)
            cells.append(f"{statistics.median(runs) * 1e6:.0f}")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
        print(lines[-1], flush=True)
    for label in labels:
        config = model_config(shape, Variant.parse(label), max_length_for(length))
        model = build_model(config).cuda()
        inputs = {k: t.cuda() for k, t in make_inputs(batch, length, config.vocab_size).items()}
        step = training_step(model, inputs, "bf16")
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            step()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
        lines += ["", f"### cProfile of 5 training steps, {label}, sorted by own time", "", "```",
                  *text.getvalue().strip().splitlines()[:60], "```"]
        del model, step
    return lines


def ops_table(shapes: list[tuple[int, int, int, int]], device: str = "cuda") -> list[str]:
    import torch.nn.functional as F
    from triton.testing import do_bench

    from dietpe.attention.kernels.attention import (Extras, causal_order, chosen_configs, fused_attention,
                                                    table_gradient, table_read)

    lines = ["", "## ops: the attention operator alone, bf16, median ms (do_bench); causal rows against flash's "
             "causal, their query blocks the longest first (the default) or in index order", "",
             "| B x H x L x d | op | fwd ms | fwd+bwd ms | x flash fwd | x flash fwd+bwd |",
             "|---|---|--:|--:|--:|--:|"]
    for b, h, n, d in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, device=device, dtype=torch.bfloat16, generator=g) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)
        table = (0.1 * torch.randn(h, 2 * n - 1, device=device, generator=g)).requires_grad_(True)
        scale = d ** -0.5
        with_table = lambda: fused_attention(q, k, v, scale, table)  # noqa: E731
        causal = lambda: fused_attention(q, k, v, scale, None, None, Extras(causal=True))  # noqa: E731
        causal_table = lambda: fused_attention(q, k, v, scale, table, None, Extras(causal=True))  # noqa: E731
        ops = {"sdpa flash": (lambda: F.scaled_dot_product_attention(q, k, v), contextlib.nullcontext),
               "fused, no term": (lambda: fused_attention(q, k, v, scale), contextlib.nullcontext),
               "fused, offset table": (with_table, contextlib.nullcontext),
               "fused, offset table, per score": (with_table, lambda: table_read("score")),
               "fused, offset table, gradient in dQ": (with_table, lambda: table_gradient("rows")),
               "sdpa flash, causal": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                      contextlib.nullcontext),
               "fused, causal, no term": (causal, contextlib.nullcontext),
               "fused, causal, no term, index order": (causal, lambda: causal_order("index")),
               "fused, causal, offset table": (causal_table, contextlib.nullcontext),
               "fused, causal, offset table, index order": (causal_table, lambda: causal_order("index"))}
        base = None
        for name, (call, setting) in ops.items():
            if name == "sdpa flash, causal":
                base = None  # the causal rows against flash's causal
            def op(call=call, setting=setting):
                with setting():
                    return call()
            fwd = do_bench(lambda: op(), warmup=50, rep=200, return_mode="median")

            def both(op=op, setting=setting):
                with setting():
                    op().backward(do)
            full = do_bench(both, warmup=50, rep=300, return_mode="median", grad_to_none=[q, k, v, table])
            base = base or (fwd, full)
            lines.append(f"| {b}x{h}x{n}x{d} | {name} | {fwd:.3f} | {full:.3f} | {fwd / base[0]:.2f} | "
                         f"{full / base[1]:.2f} |")
            print(lines[-1], flush=True)
    lines += ["", "tiles chosen (key: configuration, tried):"]
    for key, (config, times) in chosen_configs().items():
        tried = ", ".join(f"{c}: {t * 1e6:.0f}us" for c, t in times.items())
        lines.append(f"    {key[:4]} {key[-1]} -> {config}  [{tried}]")
    return lines


#: tiles (BM, BN, warps, stages) `--tiles` times beside the shipped lists' at head size 64 in bf16 (the tables
#: `attention.FORWARD_CONFIGS` ... hold): the Hopper shapes of the FlashAttention tutorial's sweep not shipped
TILE_SWEEP = {"FORWARD_CONFIGS": [(128, 64, 4, 3), (128, 128, 8, 2), (128, 32, 4, 3), (64, 128, 4, 3),
                                  (64, 64, 4, 2), (64, 64, 4, 4), (128, 64, 8, 4), (128, 64, 8, 2), (64, 32, 4, 3)],
              "BACKWARD_Q_CONFIGS": [(64, 64, 4, 3), (128, 64, 8, 2), (64, 128, 8, 2), (64, 32, 4, 3)],
              "BACKWARD_KV_CONFIGS": [(64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (128, 64, 8, 2)]}
TILE_REPEATS = 20


@contextlib.contextmanager
def _swept_tiles(attention, repeats: int):
    """Within it the kernels tune every key afresh over the shipped tiles and `TILE_SWEEP`'s at head size 64 in
    bf16, timing each over `repeats` launches; after it the shipped lists and what was chosen before return."""
    saved = {name: getattr(attention, name) for name in TILE_SWEEP}
    state = (attention.TUNE_REPEATS, dict(attention._chosen), dict(attention._timings), dict(attention._specs))
    for name, extra in TILE_SWEEP.items():
        lists = {size: dict(by_width) for size, by_width in saved[name].items()}
        lists[2][64] = [*lists[2][64], *(c for c in extra if c not in lists[2][64])]
        setattr(attention, name, lists)
    attention.TUNE_REPEATS = repeats
    for kept in (attention._chosen, attention._timings, attention._specs):
        kept.clear()
    try:
        yield saved
    finally:
        for name, lists in saved.items():
            setattr(attention, name, lists)
        attention.TUNE_REPEATS = state[0]
        for kept, before in zip((attention._chosen, attention._timings, attention._specs), state[1:]):
            kept.clear()
            kept.update(before)


def tiles_table(shapes: list[tuple[int, int, int, int]], device: str = "cuda", repeats: int = TILE_REPEATS
                ) -> list[str]:
    """Each kernel's time at every tile of the shipped lists and of `TILE_SWEEP` (the autotuner's own timing,
    `repeats` launches each), per shape, without a term and with an offset table: whether another tile would
    serve a call better than the shipped ones, kernel by kernel."""
    from dietpe.attention.kernels import attention

    lines = ["", f"## tiles: each kernel at every tile (BM, BN, warps, stages), bf16, µs a launch ({repeats} "
             "launches); shipped: the best of the kernels' own lists", "",
             "| B x H x L x d | term | kernel | shipped best | µs | swept best | µs | x shipped |",
             "|---|---|---|---|--:|---|--:|--:|"]
    details = ["", "every tile tried (µs):"]
    with _swept_tiles(attention, repeats) as shipped_lists:
        for b, h, n, d in shapes:
            g = torch.Generator(device=device).manual_seed(0)
            q, k, v, do = (torch.randn(b, h, n, d, device=device, dtype=torch.bfloat16, generator=g)
                           for _ in range(4))
            table = 0.1 * torch.randn(h, 2 * n - 1, device=device, generator=g)
            for term, tab in (("none", None), ("offset table", table)):
                before = set(attention.chosen_configs())
                xs = [x.detach().requires_grad_(True) for x in (q, k, v, *([tab] if tab is not None else []))]
                attention.fused_attention(*xs[:3], d ** -0.5, *xs[3:]).backward(do)  # tunes each kernel's key
                if device == "cuda":
                    torch.cuda.synchronize()
                for key, (_, times) in attention.chosen_configs().items():
                    if key in before or not times:
                        continue
                    name = _LISTS[key[0]]  # the band kernel's list is not swept: its own
                    shipped = attention._configs(shipped_lists.get(name) or getattr(attention, name), key[4],
                                                 max(key[1:4]))
                    lines.append(_tiles_row(f"{b}x{h}x{n}x{d}", term, key[0], times, shipped))
                    details.append(f"    {b}x{h}x{n}x{d} {term} {key[0]}: " + ", ".join(
                        f"{c}{'*' if c in shipped else ''} {t * 1e6:.1f}"
                        for c, t in sorted(times.items(), key=lambda item: item[1])))
                    print(lines[-1], flush=True)
    return lines + details + ["", "(* a shipped tile)"]


def _tiles_row(shape: str, term: str, kernel: str, times: dict, shipped: list) -> str:
    own = {c: t for c, t in times.items() if c in shipped}
    best = min(times, key=times.get)
    if not own:
        return f"| {shape} | {term} | {kernel} | - | - | {best} | {times[best] * 1e6:.1f} | - |"
    mine = min(own, key=own.get)
    return (f"| {shape} | {term} | {kernel} | {mine} | {own[mine] * 1e6:.1f} | {best} | {times[best] * 1e6:.1f} | "
            f"{times[best] / own[mine]:.2f} |")


#: the list each kernel's key tunes over (`_key`'s first element)
_LISTS = {"fwd": "FORWARD_CONFIGS", "dq": "BACKWARD_Q_CONFIGS", "dkdv": "BACKWARD_KV_CONFIGS", "band": "BAND_CONFIGS"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the report (markdown); - prints it")
    parser.add_argument("--methods", default=METHODS, help="comma-separated methods; `/jit` after one: its kernels "
                        "launched through Triton's `kernel[grid]` each time; `/score`: its offset table read per "
                        "score; `/rows`: its table's gradient summed in the dQ kernel")
    parser.add_argument("--shape", default="bert-base")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--ops", action="store_true", help="also time the attention operator alone")
    parser.add_argument("--tiles", action="store_true", help="also time each kernel at every tile of its list "
                        "and of a wider sweep (TILE_SWEEP), bert-base's attention at 512 and 2,048 tokens")
    parser.add_argument("--host", help="comma-separated methods whose training step's host side to profile")
    parser.add_argument("--graphs", help="comma-separated methods whose inference to time called and as a CUDA "
                        "graph's replay (the first is what the ratios divide by)")
    parser.add_argument("--no-steps", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_profile: needs CUDA", file=sys.stderr)
        return 2
    parts = []
    if not args.no_steps:
        parts.append(("steps", lambda: steps_table(args.methods.split(","), args.shape, args.length, args.batch,
                                                   args.repeats)))
    if args.host:
        parts.append(("host", lambda: host_table(args.host.split(","), args.shape, args.length, args.batch)))
    if args.graphs:
        parts.append(("graphs", lambda: graphs_table(args.graphs.split(","), args.shape, args.length, args.batch,
                                                     args.repeats)))
    if args.ops:
        parts.append(("ops", lambda: ops_table([(8, 12, 512, 64), (4, 12, 2048, 64), (1, 12, 8192, 64),
                                                (8, 12, 512, 128)])))
    if args.tiles:
        parts.append(("tiles", lambda: tiles_table([(8, 12, 512, 64), (4, 12, 2048, 64)])))
    lines, failed, report = [], [], "\n"
    for name, part in parts:  # one part's failure leaves the others' tables
        try:
            lines += part()
        except Exception as e:  # noqa: BLE001 - reported, and the exit status says so
            failed.append(name)
            lines += ["", f"## {name}: failed: {type(e).__name__}: {e}"]
            traceback.print_exc()
        report = "\n".join(lines) + "\n"
        if str(args.out) != "-":
            args.out.write_text(report)
    if str(args.out) == "-":
        print(report, flush=True)
    print(f"SUMMARY: profiled{'; failed: ' + ', '.join(failed) if failed else ''}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
