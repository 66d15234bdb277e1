"""The GPU checklist of docs/gpu.md in one command, sized for one GPU window (about 15 minutes of device time
with the machine's start, at most 10 minutes a command).

    python scripts/gpu_checklist.py OUT                      every step, at most 9 minutes on one GPU
    python scripts/gpu_checklist.py OUT --steps tests,flex   some steps
    python scripts/gpu_checklist.py OUT --dry-run            the plan, and a check that every step's entry starts

Every step has its own time limit (killed with its process group past it) and one summary line in
OUT/summary.txt. Correctness steps run side by side (they share the GPU; their figures are values, not times);
timing steps run afterwards, one at a time, with nothing else on the GPU. At most 8 files are written under OUT
(`summary.txt` and one file per output below); working files (runs, checkpoints, data) go to a temporary folder
and are deleted. Without CUDA the CPU steps run and the GPU steps are dry-run (their entry points start and
print their help), so the structure is checked on any machine.

The budget: the longest correctness step plus the sum of the timing steps, at most `BUDGET_S` seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 9 * 60
MAX_FILES = 8
PY = sys.executable


@dataclass(frozen=True)
class Step:
    """One step: shell commands run in order within `limit_s` seconds, their output in OUT/<output>.

    phase "check" runs side by side with the other checks, "time" alone afterwards. `probe` is a command that only has to start (exit 0) in a dry run: the step's entry point."""

    name: str
    phase: str
    limit_s: int
    output: str
    commands: tuple[str, ...]
    probe: str
    env: dict = field(default_factory=dict)
    #: what the step runs on a machine without CUDA instead of a dry run (the GPU paths as the CPU and the
    #: `meta` device see them)
    cpu_commands: tuple[str, ...] = ()
    #: in the plan run without --steps (a step left out runs when named)
    default: bool = True


def _dietpe(args: str) -> str:
    return f"{PY} -m dietpe.cli {args}"


# on the GPU: the backends, the references, host conversions, the fused kernel's operators, then full-graph
# compile and flex (passed on an H200 in 270 s beside two other checks, where the rest was not reached: last);
# not the kernel's own tests: the kernels step's selftest checks every method it serves in the models, at GPU
# sizes; `DIET_TEST_DEVICE=cuda pytest tests/attention/kernels` runs them, a few minutes of compiling
CUDA_TESTS = ("tests/attention/test_backends.py tests/positions/test_references.py tests/analysis/test_off_host.py "
              "tests/attention/kernels/test_op.py tests/models/test_compile.py tests/attention/test_flex.py")
# without a GPU: the GPU paths as the CPU and the `meta` device see them
CPU_TESTS = "tests/attention/test_gpu_paths.py tests/bench/test_cost.py"
PRE = "--recipe cpu --steps 100 --batch-size 64 --device-batch-size 64 --threads 4"


