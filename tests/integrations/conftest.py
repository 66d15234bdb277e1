import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared machine the threads' contention costs
    10× (the matrix: 3 s on one thread, 40 s on the default count at load 13 on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
