"""scripts/host_cost.py: the fused path's host time per layer, launches stubbed, against a trivial Function's
floor. Run as a user runs it (its own process: it stubs the kernel launches process-wide)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the fused path imports Triton (pip install triton)")

ROOT = Path(__file__).resolve().parents[1]


def test_it_prints_a_row_per_method_with_the_cost_above_the_floor():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "host_cost.py"), "--methods", "none,diet-abs",
                          "--cycles", "1", "--steps", "2"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if re.match(r"\| (none|diet-abs) \|", line)]
    assert len(rows) == 2
    for row in rows:
        cells = [float(x) for x in row.strip("|").split("|")[1:]]
        assert len(cells) == 6 and all(c > 0 for c in cells[:4])  # each call took some time
        # each cell is printed to 0.1: the four it is made of and itself differ from the exact by up to 0.05 each
        assert cells[4] == pytest.approx(cells[0] + cells[1] - cells[2] - cells[3], abs=0.25 + 1e-9)
        assert cells[5] > 20  # the fused path makes more Python calls than an empty Function
