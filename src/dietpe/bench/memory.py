"""Peak memory of one step, measured in a fresh process per configuration (Linux).

PyTorch's CPU allocator is plain malloc, so neither tracemalloc nor torch's counters see it, and a
process's peak RSS mixes in whatever ran before. The child therefore builds one model, runs one untimed
step (AdamW states, oneDNN caches), returns freed memory to the system (glibc mmap threshold forced low, so
every large tensor is its own mapping and goes back on free), resets the kernel's high-water mark
(`echo 5 > /proc/self/clear_refs`), runs one more step and reads `VmHWM` from /proc/self/status.

    step peak = VmHWM during the step - VmRSS just before it      (activations, gradients, temporaries)
    peak RSS  = VmHWM during the step                              (adds the library, weights, optimizer state)

On CUDA the caching allocator counts exactly: the same two figures are `torch.cuda.max_memory_allocated`
during the step less `memory_allocated` before it, and that maximum itself (GPU memory, not RSS).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

from typing import Callable

import torch

from dietpe.bench import cost
from dietpe.bench.peers import build_peer
from dietpe.errors import DietError

# glibc: no dynamic mmap threshold, so tensors above 64 KiB are mapped and unmapped, and RSS tracks live memory
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_ARENA_MAX": "2"}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}: peak memory needs Linux")


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def step_peak(spec: dict) -> dict:
    """In this process: build spec's model, warm up, and measure one step. Returns sizes in MiB."""
    torch.set_num_threads(spec.get("threads", 2))
    label, shape = spec["method"], spec["shape"]
    if label.startswith("hf-"):
        model = build_peer(label, shape, spec["max_length"])
    else:
        model = cost.build_model(cost.model_config(shape, cost.Variant.parse(label), spec["max_length"],
                                                   **spec.get("overrides", {})))
    inputs = cost.peer_inputs(label, cost.make_inputs(spec["batch"], spec["length"], 30522))
    if shape.startswith(cost.LM):
        inputs = {"input_ids": inputs["input_ids"]}  # a causal LM has no token types
    make = cost.training_step if spec["mode"] == "train" else cost.inference_step
    device = torch.device(spec.get("device", "cpu"))
    if device.type == "cuda":
        model = model.to(device)
        step = make(model, {k: t.to(device) for k, t in inputs.items()}, spec.get("precision", "fp32"))
        step()
        torch.cuda.synchronize(device)
        gc.collect()
        torch.cuda.empty_cache()
        idle = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        return {"idle_mib": idle / 2**20, "peak_mib": peak / 2**20, "step_mib": (peak - idle) / 2**20,
                "exact": True}
    step = make(model, inputs, spec.get("precision", "fp32"))
    step()
    gc.collect()
    idle = _status_kib("VmRSS")
    exact = _reset_high_water_mark()
    step()
    peak = _status_kib("VmHWM")
    return {"idle_mib": idle / 1024, "peak_mib": peak / 1024, "step_mib": (peak - idle) / 1024,
            "exact": exact}


def measure_peak(spec: dict, timeout: float = 1800) -> dict:
    """Run `step_peak(spec)` in a fresh Python process and return its result."""
    env = {**os.environ, **CHILD_ENV}
    for key in ("MALLOC_MMAP_MAX_",):  # the timing runs' setting would keep every tensor in the heap
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "dietpe.bench.memory", json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:  # one line naming the configuration and how its process ended (-9: out of memory?)
        last = next((line for line in reversed(done.stderr.strip().splitlines()) if line.strip()), "")
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        raise DietError(f"the memory measurement of {spec['method']} at {spec['shape']}, length {spec['length']}, "
                        f"batch {spec['batch']} ({spec['mode']}) failed: {how}" + (f"; {last}" if last else "")
                        + "; --no-memory skips it")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spec(shape: str, method: str, length: int, batch: int, mode: str, threads: int, device: str,
          precision: str, overrides: dict | None = None, max_length: int = 512) -> dict:
    return {"shape": shape, "method": method, "length": length, "batch": batch, "mode": mode,
            "max_length": max_length, "threads": threads, "device": device, "precision": precision,
            "overrides": overrides or {}}


def add_memory(rows: list[cost.Row], modes, threads: int, log: Callable[[str], None] | None = None,
               device: str = "cpu", precision: str = "fp32", overrides: dict | None = None) -> None:
    """Fill each row's step peak memory, one fresh process per (method, mode)."""
    for row in rows:
        for mode in modes:
            if log:
                log(f"memory {row.shape} {row.method} L={row.length} {mode}")
            spec = _spec(row.shape, row.method, row.length, row.batch, mode, threads, device, precision, overrides,
                         cost.max_length_for(row.length))
            setattr(row, f"{mode}_peak_mib", measure_peak(spec)["step_mib"])


def add_long_memory(rows: list[cost.LongRow], threads: int, log: Callable[[str], None] | None = None,
                    device: str = "cpu", precision: str = "fp32", overrides: dict | None = None) -> None:
    """Fill each long row's step peak and process peak, and both against `none`'s."""
    for row in rows:
        if log:
            log(f"memory {row.shape} {row.method} L={row.length} infer")
        m = measure_peak(_spec(row.shape, row.method, row.length, 1, "infer", threads, device, precision,
                               overrides))
        row.peak_mib, row.rss_mib = m["step_mib"], m["peak_mib"]
    base = next(r for r in rows if r.method == "none")
    for row in rows:  # a tiny model's step may stay within memory the process already had: no ratio then
        row.peak_ratio = row.peak_mib / base.peak_mib if base.peak_mib > 0 else None
        row.rss_ratio = row.rss_mib / base.rss_mib


if __name__ == "__main__":
    print(json.dumps(step_peak(json.loads(sys.argv[1]))))
