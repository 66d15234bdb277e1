"""One process per rank writes into an output folder: a second command there, or a worker a killed torchrun
left running, is refused in one line; the lock dies with its process, and a forked child does not keep it."""

import subprocess
import sys
import textwrap

import pytest

from dietpe.errors import ConfigError
from dietpe.validate import run_lock

HOLD = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from dietpe.validate import run_lock
    with run_lock(Path(sys.argv[1])):
        if sys.argv[2] == "fork" and os.fork() == 0:  # a child that outlives the holder
            time.sleep(20)
            os._exit(0)
        print("held", flush=True)
        if sys.argv[2] == "fork":
            os._exit(0)
        time.sleep(60)
""")


def hold(folder, how="sleep", rank="0"):
    import os

    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), how], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "RANK": rank})
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_folder_held_by_another_process_is_refused_naming_it_until_that_process_dies(tmp_path):
    holder = hold(tmp_path / "run")
    try:
        with pytest.raises(ConfigError, match=f"another dietpe process \\(pid {holder.pid}\\) is running"):
            with run_lock(tmp_path / "run"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with run_lock(tmp_path / "run"):  # released by the kernel with its holder, kill -9 included
        with run_lock(tmp_path / "run"):  # and held once per process, however nested
            pass


def test_each_rank_holds_its_own_lock_and_a_forked_child_holds_none(tmp_path):
    holder = hold(tmp_path / "ranks", rank="1")
    try:
        with run_lock(tmp_path / "ranks"):  # rank 0 here
            pass
    finally:
        holder.kill()
        holder.wait()
    holder = hold(tmp_path / "forked", how="fork")
    holder.wait()  # exited; its forked child still sleeps
    with run_lock(tmp_path / "forked"):
        pass


def test_a_command_in_a_held_folder_is_refused_in_one_line_before_any_work(tmp_path, capsys):
    from dietpe.cli import main

    holder = hold(tmp_path / "lm")
    try:
        rc = main(["lm", str(tmp_path / "nope.txt"), "--methods", "alibi", "-o", str(tmp_path / "lm")])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"pid {holder.pid}" in err, err
