"""Every kernel compiles for Hopper (sm_90) with Triton's own compiler, no GPU needed, with every term on, and
its first tile configuration fits Hopper's shared memory: what the interpreter cannot show (a GPU build refuses
a kernel reading a non-constexpr global, which the interpreter runs)."""

import os
import subprocess
import sys

import pytest

from tests.attention.kernels.conftest import NO_TRITON

pytest.importorskip("triton", reason=NO_TRITON)


def test_the_kernels_compile_for_hopper_within_its_shared_memory():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a compile, not the interpreter
    done = subprocess.run([sys.executable, "-m", "dietpe.attention.kernels.resources", "--check"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "resources: OK (sm_90)" in done.stdout
