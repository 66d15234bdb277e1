"""The cost of each position method: DIET Table 1 (training and inference time against the baseline) and
Table 6 (parameters), measured the same way for every method.

    ratio(method) = median over cycles c of  t_c(method) / t_c(none)

Each cycle runs one step of every candidate (in a rotated order), so load from other processes on the
machine hits all candidates of a cycle alike and cancels in the per-cycle ratio; the median discards
cycles that a burst of load hit unevenly. Warm-up steps run first and are not timed.

A candidate is a method on a backend (`diet-rel@fused`; no `@`: the default, "auto"); the baseline `none`
always runs on sdpa, which is FlashAttention's kernel on a GPU (no bias, no mask). Shapes are the encoder
presets, or `lm-<preset>`: the causal LM at that preset's sizes (decoder-only, causal, no segments; the
Llama-shaped case at bert-base's 12 layers of 12 heads of 64).

A training step is forward, loss, backward and an AdamW step on the encoder (`DietModel`: embeddings,
position encoding, the layers, BERT's pooler); the loss is the mean square of the last hidden states, so no
task head dilutes the encoder's cost. Inference is a forward pass under `torch.inference_mode`. Inputs are
sentence pairs: token type 0 for the first half of each sequence, 1 for the second, no padding.
Peak memory is measured in a fresh process per configuration (`dietpe.bench.memory`, which builds its
models and steps with this module's functions).

`compile`: every candidate, `none` and the peers included, runs as `torch.compile(model, mode=...)`. DIET's
Table 1 was timed on TPUs, where XLA runs the whole step as one compiled program; an eager PyTorch step at
bert-base and 512 tokens is bound by the host's Python (docs/kernels.md, "Where the time goes"), and a
compiled one ("reduce-overhead": CUDA graphs) leaves the GPU's own cost. Dynamo keeps its compiled entries per
code object, and every diet candidate shares `DietModel.forward`: its recompile limit (8) is raised for the
run to what the candidates need, and hitting it fails the run instead of falling back to eager unnoticed.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from dietpe.attention.registry import backend_names
from dietpe.config import POSITIONS, PRESETS, DietConfig
from dietpe.errors import ConfigError
from dietpe.positions.registry import REGISTRY
from dietpe.tasks.runtime import autocast, compile_args, compile_model


@dataclass(frozen=True)
class Variant:
    """One row of the table: a position method, where segments enter, and the attention backend. `+seg` in a
    label: per-head segments (DIET eq. 2) instead of BERT's input segment embedding; `@fused`: the backend."""

    position: str
    segment: str = "input"
    backend: str = "auto"
    fields: tuple[tuple[str, object], ...] = ()  # the method's own config fields given in its spec

    @property
    def label(self) -> str:
        name = self.position + "".join(f":{k}={'none' if v is None else v}" for k, v in self.fields) + \
            ("+seg" if self.segment == "per-head" else "")
        return name if self.backend == "auto" or self == BASELINE else f"{name}@{self.backend}"

    @classmethod
    def parse(cls, label: str) -> "Variant":
        spec, at, backend = label.partition("@")
        method, plus, rest = spec.partition("+")
        position, colon, _ = method.partition(":")
        if position not in POSITIONS or (plus and rest != "seg"):
            raise ConfigError(f"method {label!r} is not a position method, optionally with its fields "
                              f"(shaw:shaw_max_distance=1024), '+seg' (per-head segments) and '@backend'; allowed: "
                              f"{', '.join(POSITIONS)}")
        if at and backend not in backend_names():
            raise ConfigError(f"method {label!r}: backend {backend!r} is not one of {', '.join(backend_names())}")
        if spec == "none" and backend in ("", "sdpa"):
            return BASELINE
        return cls(position, "per-head" if plus else "input", backend or "auto",
                   _spec_fields(method, label) if colon else ())

    def on(self, backend: str) -> "Variant":
        """This method on `backend` (the baseline stays itself)."""
        return self if self == BASELINE else Variant(self.position, self.segment, backend, self.fields)


def _spec_fields(method: str, label: str) -> tuple[tuple[str, object], ...]:
    """The fields a spec such as `shaw:shaw_max_distance=1024` sets beyond its method's defaults, checked as the
    method's own (dietpe.methods.parse_method); segments are `+seg`'s, not a field."""
    from dietpe.methods import parse_method

    if "segment=" in method:
        raise ConfigError(f"method {label!r}: segments are chosen with '+seg' (per-head) here, not segment=")
    given = parse_method(method).config_fields()
    plain = parse_method(method.partition(":")[0]).config_fields()
    return tuple((k, v) for k, v in given.items() if k not in ("position", "segment") and plain.get(k) != v)