def steps() -> list[Step]:
    """The checklist. Paths under {work} are the step's working files, {out} the outputs that come back."""
    return [
        Step("tests", "check", 270, "tests.txt",
             (f"{PY} -m pytest -q -p no:cacheprovider -o console_output_style=classic -rfE {CUDA_TESTS}",),
             f"{PY} -m pytest --version", env={"DIET_TEST_DEVICE": "cuda", "DIETPE_FUSED_AUTOTUNE": "0"},
             cpu_commands=(f"{PY} -m pytest -q -p no:cacheprovider {CPU_TESTS}",)),
        # a step each: the selftest took over 215 s on an H100 beside another job
        Step("kernels", "check", 270, "kernels.txt", (f"{PY} -m dietpe.attention.kernels.selftest",),
             f"{PY} -m dietpe.attention.kernels.selftest --help"),
        Step("flex", "check", 270, "flex.txt", (f"{PY} scripts/gpu_flex.py",), f"{PY} scripts/gpu_flex.py --help"),
        Step("compare", "check", 270, "compare.txt",
             (_dietpe("compare -o {work}/compare --methods none,absolute,diet-rel,diet-abs,t5 --pretrain-seeds 2 "
                      "--steps 150 --builtin-size 300 --epochs 2 --device cuda --precision bf16 --jobs 4"),
              "cat {work}/compare/report.md"),
             _dietpe("compare --help")),
        Step("commands", "check", 270, "commands.txt",
             # every command but bench (a step of its own); bf16 pre-training is the compare step's
             ("bash scripts/gpu_commands.sh {work}/commands cuda pretrain analyze finetune lm lengths translate_train "
              "translate_eval; rc=$?; cat {work}/commands/commands.log; exit $rc",
              f"{PY} -c \"from dietpe.data.synthetic import write_builtin; write_builtin('{{work}}/data', seed=0)\"",
              _dietpe(f"pretrain {{work}}/data/corpus --method t5 --device cuda --deterministic {PRE} -o {{work}}/det_a"),
              _dietpe(f"pretrain {{work}}/data/corpus --method t5 --device cuda --deterministic {PRE} -o {{work}}/det_b"),
              f"{PY} {ROOT}/scripts/gpu_checklist.py --compare-runs {{work}}"),
             "bash -n scripts/gpu_commands.sh"),
        # stopped 10 s before its limit so that the phases it finished (train, infer) still come back
        Step("bench", "time", 150, "bench.md",
             ("timeout -s INT 140 " + _dietpe(
                 "bench --device cuda --precision bf16 --shapes bert-base --lengths 512 --batch 8 "
                 # the fourth window's set, for a before and after (16 candidates outlasted 140 s there, compiling
                 # and tuning their kernels); none@fused first: the kernel's own cost against flash
                 "--methods none@fused,diet-rel,diet-rel+seg,t5 "
                 "--backends fused --repeats 6 --warmup 3 --no-memory --markdown {work}/bench.md")
              + "; rc=$?; [ $rc = 0 ] || cat {work}/bench.md; exit $rc",),
             _dietpe("bench --help")),
        # inference alone, for the methods whose per-forward objects are kept between inference forwards
        # (`PositionMethod.kept_forward`), DIET-ABS among them: run by name
        Step("infer", "time", 120, "infer.md",
             ("timeout -s INT 110 " + _dietpe(
                 "bench --device cuda --precision bf16 --shapes bert-base --lengths 512 --batch 8 "
                 "--methods none@fused,diet-rel,diet-abs,t5,alibi,kerple --backends fused --modes infer "
                 "--repeats 6 --warmup 3 --no-memory --markdown {work}/infer.md")
              + "; rc=$?; [ $rc = 0 ] || cat {work}/infer.md; exit $rc",),
             _dietpe("bench --help"), default=False),
        # the methods of the kernel's targets never timed with their current paths (TUPE's reset as a table,
        # FIRE's piecewise table, rotary's kernel on the fused kernel and, as `auto` runs it, beside flash):
        # training and inference, run by name
        Step("others", "time", 180, "others.md",
             ("timeout -s INT 170 " + _dietpe(
                 "bench --device cuda --precision bf16 --shapes bert-base --lengths 512 --batch 8 "
                 "--methods none@fused,tupe-a,tupe-r,fire,rotary,rotary@auto --backends fused --modes train,infer "
                 "--repeats 6 --warmup 3 --no-memory --markdown {work}/others.md")
              + "; rc=$?; [ $rc = 0 ] || cat {work}/others.md; exit $rc",),
             _dietpe("bench --help"), default=False),
        # the same step compiled whole, CUDA graphs (inductor's reduce-overhead): what is left without the host's
        # Python, as DIET's Table 1 was timed (XLA on TPUs). Training only (inference was measured in the H200's
        # fourth window, where compiling 4 candidates for both modes outlasted 230 s): run by name, alone
        Step("compiled", "time", 400, "compiled.md",
             ("timeout -s INT 390 " + _dietpe(
                 "bench --device cuda --precision bf16 --shapes bert-base --lengths 512 --batch 8 "
                 "--methods none@fused,diet-rel --backends fused --compile reduce-overhead "
                 "--modes train --repeats 6 --warmup 3 --no-memory --markdown {work}/compiled.md")
              + "; rc=$?; [ $rc = 0 ] || cat {work}/compiled.md; exit $rc",),
             _dietpe("bench --help"), default=False),
        # measured once (docs/measured/h200_study_time.json): run by name, for another GPU
        Step("study_time", "time", 50, "study_time.txt",
             (f"{PY} -m dietpe.bench.study_time --plan gpu-hour --device cuda --precision bf16",),
             f"{PY} -m dietpe.bench.study_time --help", default=False),
        # where a step's time goes (host, kernels by kind, each kernel alone): run by name
        # inference on the GPU alone (a CUDA graph's replay), then the operator alone; the training step's
        # profile (`gpu_profile.py` without --no-steps) is the bench step's ratio taken apart
        Step("profile", "time", 180, "profile.md",
             (f"{PY} scripts/gpu_profile.py - --no-steps --graphs none,none@fused,diet-rel@fused,"
              "diet-rel+seg@fused,diet-abs@fused,t5@fused,alibi@fused,diet-rel@sdpa,diet-rel+seg@sdpa,t5@sdpa "
              "--ops",),
             f"{PY} scripts/gpu_profile.py --help", default=False),
        # each kernel at every tile of its list and of a wider sweep (`gpu_profile.py --tiles`), bert-base's
        # attention at 512 and 2,048 tokens, without a term and with an offset table: whether another tile serves
        # the forward (the kernel's gap to flash at inference) or the backward better; the rows print as each
        # kernel is tuned, so a stopped step keeps what it finished; run by name
        Step("tiles", "time", 240, "tiles.md", (f"{PY} scripts/gpu_profile.py - --no-steps --tiles",),
             f"{PY} scripts/gpu_profile.py --help", default=False),
        # peak memory and time at 8,192 tokens (one fresh process per memory row) on the kernel, beside the
        # meta device's model (`dietpe.bench.footprint`, docs/kernels.md): whether the model's ratios hold on a
        # GPU; run by name. Not sdpa's rows: its blocks kept for the backward, (L, L) a layer, ran the H200 out of
        # its 139 GiB with the other candidates' models in the same timing process (fifth window)
        Step("memory", "time", 240, "memory.md",
             ("timeout -s INT 220 " + _dietpe(
                 "bench --device cuda --precision bf16 --shapes lm-bert-base --lengths 8192 --batch 2 "
                 "--methods none@fused,diet-abs,diet-rel,t5 --backends fused --modes train --repeats 2 "
                 "--warmup 1 --markdown {work}/memory.md") + "; cat {work}/memory.md",
              f"{PY} -m dietpe.bench.footprint --methods none,diet-rel,t5,alibi,diet-abs"),
             f"{PY} -m dietpe.bench.footprint --help", default=False),
        Step("attach", "time", 120, "attach.md",
             # the methods not yet measured attached first (the budget may end before the last)
             (f"{PY} -m dietpe.bench.attach --device cuda --dtype bfloat16 --shapes 8x2048 --budget 100 "
              "--methods native,fire,diet-abs,diet-rel,rotary,none,t5,alibi,kerple",),
             f"{PY} -m dietpe.bench.attach --help"),
    ]


