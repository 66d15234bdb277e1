"""The study's plan and the numbers it reads from the registry, not from method names."""

import pytest

from dietpe.errors import ConfigError
from dietpe.methods import parse_method
from dietpe.positions.registry import REGISTRY
from dietpe.study import scheduler
from dietpe.study.results import position_place
from dietpe.tasks.recipes import build_config


def test_the_plan_is_seed_major_so_a_partial_report_compares_every_method():
    methods = [parse_method("absolute"), parse_method("diet-rel")]
    plan = scheduler.plan(methods, [3, 4])
    assert [(m.name, seed) for m, seed in plan] == [("absolute", 3), ("diet-rel", 3), ("absolute", 4),
                                                    ("diet-rel", 4)]


def test_jobs_side_by_side_are_refused_under_a_distributed_launch(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="--jobs > 1"):
        scheduler.job_count(2, 4, 1)
    assert scheduler.job_count(1, 4, 1) == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert scheduler.job_count(None, 1, 1) == 1  # never more workers than units


def test_where_position_enters_is_read_from_the_registry():
    places = {name: position_place(parse_method(name)) for name in REGISTRY}
    assert places["none"] == "none" and list(places.values()).count("none") == 1
    assert places["absolute"] == places["sinusoidal"] == "input"
    assert {places[n] for n in ("diet-abs", "diet-rel", "t5", "rotary", "alibi", "shaw")} == {"per-head"}


def test_the_position_rank_is_reported_for_the_low_rank_table_only():
    ranks = {name: scheduler.position_rank(build_config(parse_method(name), "study", 100, 32, 0))
             for name in REGISTRY}
    assert ranks.pop("diet-abs") == 8  # the study size's head size, DIET-ABS's default d_p
    assert set(ranks.values()) == {0}
    assert scheduler.position_rank(build_config(parse_method("diet-abs:position_rank=2"), "study", 100, 32, 0)) == 2


def test_a_killed_studys_workers_end_with_it(tmp_path):
    """kill -9 of the study's process leaves its pool's workers orphaned; they must not go on training into the
    folders a restarted study works in."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "worker.pid"
    script = f"""
import multiprocessing, os, time
from concurrent.futures import ProcessPoolExecutor
from dietpe.study.scheduler import die_with_parent

def work(path):
    open(path, "w").write(str(os.getpid()))
    time.sleep(120)

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        pool.submit(work, {str(pid_file)!r}).result()
"""
    (tmp_path / "study.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "study.py")], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        worker = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.kill(worker, signal.SIGKILL)
            raise AssertionError("the worker outlived the killed study by 30 s")
    finally:
        parent.kill()
