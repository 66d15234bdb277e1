"""`dietpe bench`: the cost table of every position method (DIET Table 1 and Table 6, on this machine).

    dietpe bench                                    bert-small and bert-base at 128 and 512 tokens
    dietpe bench --shapes bert-small --peers        add Hugging Face BertModel (SDPA) and T5EncoderModel
    dietpe bench --long                             inference memory at 8,192 tokens, relative methods only
    dietpe bench --device cuda --precision bf16 --backends fused,sdpa --attention-dropout 0
                                                    every method on each backend, beside `none` on flash
    dietpe bench --shapes lm-bert-base --lengths 2048,8192 --batch 8,2 ...   the causal LM at bert-base's sizes
    dietpe bench --device cuda --precision bf16 --compile reduce-overhead      whole steps compiled, CUDA graphs
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict

import torch

from dietpe import validate as V
from dietpe.bench import cost, memory, report
from dietpe.data.text import write_text_atomic
from dietpe.errors import ConfigError
from dietpe.tasks.runtime import resolve_device, set_threads


LONG_LENGTH = 8192
LONG_METHODS = ("none", "diet-rel", "diet-rel+seg", "t5", "alibi", "rotary")


def _batches(args) -> list[int]:
    if args.batch is None:
        return [max(1, 1024 // n) for n in args.lengths]
    if len(args.batch) == 1:
        return args.batch * len(args.lengths)
    if len(args.batch) != len(args.lengths):
        raise ConfigError(f"--batch lists {len(args.batch)} sizes for {len(args.lengths)} lengths; give one, or "
                          f"one per length")
    return args.batch


def _parse(args) -> tuple[list[cost.Variant], list[cost.Variant], list[str]]:
    """The options checked before any timing: (methods, long-input methods, peers)."""
    if args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        raise ConfigError(f"--repeats ({args.repeats}) and --threads ({args.threads}) must be >= 1, "
                          f"--warmup ({args.warmup}) >= 0")
    if args.attention_dropout is not None and not 0 <= args.attention_dropout < 1:
        raise ConfigError(f"--attention-dropout {args.attention_dropout}: give a probability in [0, 1)")
    for path, option in ((args.json, "--json"), (args.markdown, "--markdown")):
        if path:
            V.check_output_file(path, option)  # before the timings, not after
    for mode in args.modes:
        if mode not in ("train", "infer"):
            raise ConfigError(f"--modes: {mode!r} is not one of 'train', 'infer'")
    for backend in args.backends:
        cost.Variant.parse(f"none@{backend}")  # the backend's name checked before any timing
    # a method named with its own backend (rotary@auto) runs there alone; --backends applies to the others
    variants = list(dict.fromkeys(cost.Variant.parse(m) if "@" in m else cost.Variant.parse(m).on(b)
                                  for m in (args.methods or cost.DEFAULT_METHODS) for b in args.backends))
    if not args.long:
        V.refuse_unused(args, {"long_length": "--long-length", "long_methods": "--long-methods"}, "without --long")
    args.long_length = args.long_length or LONG_LENGTH
    args.long_methods = args.long_methods or list(LONG_METHODS)
    long_variants = [cost.Variant.parse(m) for m in args.long_methods] if args.long else []
    for v in long_variants:
        if v.label not in cost.LENGTH_FREE:
            raise ConfigError(f"--long-methods: {v.label!r} has a table indexed by absolute position (512 "
                              f"entries); allowed: {', '.join(cost.LENGTH_FREE)}")
    for shape in args.shapes:
        cost.model_config(shape, cost.BASELINE)  # validates the name before any long run
    peers = ["hf-bert", "hf-t5-encoder"] if args.peers else []
    if peers:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("dietpe bench: transformers is not installed; no peers", file=sys.stderr)
            peers = []
    return variants, long_variants, peers


def _check_memory(args, device: torch.device) -> None:
    """On the CPU, where running out of memory kills the process without a word, refuse before any timing a size
    that cannot fit even without attention's scores (which flash-style kernels never hold): parameters (with
    AdamW's moments in training) and the activations `layer_activations` counts. A GPU raises its out-of-memory
    error itself."""
    from dietpe.tasks.runtime import GiB, available_memory, layer_activations

    available = available_memory("cpu") if device.type == "cpu" else None
    if available is None:
        return
    train = "train" in args.modes
    for shape in args.shapes:
        config = cost.model_config(shape, cost.BASELINE)
        with torch.device("meta"):
            n_params = sum(p.numel() for p in cost.build_model(config).parameters())
        layers = config.num_hidden_layers if train else 1  # a forward without a backward keeps one layer's
        for length, batch in zip(args.lengths, _batches(args)):
            need = (16 if train else 4) * n_params + layers * layer_activations(config, batch, length, scores=False)
            if need > available:
                raise ConfigError(f"{shape} at --batch {batch} × {length} tokens needs at least {need / GiB:.1f} GiB "
                                  f"({'training' if train else 'inference'}, without attention's scores), this "
                                  f"machine has {available / GiB:.1f} GiB available; lower --batch or --lengths")


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class _Tables:
    """The rows measured so far, written (Markdown and JSON) after every phase, so a run stopped by a time
    limit keeps every finished phase."""

    def __init__(self, args, device: torch.device, total: int):
        self.args, self.total, self.done = args, total, 0
        self.rows: dict[tuple[str, int, str], cost.Row] = {}
        self.long_rows: list[cost.LongRow] = []
        self.settings = {
            "threads": args.threads, "repeats": args.repeats,
            "warmup": max(args.warmup, 3) if args.compile else args.warmup,  # as `cost.measure` runs them
            "torch": torch.__version__,
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": args.precision, "compile": args.compile or "no (eager)",
            "command": "dietpe bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
            "kernel settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith("DIETPE_FUSED_")}}

    def add(self, rows: list[cost.Row], mode: str) -> None:
        for row in rows:
            key = (row.shape, row.length, row.method)
            if key in self.rows:  # the other mode's figures join the row measured first
                for field in (f"{mode}_ms", f"{mode}_ratio", f"{mode}_iqr"):
                    setattr(self.rows[key], field, getattr(row, field))
            else:
                self.rows[key] = row

    def write(self, final: bool) -> str:
        args = self.args
        settings = {**self.settings, **({} if final else {"partial": f"{self.done} of {self.total} phases done"})}
        text = report.markdown(list(self.rows.values()), self.long_rows, settings)
        if args.markdown:
            write_text_atomic(args.markdown, text)
        if args.json:
            write_text_atomic(args.json, json.dumps({"settings": settings,
                                                     "rows": [asdict(r) for r in self.rows.values()],
                                                     "long": [asdict(r) for r in self.long_rows]}, indent=1))
        if not final and (args.markdown or args.json):
            _log(f"{self.done}/{self.total} phases: tables so far in "
                 f"{' and '.join(p for p in (args.markdown, args.json) if p)}")
        return text


def params_table(args) -> int:
    """`--params`: DIET Table 6 (dietpe.bench.params), counted on the meta device."""
    from dietpe.bench import params
    from dietpe.methods import parse_methods

    for path, option in ((args.json, "--json"), (args.markdown, "--markdown")):
        if path:
            V.check_output_file(path, option)
    methods = parse_methods(",".join(args.methods)) if args.methods else []
    rows = params.table6_rows(methods)
    text = params.markdown(rows)
    if args.markdown:
        write_text_atomic(args.markdown, text)
    if args.json:
        write_text_atomic(args.json, json.dumps({"rows": [asdict(r) for r in rows]}, indent=1))
    print(text)
    return 0


def run(args) -> int:
    if getattr(args, "params", False):
        return params_table(args)
    variants, long_variants, peers = _parse(args)
    set_threads(args.threads)
    device = resolve_device(args.device)
    if args.precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs CUDA; use bf16 or fp32 on the CPU")
    if "fused" in args.backends and device.type != "cuda":
        raise ConfigError("--backends fused: the fused kernel runs on CUDA; give --device cuda")
    if "flex" in args.backends and "train" in args.modes and device.type != "cuda":
        raise ConfigError("--backends flex: FlexAttention's backward needs CUDA; give --device cuda, or "
                          "--modes infer on the CPU")
    _check_memory(args, device)
    cost.available_memory(device)  # read before any model exists: the memory groups of every phase use it
    overrides = {} if args.attention_dropout is None else {"attention_probs_dropout_prob": args.attention_dropout}
    on = {"device": device.type, "precision": args.precision, "overrides": overrides}
    # one phase per shape, length and mode (and memory, and long inputs)
    phases = [(shape, length, batch, mode) for shape in args.shapes
              for length, batch in zip(args.lengths, _batches(args)) for mode in args.modes]
    total = len(phases) + (len(args.shapes) * len(args.lengths) if args.memory else 0) + bool(long_variants)
    tables = _Tables(args, device, total)
    for i, (shape, length, batch, mode) in enumerate(phases):
        tables.add(cost.measure(shape, length, batch, variants, args.repeats, args.warmup, (mode,), peers,
                                max_length=cost.max_length_for(length), log=_log, compile=args.compile, **on), mode)
        tables.done += 1
        tables.write(final=False)
        last_of_length = i + 1 == len(phases) or phases[i + 1][:2] != (shape, length)
        if args.memory and last_of_length:
            memory.add_memory([r for (s, n, _), r in tables.rows.items() if (s, n) == (shape, length)],
                              args.modes, args.threads, log=_log, **on)
            tables.done += 1
            tables.write(final=False)
    if long_variants:
        tables.long_rows = cost.measure_long(args.shapes[0], args.long_length, long_variants,
                                             max(3, args.repeats // 3), 1, log=_log, compile=args.compile, **on)
        memory.add_long_memory(tables.long_rows, args.threads, log=_log, **on)  # the long table's point
        tables.done += 1
    print(tables.write(final=True))
    return 0