#: the baseline every ratio divides by: no position term, on SDPA (FlashAttention's kernel on a GPU)
BASELINE = Variant("none", backend="sdpa")
#: shape prefix of the causal LM at a preset's sizes
LM = "lm-"
# every method of the registry; DIET's (shareable, per-head) ones also with per-head segments (`+seg`)
DEFAULT_METHODS = tuple(label for name, m in REGISTRY.items()
                        for label in ((name, name + "+seg") if m.shareable else (name,)))
# methods without a table indexed by absolute position: the only ones that run past max_position_embeddings
LENGTH_FREE = tuple(label for label in DEFAULT_METHODS if not REGISTRY[label.split("+")[0]].learned_table)


def model_config(shape: str, variant: Variant, max_length: int = 512, **overrides) -> DietConfig:
    """The encoder preset `shape`, or for `lm-<preset>` the causal LM at its sizes, with the variant's method,
    segments and backend; ConfigError for what the model refuses (e.g. segments in a causal LM)."""
    preset = shape[len(LM):] if shape.startswith(LM) else shape
    if preset not in PRESETS:
        raise ConfigError(f"shape {shape!r} is not one of {', '.join(map(repr, PRESETS))}, or one of them after "
                          f"{LM!r} (the causal LM)")
    kw = dict(position=variant.position, max_position_embeddings=max_length, attn_backend=variant.backend,
              **dict(variant.fields))
    if shape.startswith(LM):
        from dietpe.models.causal import DietCausalConfig

        if variant.segment == "per-head":
            raise ConfigError(f"{variant.label}: a causal LM has no segments")
        return DietCausalConfig.from_preset(preset, **kw, **overrides)
    return DietConfig.from_preset(preset, segment=variant.segment, **kw, **overrides)


def max_length_for(length: int) -> int:
    """max_position_embeddings of the models timed at `length`: 512, or the length beyond it."""
    return max(512, length)


def build_model(config: DietConfig, seed: int = 0) -> nn.Module:
    from dietpe.models.causal import DietCausalConfig, DietCausalModel
    from dietpe.models.modeling import DietModel

    torch.manual_seed(seed)
    return DietCausalModel(config) if isinstance(config, DietCausalConfig) else DietModel(config)


@contextlib.contextmanager
def compile_limits(how: str | None, candidates: int):
    """Dynamo's recompile limits raised to what `candidates` models need (each a train and an inference entry,
    and one more for a guard that fails once), and a failure where they are hit: never eager unnoticed."""
    if how is None:
        yield
        return
    limit = 8 + 4 * candidates
    with torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=max(256, 4 * limit),
                                    fail_on_recompile_limit_hit=True):
        yield


def _marked(step: Callable[[], None]) -> Callable[[], None]:
    """A compiled step that begins a new CUDA-graph generation each call (the candidates interleave: one
    candidate's replay must not wait for another's outputs to be freed); a no-op without CUDA graphs."""

    def run() -> None:
        torch.compiler.cudagraph_mark_step_begin()
        step()

    return run


def make_inputs(batch: int, length: int, vocab_size: int, seed: int = 0) -> dict[str, Tensor]:
    """Sentence pairs without padding: ids (B, L), token types 0 then 1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (batch, length), generator=g)
    types = torch.zeros(batch, length, dtype=torch.long)
    types[:, length // 2:] = 1
    return {"input_ids": ids, "token_type_ids": types}


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def first_output(out) -> Tensor:
    """The last hidden states of a diet or Hugging Face encoder output."""
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def training_step(model: nn.Module, inputs: dict[str, Tensor], precision: str = "fp32") -> Callable[[], None]:
    """forward, loss, backward, AdamW step: one closure per model, holding its optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    device = next(model.parameters()).device

    def step() -> None:
        model.train()
        with autocast(device, precision):
            loss = first_output(model(**inputs)).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def inference_step(model: nn.Module, inputs: dict[str, Tensor], precision: str = "fp32") -> Callable[[], None]:
    device = next(model.parameters()).device

    def step() -> None:
        model.eval()
        with torch.inference_mode(), autocast(device, precision):
            model(**inputs)

    return step


