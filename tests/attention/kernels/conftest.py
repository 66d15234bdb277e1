"""Kernel tests: on the GPU with DIET_TEST_DEVICE=cuda, otherwise on CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1, set by tests/conftest.py before triton is first imported)."""

from tests.conftest import TEST_DEVICE

#: for the test modules: pytest.importorskip("triton", reason=NO_TRITON)
NO_TRITON = "the fused kernels need Triton (pip install triton; torch's CUDA wheels ship it), not installed here"


def sizes(cpu: int, cuda: int) -> int:
    """A length small enough for the interpreter on the CPU, several real tiles long on a GPU."""
    return cuda if TEST_DEVICE == "cuda" else cpu
