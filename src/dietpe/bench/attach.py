"""What a method attached to transformers' Llama costs beside the native model: a training step (AdamW) per
method, its time (median of `--steps` after `--warmup`), × the native model's, its peak memory, and a census of
the large tensors it creates.

    python -m dietpe.bench.attach --device cuda --dtype bfloat16                     # the GPU table, 8 × 2,048
    python -m dietpe.bench.attach --device cuda --dtype bfloat16 --shapes 8x2048,2x8192
    python -m dietpe.bench.attach --device cpu --census --layers 2 --hidden 64 --heads 4 --kv-heads 2 \\
        --shapes 2x1024 --methods native,none,rotary,diet-rel,t5,diet-abs

Rows: `native` is transformers' Llama with its own RoPE and attention; every other row is the same model
(same seed) with `dietpe.attach(model, spec)`. Each row is guarded: out of memory or an error prints a row and
the next one runs. `--budget` (seconds) skips the rows left once it is spent, so the run is bounded. The
census (a `TorchDispatchMode`) counts every tensor a training step creates with at least B·H·L²/4 elements:
the native model creates none; a method's dense (B, H, L, L) tensors show there.

Written here rather than taken from a library: it measures this project's attach against transformers' own
model, in one process, with the same batches.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from dietpe import validate as V

DEFAULT_METHODS = "native,rotary,none,diet-rel,t5,alibi,kerple,fire,diet-abs"


class Census(TorchDispatchMode):
    """Records (op, shape) of every tensor an op returns with at least `threshold` elements."""

    def __init__(self, threshold: int):
        super().__init__()
        self.threshold, self.big = threshold, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.numel() >= self.threshold:
                self.big.append((str(func.overloadpacket.__name__), tuple(t.shape)))
        return out


def llama(layers: int, hidden: int, heads: int, kv_heads: int, length: int, vocab: int, device, dtype):
    """transformers' LlamaForCausalLM of these sizes (SwiGLU 8/3·d), seed 0, on `device` in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max(length, 128), attention_dropout=0.0)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).to(device=device, dtype=dtype)


def build(spec: str, args, length: int, device, dtype):
    model = llama(args.layers, args.hidden, args.heads, args.kv_heads, length, args.vocab, device, dtype)
    if spec != "native":
        import dietpe

        dietpe.attach(model, spec)
    return model.train()


def train_step(model, optimizer, x):
    loss = model(input_ids=x, labels=x, use_cache=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def backend_of(model, device) -> str:
    """Which backend the attached layers run on this device ('transformers' where the method adds nothing
    inside attention)."""
    attached = getattr(model.base_model, "diet_positions", None)
    if attached is None or not attached.acts_in_attention:
        return "transformers"
    from dietpe.integrations.dispatch import BACKEND_OF, auto_backend

    name = attached.backend or BACKEND_OF.get(model.config._attn_implementation, "auto")
    probe = torch.empty(1, 1, 1, 1, device=device)  # which backend takes a call on this device
    return auto_backend(probe, False, 0.0) if name == "auto" else name


def measure(spec: str, args, batch: int, length: int, device, dtype) -> dict:
    model = build(spec, args, length, device, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, args.vocab, (batch, length), generator=torch.Generator().manual_seed(1)).to(device)
    row = {"backend": backend_of(model, device)}
    if args.census:
        heads = args.heads
        with Census(batch * heads * length * length // 4) as census:
            train_step(model, optimizer, x)
        row["census"] = len(census.big)
        row["shapes"] = sorted({s for _, s in census.big})
    for _ in range(args.warmup):
        train_step(model, optimizer, x)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        train_step(model, optimizer, x)
        sync(device)
        times.append((time.perf_counter() - start) * 1000)
    row["ms"] = statistics.median(times)
    if device.type == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    return row


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fmt_row(shape: str, spec: str, row: dict, native_ms: float | None) -> str:
    if "error" in row:
        return f"| {shape} | {spec} | {row.get('backend', '')} | {row['error']} | | | |"
    ratio = f"{row['ms'] / native_ms:.2f}" if native_ms else ""
    peak = f"{row['peak_gib']:.1f}" if "peak_gib" in row else "–"
    census = f"{row['census']} {row['shapes'][:3]}" if "census" in row else "–"
    return f"| {shape} | {spec} | {row['backend']} | {row['ms']:.1f} | {ratio} | {peak} | {census} |"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m dietpe.bench.attach", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                   help="the model's dtype (the method follows it)")
    p.add_argument("--layers", type=int, default=12, help="decoder layers")
    p.add_argument("--hidden", type=int, default=768, help="hidden size d")
    p.add_argument("--heads", type=int, default=12, help="query heads")
    p.add_argument("--kv-heads", type=int, default=4, help="key-value heads (grouped-query attention)")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary size")
    p.add_argument("--shapes", default=[(8, 2048)], type=_shapes,
                   help="comma-separated BATCHxLENGTH, e.g. 8x2048,2x8192")
    p.add_argument("--methods", default=DEFAULT_METHODS, help="'native' and method specs, comma-separated")
    p.add_argument("--steps", type=V.positive_int, default=6, help="timed steps (the median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, allocator)")
    p.add_argument("--census", action="store_true", help="count the tensors of >= B·H·L²/4 elements of one step")
    p.add_argument("--budget", type=float, default=None, help="seconds; rows left once spent are skipped")
    return p.parse_args(argv)


def _shapes(text: str) -> list[tuple[int, int]]:
    """An argparse type: BATCHxLENGTH[,BATCHxLENGTH...] of positive integers."""
    try:
        shapes = [tuple(int(n) for n in s.lower().split("x")) for s in text.split(",") if s.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"{text!r} is not BATCHxLENGTH[,BATCHxLENGTH...] of positive integers "
                                         f"(e.g. 8x2048,2x8192)")
    return shapes


def main(argv=None) -> int:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)  # a score_mod each
    shapes = args.shapes
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    begin = time.perf_counter()
    print(f"Llama {args.layers} layers, d {args.hidden}, {args.heads} heads, {args.kv_heads} KV heads, "
          f"{args.dtype} on {args.device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'})"
          f", AdamW step, median of {args.steps} after {args.warmup}")
    print("| B×L | spec | backend | ms/step | × native | peak GiB | census (count, shapes) |")
    print("|---|---|---|--:|--:|--:|---|")
    for batch, length in shapes:
        native_ms = None
        for spec in methods:
            shape = f"{batch}×{length}"
            if args.budget is not None and time.perf_counter() - begin > args.budget:
                print(f"| {shape} | {spec} | | skipped: --budget {args.budget:g} s spent | | | |", flush=True)
                continue
            try:
                row = measure(spec, args, batch, length, device, dtype)
            except torch.OutOfMemoryError:
                row = {"error": "out of memory"}
            except Exception as e:  # a row per config, whatever fails
                row = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}
            release(device)
            if spec == "native" and "ms" in row:
                native_ms = row["ms"]
            print(fmt_row(shape, spec, row, native_ms), flush=True)
    print(f"total {time.perf_counter() - begin:.0f} s")
    return 0


if __name__ == "__main__":
    from dietpe.errors import module_main

    sys.exit(module_main(main, "python -m dietpe.bench.attach"))
