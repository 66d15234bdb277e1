"""The GPU checklist's structure, checked without a GPU: it fits one GPU window, every step is bounded, at most 8
files come back, and a step past its limit is killed with a summary line saying so."""

import sys

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def checklist():
    return load_script("scripts/gpu_checklist.py", "gpu_checklist")


def test_the_plan_fits_one_window_and_eight_files(checklist):
    plan = checklist.default_plan()
    assert checklist.budget(plan) <= 9 * 60
    assert len(checklist.outputs(plan)) <= checklist.MAX_FILES
    assert {s.phase for s in plan} == {"check", "time"}
    assert all(0 < s.limit_s <= 300 for s in plan)
    checks = [s.output for s in plan if s.phase == "check"]
    assert len(checks) == len(set(checks)), "checks run side by side: one file each"


def test_the_plan_holds_what_the_window_must_show(checklist):
    plan = checklist.default_plan()
    commands = " ".join(c for s in plan for c in s.commands)
    for needed in ("dietpe.bench.attach", "8x2048", " compare ", "--deterministic", "selftest", "gpu_flex.py",
                   "gpu_commands.sh", "DIET_TEST_DEVICE", "native,fire,"):  # FIRE attached to a Llama
        assert needed in commands or any(needed in str(s.env) for s in plan), needed
    assert "study_time" in " ".join(c for s in checklist.steps() for c in s.commands)  # by name


def test_a_step_past_its_limit_is_killed_and_summarised(checklist, tmp_path, monkeypatch):
    slow = checklist.Step("slow", "check", 1, "slow.txt",
                          (f"{sys.executable} -c \"print('started', flush=True); import time; time.sleep(30)\"",),
                          "true")
    rc, seconds, line = checklist._run_step(slow, tmp_path, tmp_path, dry=False)
    assert rc == 124 and seconds < 10 and "time limit" in line
    assert "started" in (tmp_path / "slow.txt").read_text()


def test_a_summary_line_is_the_steps_own(checklist, tmp_path):
    step = checklist.Step("say", "check", 30, "say.txt",
                          (f"{sys.executable} -c \"print('SUMMARY: 3 of 3 equal'); print('done')\"",), "true")
    assert checklist._run_step(step, tmp_path, tmp_path, dry=False) == (0, pytest.approx(0, abs=30),
                                                                       "3 of 3 equal")


def test_without_cuda_the_gpu_steps_dry_run(checklist, tmp_path, monkeypatch):
    """On the CPU every GPU step's entry point must start (its --help), which catches a renamed module."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the dry run is the CPU's check")
    names = [s.name for s in checklist.steps() if not s.cpu_commands]
    assert checklist.run(tmp_path / "out", names, dry=False) == 0, (tmp_path / "out" / "summary.txt").read_text()
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert all(f"{n} (dry run) rc=0" in summary for n in names), summary
