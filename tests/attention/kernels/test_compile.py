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


READS = """
from dietpe.attention.kernels import attention as A
from dietpe.attention.kernels.resources import EVERY_TERM, compile_for
flags = dict(EVERY_TERM, HAS_KEEP=False, NSEG=0, MASK_KIND=0, PREC="tf32", D1=64, D2=0, DVP=64, EVEN_M=True,
             EVEN_N=True, EVEN_D=True)
for kernel, (bm, bn, warps, stages) in ((A._forward_kernel, A.FORWARD_CONFIGS[2][64][0]),
                                        (A._backward_kv_kernel, A.BACKWARD_KV_CONFIGS[2][64][0])):
    for read in ("score", "window"):
        r = compile_for(kernel, "bf16", dict(flags, BM=bm, BN=bn, HAS_TAB=A.TABLE_READS[read]), warps, stages,
                        count=True)
        print(kernel.__name__, read, bm * bn, r["shared"], r["global loads"])
"""


def test_the_table_read_by_window_stages_no_tile_of_it():
    """Read per score, the table's (BM, BN) values are copied into shared memory tile by tile (Triton's pipeliner
    stages every load of the loop); read by window, one vector per tile: less shared memory by at least a tile
    of float32, and fewer global loads in the code (DIET-REL's terms in bf16 with dropout, compiled for sm_90)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", READS], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    by = {(name, read): (int(tile), int(shared), int(loads)) for name, read, tile, shared, loads in rows}
    for name in ("_forward_kernel", "_backward_kv_kernel"):
        tile, shared, loads = by[name, "score"]
        _, shared_w, loads_w = by[name, "window"]
        assert shared_w <= shared - 4 * tile, (name, shared, shared_w)
        assert loads_w < loads, (name, loads, loads_w)
