"""What every training job shares at run time: processes (torchrun / accelerate), threads, the device, the
precision and determinism switches, the global batch layout, a compact progress bar, small datasets and the
loss curves of a run."""

from __future__ import annotations

import math
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

from dietpe.commands import COMPILE_BACKENDS, COMPILE_MODES, PRECISIONS
from dietpe.errors import ConfigError


class ProgressBar(TrainerCallback):
    """One tqdm bar per run with the latest loss and evaluation score, and a passing one for each evaluation (at
    paper scale one takes minutes), on the main process only."""

    def __init__(self, description: str, score_key: str | None = None):
        self.description = description
        self.score_key = score_key
        self.bar = None
        self.eval_bar = None
        self.postfix: dict[str, str] = {}

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not state.is_world_process_zero or args.disable_tqdm:
            return
        if self.eval_bar is None:
            from tqdm.auto import tqdm
            total = len(eval_dataloader) if hasattr(eval_dataloader, "__len__") else None
            self.eval_bar = tqdm(total=total, desc=f"{self.description} evaluating", leave=False,
                                 dynamic_ncols=True, file=sys.stderr)
        self.eval_bar.update(1)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None

    on_predict = on_evaluate  # `Trainer.predict` ends each evaluation set

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and not args.disable_tqdm:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=self.description,
                            dynamic_ncols=True, leave=True, file=sys.stderr)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None or not logs:
            return
        if "loss" in logs:
            self.postfix["loss"] = f"{logs['loss']:.3f}"
        if "eval_loss" in logs:
            self.postfix["val_loss"] = f"{logs['eval_loss']:.3f}"
        if self.score_key and self.score_key in logs:
            self.postfix["score"] = f"{logs[self.score_key]:.1f}"
        self.bar.set_postfix(self.postfix, refresh=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def replace_progress(trainer, bar: ProgressBar) -> None:
    """Swap Trainer's own progress bar and log printer for `bar` (and silence the bars of saving shards)."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(bar)


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: list[dict]):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def set_threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads={threads} must be at least 1")
        torch.set_num_threads(threads)


# cuBLAS needs a fixed workspace to pick deterministic reductions (CUDA docs, "Reproducibility")
CUBLAS_WORKSPACE = ":4096:8"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: str | None) -> torch.device:
    """The device a command runs on; `cuda` without CUDA is one clear error."""
    device = device or default_device()
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available on this machine (torch "
                          f"{torch.__version__}, built {'with' if torch.version.cuda else 'without'} CUDA); "
                          "use --device cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: allowed values are cpu, cuda")
    return torch.device(device)


def trainer_device_args(device: str | None, precision: str = "fp32", deterministic: bool = False,
                        compile: str | None = None) -> dict:
    """The `TrainingArguments` fields for a device, a precision, determinism and compiling: fp16 needs CUDA, TF32
    is allowed on CUDA in fp32 unless determinism is asked for (TF32 rounds differently across GPUs); compile:
    an inductor mode or a code-free backend (`add_compile_option`), which the Trainer's accelerator applies."""
    dev = resolve_device(device)
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision {precision!r}: allowed values are {', '.join(PRECISIONS)}")
    compiled = compile_args(compile)
    if precision == "fp16" and dev.type != "cuda":
        raise ConfigError("--precision fp16 needs CUDA (fp16 mixed precision scales the loss on the GPU); "
                          "use bf16 or fp32 on the CPU")
    cuda = dev.type == "cuda"
    set_determinism(dev, deterministic)
    # HF's full_determinism makes Trainer call enable_full_determinism (deterministic algorithms, cuBLAS
    # workspace, cuDNN) in place of set_seed; TF32 is set here rather than by `tf32=True`, which refuses GPUs
    # older than Ampere instead of leaving them in fp32
    trainer = {} if compiled is None else dict(torch_compile=True, torch_compile_backend=compiled["backend"],
                                                 torch_compile_mode=compiled.get("mode"))
    return dict(use_cpu=not cuda, bf16=precision == "bf16", fp16=precision == "fp16",
                full_determinism=bool(deterministic and cuda), **trainer)


def compile_args(how: str | None) -> dict | None:
    """torch.compile's keyword arguments for a `--compile` value (`commands.add_compile_option`): an inductor
    mode, or a backend that makes no code; None for eager; ConfigError for anything else."""
    if how is None:
        return None
    if how not in COMPILE_MODES + COMPILE_BACKENDS:
        raise ConfigError(f"--compile {how!r}: allowed values are {', '.join(COMPILE_MODES + COMPILE_BACKENDS)}")
    return dict(backend=how) if how in COMPILE_BACKENDS else dict(backend="inductor", mode=how)


def compile_model(model, how: str | None):
    """model itself (how None), or `torch.compile(model, ...)` as `compile_args` says."""
    kwargs = compile_args(how)
    return model if kwargs is None else torch.compile(model, **kwargs)


def set_determinism(device: torch.device, deterministic: bool) -> None:
    """On CUDA: deterministic algorithms (what HF's `enable_full_determinism` sets, also for loops outside
    `Trainer`), else TF32 matmuls. Nothing on the CPU, whose kernels are deterministic already."""
    if device.type == "cuda" and deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    elif device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True


def autocast(device: torch.device, precision: str):
    """Mixed precision for hand-written loops: autocast to bf16 / fp16, or nothing for fp32."""
    import contextlib
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def start_afresh(path: Path, use_cpu: bool) -> None:
    """--overwrite: the main process removes the old run while the others wait, so none of them reads the old
    run or races its removal. Under torchrun the process group is joined here, with the device Trainer's
    arguments will ask for (`use_cpu`), which then keep it."""
    state = None
    if world_size() > 1:
        from accelerate import PartialState

        state = PartialState(cpu=use_cpu)
    if is_main_process() and path.exists():
        from dietpe.validate import LOCK_PREFIX

        for entry in path.iterdir():  # the run's locks stay: the folder is still held while it is emptied
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif not entry.name.startswith(LOCK_PREFIX):
                entry.unlink()
    if state is not None:
        state.wait_for_everyone()


def data_parallel_devices() -> int:
    """GPUs one process drives: without torchrun, `Trainer` wraps the model in DataParallel over all of them
    and multiplies the per-device batch by their number (`TrainingArguments.n_gpu`)."""
    if world_size() > 1 or not torch.cuda.is_available():
        return 1
    return torch.cuda.device_count()


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def batch_layout(global_batch: int, device_batch: int, n_gpu: int | None = None) -> tuple[int, int]:
    """(per-device batch, gradient accumulation) reaching `global_batch` over all processes and, without
    torchrun, over the `n_gpu` GPUs of DataParallel (default: `data_parallel_devices()`)."""
    n_gpu = data_parallel_devices() if n_gpu is None else n_gpu
    world = world_size() * max(1, n_gpu)
    if global_batch % world:
        what = f"{world} processes" if n_gpu <= 1 else f"{world} GPUs ({n_gpu} per process under DataParallel)"
        raise ConfigError(f"batch size {global_batch} is not divisible by the {what}")
    per_process = global_batch // world
    per_device = min(per_process, device_batch)
    accumulation = math.ceil(per_process / per_device)
    if per_device * accumulation != per_process:
        raise ConfigError(f"batch size {global_batch} over {world} process(es) is not a multiple of the device "
                          f"batch {device_batch}; pick --device-batch-size dividing {per_process}")
    return per_device, accumulation


def log_history_curves(log_history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Training and validation loss curves from `Trainer.state.log_history`."""
    curves: dict[str, list[tuple[int, float]]] = {"train_loss": [], "eval_loss": []}
    for row in log_history:
        for key, name in (("loss", "train_loss"), ("eval_loss", "eval_loss")):
            if key in row and "step" in row:
                curves[name].append((int(row["step"]), float(row[key])))
    return curves


# -- memory ------------------------------------------------------------------------------------------------

GiB = 1024 ** 3


def available_memory(device: str | None) -> float | None:
    """Bytes free for a run on `device`: the GPU's free memory on CUDA, else MemAvailable (Linux), else psutil's;
    None where it cannot be told."""
    if (device or default_device()) == "cuda" and torch.cuda.is_available():
        return float(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
        return float(psutil.virtual_memory().available)
    except ImportError:
        return None


def layer_activations(config, batch: int, length: int, scores: bool = True) -> float:
    """Bytes one layer keeps for the backward in fp32: Korthikanti et al. (2022)'s 34·s·b·h + 5·a·s²·b bytes in
    16 bits, doubled; `scores=False` leaves out the attention scores, which flash-style kernels never hold."""
    h, heads = config.hidden_size, config.num_attention_heads
    return 68.0 * batch * length * h + (10.0 * heads * length * length * batch if scores else 0.0)


def _parameters(config) -> int:
    """The parameter count of the model `config` builds (a causal LM's or a masked LM's), on the meta device."""
    from dietpe.models import DietForCausalLM, DietForMaskedLM

    with torch.device("meta"):
        model = (DietForCausalLM if getattr(config, "causal", False) else DietForMaskedLM)(config)
        return sum(p.numel() for p in model.parameters())


def training_memory(config, batch: int, length: int) -> tuple[float, float]:
    """Bytes an fp32 language-model training step needs: (parameters, gradients and Adam's two moments: 16 bytes
    a parameter; activations kept for the backward pass). Activations per layer follow Korthikanti et al. (2022,
    34sbh + 5as^2b bytes in 16 bits), doubled for fp32, plus the logits over the vocabulary and their gradient.
    An estimate for refusing sizes far beyond memory, not a budget."""
    activations = config.num_hidden_layers * layer_activations(config, batch, length) + \
        8 * batch * length * config.vocab_size
    return 16.0 * _parameters(config), float(activations)


def scoring_memory(config, batch: int, length: int) -> tuple[float, float]:
    """Bytes a forward without gradients needs at its peak: (the fp32 parameters; one layer's working set, which
    the next layer frees, and the logits with their float copy for the loss)."""
    return 4.0 * _parameters(config), layer_activations(config, batch, length) + 8.0 * batch * length * \
        config.vocab_size


def check_memory(config, batch: int, length: int, device: str | None, what: str,
                 fix: str = "lower --device-batch-size, --max-length or --size", scoring: bool = False) -> None:
    """Refuse, before any work, a model and batch whose estimated training memory (`scoring`: that of a forward
    without gradients) exceeds what is available; `fix` names the options that lower it."""
    available = available_memory(device)
    if available is None:
        return
    state, activations = (scoring_memory if scoring else training_memory)(config, batch, length)
    if state + activations > available:
        held = "parameters" if scoring else "parameters, gradients and optimizer state"
        raise ConfigError(
            f"{what} needs about {(state + activations) / GiB:.1f} GiB ({held} {state / GiB:.1f} GiB, activations "
            f"of a batch of {batch} x {length} tokens {activations / GiB:.1f} GiB), this machine has "
            f"{available / GiB:.1f} GiB available "
            f"{'on the GPU' if (device or default_device()) == 'cuda' else ''}".rstrip()
            + f"; {fix}, or pass --ignore-memory-check")