def interleaved_times(steps: dict[str, Callable[[], None]], repeats: int, warmup: int,
                      sync: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Seconds per step of every candidate, `repeats` cycles of one step each, after `warmup` untimed cycles.

    The order within a cycle rotates, so no candidate always runs right after a particular other one. `sync`
    (on CUDA `torch.cuda.synchronize`) runs before the clock starts and before it stops: a GPU step returns
    when its kernels are queued, not when they are done."""
    sync = sync or (lambda: None)
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for cycle in range(repeats):
        shift = cycle % len(names)
        for name in names[shift:] + names[:shift]:
            sync()
            start = time.perf_counter()
            steps[name]()
            sync()
            times[name].append(time.perf_counter() - start)
    return times


def median_ratio(times: list[float], baseline: list[float]) -> float:
    """The median over cycles of the per-cycle ratio t_c / baseline_c."""
    if len(times) != len(baseline) or not times:
        raise ValueError(f"need equally many cycles, got {len(times)} and {len(baseline)}")
    return statistics.median(t / b for t, b in zip(times, baseline))


def ratio_spread(times: list[float], baseline: list[float]) -> tuple[float, float]:
    """The interquartile range of the per-cycle ratios, to show how far a median can be trusted; with fewer than
    4 cycles, which have no quartiles, their whole range."""
    ratios = sorted(t / b for t, b in zip(times, baseline))
    if len(ratios) < 4:
        return ratios[0], ratios[-1]
    q = statistics.quantiles(ratios, n=4)
    return q[0], q[2]


@dataclass
class Row:
    """One method at one shape and length."""

    shape: str
    method: str
    length: int
    batch: int
    params: int
    params_increase: float  # over `none`, as a fraction
    train_ms: float | None = None
    infer_ms: float | None = None
    train_ratio: float | None = None
    infer_ratio: float | None = None
    train_iqr: tuple[float, float] | None = None
    infer_iqr: tuple[float, float] | None = None
    train_peak_mib: float | None = None  # peak RSS of the step above the idle process (model, inputs loaded)
    infer_peak_mib: float | None = None


@functools.cache
def available_memory(device: torch.device | None = None) -> int | None:
    """Bytes the kernel says a new allocation can get without swapping (Linux), else None; on CUDA the GPU's
    free memory. Read once, before the first model: with the bench's `MALLOC_TRIM_THRESHOLD_` freed memory
    stays in this process, so later readings would count the earlier phases' models as gone from the machine."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def candidate_groups(labels: list[str], bytes_each: int, budget: int | None) -> list[list[str]]:
    """Split the candidates into consecutive groups that fit `budget` bytes beside the baseline (which every
    group times again, so each group's ratios are per-cycle as before). One group when everything fits."""
    if budget is None or bytes_each <= 0:
        return [list(labels)] if labels else []
    per_group = max(1, budget // bytes_each - 1)  # minus the group's own `none`
    return [list(labels[i:i + per_group]) for i in range(0, len(labels), per_group)]


def servable(shape: str, methods: list[Variant], max_length: int, overrides: dict,
             log: Callable[[str], None] | None = None) -> list[Variant]:
    """The methods whose model `shape` builds (a backend refuses what it cannot serve when the model is
    built); the others are left out, each with a log line saying why."""
    out = []
    for v in methods:
        try:
            model_config(shape, v, max_length, **overrides)
            out.append(v)
        except ConfigError as e:
            if log:
                log(f"{shape}: {v.label} left out: {e}")
    return out


def measure(shape: str, length: int, batch: int, methods: list[Variant], repeats: int, warmup: int,
            modes: tuple[str, ...] = ("train", "infer"), peers: list[str] | None = None,
            max_length: int = 512, log: Callable[[str], None] | None = None,
            memory_budget: int | None = None, device: str = "cpu", precision: str = "fp32",
            overrides: dict | None = None, compile: str | None = None) -> list[Row]:
    """Time every method (and peer) at one shape and length, interleaved; ratios to `none`. overrides: config
    fields for every candidate (e.g. attention_probs_dropout_prob); compile: see `compile_model`.

    Every candidate of a group is alive at once (weights, and AdamW's two moments when training): 17
    bert-base candidates need about 22 GiB, so candidates are timed in groups that fit half the available
    memory (`memory_budget` bytes), each group beside its own `none`."""
    from dietpe.bench.peers import build_peer

    if compile_args(compile) is not None:  # with CUDA graphs: a warm-up call and a recording one before replays
        warmup = max(warmup, 3)
    overrides = overrides or {}
    if BASELINE not in methods:
        methods = [BASELINE, *methods]
    methods = servable(shape, methods, max_length, overrides, log)
    dev = torch.device(device)
    builders: dict[str, Callable[[], nn.Module]] = {
        v.label: (lambda v=v: build_model(model_config(shape, v, max_length, **overrides)).to(dev))
        for v in methods}
    if shape.startswith(LM) and peers and log:
        log(f"{shape}: no peers for the causal LM")
    for peer in (peers or []) if not shape.startswith(LM) else []:
        builders[peer] = lambda peer=peer: build_peer(peer, shape, max_length).to(dev)
    baseline = builders.pop("none")()
    weights = sum(p.numel() * p.element_size() for p in baseline.parameters())
    each = weights * (3 if "train" in modes else 1)  # + AdamW's exp_avg and exp_avg_sq
    budget = memory_budget if memory_budget is not None else _half(available_memory(dev))
    groups = candidate_groups(list(builders), each, budget)
    vocab = model_config(shape, BASELINE).vocab_size
    inputs = {k: t.to(dev) for k, t in make_inputs(batch, length, vocab).items()}
    if shape.startswith(LM):
        inputs = {"input_ids": inputs["input_ids"]}  # a causal LM has no token types
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    base_count = parameter_count(baseline)
    rows = {"none": Row(shape, "none", length, batch, base_count, 0.0)}
    with compile_limits(compile, len(builders) + 1):
        for k, group in enumerate(groups or [[]]):
            models = {"none": baseline, **{label: builders[label]() for label in group}}
            for label in group:
                count = parameter_count(models[label])
                rows[label] = Row(shape, label, length, batch, count, count / base_count - 1)
            for mode in modes:
                make = training_step if mode == "train" else inference_step
                steps = {label: make(compile_model(model, compile), peer_inputs(label, inputs), precision)
                         for label, model in models.items()}
                if compile is not None:
                    steps = {label: _marked(step) for label, step in steps.items()}
                if log:
                    part = f" (group {k + 1} of {len(groups)})" if len(groups) > 1 else ""
                    how = f", compiled ({compile})" if compile else ""
                    log(f"{shape} L={length} B={batch} {mode}: {len(steps)} candidates x {repeats} cycles"
                        f"{part}{how}")
                times = interleaved_times(steps, repeats, warmup, sync)
                base = times["none"]
                for label, t in times.items():
                    if label == "none" and k > 0:
                        continue  # the baseline's own row is the first group's
                    row = rows[label]
                    setattr(row, f"{mode}_ms", statistics.median(t) * 1e3)
                    setattr(row, f"{mode}_ratio", median_ratio(t, base))
                    setattr(row, f"{mode}_iqr", ratio_spread(t, base))
                del steps  # drop optimizer states before the next mode
            del models
        order = ["none", *(label for group in groups for label in group)]
        return [rows[label] for label in order]


def _half(n: int | None) -> int | None:
    return None if n is None else n // 2


def peer_inputs(label: str, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """T5's encoder has no token types."""
    if label == "hf-t5-encoder":
        return {"input_ids": inputs["input_ids"]}
    return inputs


@dataclass
class LongRow:
    """Inference at a long length (batch 1): time and the step's peak memory against `none`."""

    shape: str
    method: str
    length: int
    infer_ms: float
    infer_ratio: float
    peak_mib: float | None = None  # step peak above the idle process
    peak_ratio: float | None = None
    rss_mib: float | None = None  # whole-process high-water mark
    rss_ratio: float | None = None


def measure_long(shape: str, length: int, methods: list[Variant], repeats: int, warmup: int,
                 log: Callable[[str], None] | None = None, device: str = "cpu",
                 precision: str = "fp32", overrides: dict | None = None, compile: str | None = None
                 ) -> list[LongRow]:
    """Inference at `length` tokens, batch 1, for methods without an absolute-position table (memory:
    `dietpe.bench.memory.add_long_memory`)."""
    rows = measure(shape, length, 1, methods, repeats, warmup, modes=("infer",), log=log, device=device,
                   precision=precision, overrides=overrides, compile=compile)
    return [LongRow(shape, r.method, length, r.infer_ms, r.infer_ratio) for r in rows]