def default_plan() -> list[Step]:
    """The steps run when none are named."""
    return [s for s in steps() if s.default]


def budget(chosen: list[Step]) -> int:
    """Seconds the plan may take: the longest check (they run side by side) plus every timing step."""
    checks = [s.limit_s for s in chosen if s.phase == "check"]
    return max(checks, default=0) + sum(s.limit_s for s in chosen if s.phase == "time")


def outputs(chosen: list[Step]) -> list[str]:
    return ["summary.txt", *dict.fromkeys(s.output for s in chosen)]


def _run_step(step: Step, out: Path, work: Path, dry: bool, cuda: bool = True) -> tuple[int, float, str]:
    """Run one step (without CUDA: its CPU commands, else its probe); its output goes to OUT/<output>.
    Returns (exit status, seconds, one-line result). 124: killed at its limit."""
    log = out / step.output
    env = {**os.environ, **(step.env if cuda else {}), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH")]))
    commands = step.commands if cuda and not dry else step.cpu_commands if not cuda and not dry and \
        step.cpu_commands else (step.probe,)
    start, rc, last = time.monotonic(), 0, ""
    deadline = start + step.limit_s
    with open(log, "a") as f:
        for command in commands:
            command = command.format(work=work / step.name, out=out)
            (work / step.name).mkdir(parents=True, exist_ok=True)
            f.write(f"$ {command}\n")
            f.flush()
            left = deadline - time.monotonic()
            if left <= 0:
                rc, last = 124, f"time limit {step.limit_s}s reached before: {command[:80]}"
                break
            proc = subprocess.Popen(command, shell=True, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc, last = 124, f"killed at its time limit of {step.limit_s}s in: {command[:80]}"
                break
            if rc != 0:
                break
    seconds = time.monotonic() - start
    if not last:
        last = _last_line(log)
    return rc, seconds, last


def _last_line(log: Path) -> str:
    """The step's result line: its last `SUMMARY:` line, else its last non-empty line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    marked = [line[len("SUMMARY:"):].strip() for line in lines if line.startswith("SUMMARY:")]
    return (marked[-1] if marked else lines[-1] if lines else "")[:200]


def _environment() -> str:
    import torch
    lines = [f"python {platform.python_version()} torch {torch.__version__} cuda {torch.version.cuda}"]
    try:
        import transformers
        import triton
        lines.append(f"transformers {transformers.__version__} triton {triton.__version__}")
    except ImportError as e:
        lines.append(f"missing: {e.name}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        lines.append(f"device {p.name} {p.total_memory / 2**30:.1f} GiB capability {p.major}.{p.minor}")
    else:
        lines.append("device: no CUDA (GPU steps dry-run)")
    return "\n".join(lines)


def run(out: Path, names: list[str] | None, dry: bool) -> int:
    import torch
    chosen = [s for s in steps() if s.name in names] if names is not None else default_plan()
    unknown = set(names or ()) - {s.name for s in steps()}
    if unknown:
        raise SystemExit(f"gpu_checklist: unknown step(s) {sorted(unknown)}; allowed: "
                         f"{', '.join(s.name for s in steps())}")
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    summary = out / "summary.txt"
    summary.write_text(_environment() + f"\nplan: {len(chosen)} steps, at most {budget(chosen)} s\n")
    work = Path(tempfile.mkdtemp(prefix="gpu-checklist-"))
    _command_on_path(work / "bin")
    results: dict[str, tuple[int, float, str, bool]] = {}

    def one(step: Step):
        step_dry = dry or (not cuda and not step.cpu_commands)
        rc, seconds, line = _run_step(step, out, work, dry, cuda)
        results[step.name] = (rc, seconds, line, step_dry)
        with open(summary, "a") as f:
            f.write(f"{step.name}{' (dry run)' if step_dry else ''} rc={rc} {seconds:.0f}s/{step.limit_s}s: {line}\n")
        print(f"[gpu_checklist] {step.name} rc={rc} {seconds:.0f}s: {line}", file=sys.stderr, flush=True)

    checks = [s for s in chosen if s.phase == "check"]
    with ThreadPoolExecutor(max_workers=max(1, len(checks))) as pool:
        list(pool.map(one, checks))
    for step in chosen:
        if step.phase == "time":
            one(step)
    shutil.rmtree(work, ignore_errors=True)
    print(summary.read_text())
    return 0 if all(r[0] == 0 for r in results.values()) else 1


def _command_on_path(folder: Path) -> None:
    """A `dietpe` command for the steps' scripts where the package is not installed (a checkout on a GPU
    machine, run with PYTHONPATH=src)."""
    if shutil.which("dietpe"):
        return
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "dietpe"
    shim.write_text(f'#!/bin/sh\nexec "{PY}" -m dietpe.cli "$@"\n')
    shim.chmod(0o755)
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ['PATH']}"


def compare_runs(work: Path) -> None:
    """The commands step's last command: the bf16 run's loss, and whether the two deterministic runs ended with
    the same weights."""
    import json

    from safetensors.torch import load_file
    root = work
    loss = {r: json.loads((root / r / "pretrain_results.json").read_text())["val_loss"] for r in
            ("bf16", "det_a", "det_b")}
    wa, wb = (load_file(root / r / "model" / "model.safetensors") for r in ("det_a", "det_b"))
    same = wa.keys() == wb.keys() and all((wa[k] == wb[k]).all().item() for k in wa)
    print(f"SUMMARY: val loss diet-rel+seg bf16 {loss['bf16']:.4f}; deterministic t5 twice: "
          f"{loss['det_a']!r} vs {loss['det_b']!r}, weights identical: {same}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, help="where the outputs go (at most 8 files)")
    parser.add_argument("--steps", help=f"comma-separated steps (default: all: "
                                        f"{','.join(s.name for s in steps())})")
    parser.add_argument("--dry-run", action="store_true", help="start each step's entry point only")
    parser.add_argument("--compare-runs", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compare_runs:
        compare_runs(args.compare_runs)
        return 0
    if args.out is None:
        parser.error("give OUT, the folder for the outputs")
    names = args.steps.split(",") if args.steps else None
    return run(args.out, names, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
