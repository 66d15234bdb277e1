import os

# Off the GPU the Triton kernels (tests/attention/kernels) run on CPU tensors under Triton's interpreter, which
# must be switched on before triton is first imported (torch imports it): so here, before torch. Nothing else
# reads it: "auto" never picks the fused kernel off CUDA.
if os.environ.get("DIET_TEST_DEVICE", "cpu") != "cuda":
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist's workers share the cores: each takes its share of intra-op threads, where torch's default (one
# per core in every worker) oversubscribes them and tiny models only contend (the integration, model and
# attention tests: 186 s on 2 cores in two workers of 2 threads, 140 s with 1 each). A count the user set stays.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = None
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(THREADS)  # before torch; subprocesses inherit it

import pytest  # noqa: E402
import torch  # noqa: E402

if THREADS is not None:
    torch.set_num_threads(THREADS)  # in case torch was imported before this file

from dietpe import DietConfig
from dietpe.positions.registry import FIELDS, REGISTRY

# DIET_TEST_DEVICE=cuda runs the backend, reference, flex, compile and pipeline tests on the GPU (the `device`
# fixture); by default they run on the CPU. `probe_device` is where the tests that only look at what reaches
# the kernels (widths, devices, host syncs) run: the GPU when asked for, else `meta`, which takes the same
# non-CPU branches without computing anything.
TEST_DEVICE = os.environ.get("DIET_TEST_DEVICE", "cpu")
TEST_DEVICES = ("cpu", "cuda")


def pytest_configure(config):
    if TEST_DEVICE not in TEST_DEVICES:
        raise pytest.UsageError(f"DIET_TEST_DEVICE={TEST_DEVICE!r}: allowed values are {', '.join(TEST_DEVICES)}")
    if TEST_DEVICE == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"DIET_TEST_DEVICE=cuda: CUDA is not available on this machine (torch "
                                f"{torch.__version__}); unset DIET_TEST_DEVICE to test on the CPU")
    _check_interpreter()


def _check_interpreter():
    """Triton's interpreter before 3.7 turns a loop bound into an int with int() of a 1-element array, which
    NumPy 2.4 refuses: every kernel test would fail inside triton. Said once, with the fix."""
    from importlib.metadata import PackageNotFoundError, version

    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        triton_version = version("triton")
    except PackageNotFoundError:
        return
    numpy_version = version("numpy")
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        raise pytest.UsageError(f"Triton {triton_version}'s interpreter (the kernel tests on the CPU) needs "
                                f"numpy<2.4, found numpy {numpy_version}: pip install 'numpy<2.4' (or triton>=3.7)")


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("+")[0].split(".")[:2])


@pytest.fixture
def device() -> torch.device:
    return torch.device(TEST_DEVICE)


@pytest.fixture
def probe_device() -> torch.device:
    return torch.device("cuda" if TEST_DEVICE == "cuda" else "meta")


def head_size_for(device: torch.device) -> int:
    """Head size of the tiny configs: 8 on the CPU, 16 on a GPU (FlexAttention's smallest there)."""
    return 16 if torch.device(device).type == "cuda" else 8


@pytest.fixture(autouse=True, scope="session")
def _cache_home(tmp_path_factory):
    """Prepared corpora go to a temporary cache, never the user's ~/.cache/dietpe."""
    import os
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


#: small sizes for the methods' tables; `method_fields` keeps those the method reads
SMALL_FIELDS = dict(shaw_max_distance=3, t5_num_buckets=8, t5_max_distance=16)


def method_fields(position: str, **fields) -> dict:
    """`SMALL_FIELDS` updated by `fields`, less the method fields `position` does not read (DietConfig
    refuses a non-default value there)."""
    return {k: v for k, v in {**SMALL_FIELDS, **fields}.items() if k not in FIELDS or REGISTRY[position].uses(k)}


def tiny(head_size: int = 8, **overrides) -> DietConfig:
    """A deterministic tiny config: 2 layers, 2 heads of size 8 (or `head_size`), no dropout."""
    base = dict(vocab_size=50, hidden_size=2 * head_size, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                linformer_k=6, **method_fields(overrides.get("position", "absolute")))
    return DietConfig(**{**base, **overrides})


def batch(length=10, batch_size=2, vocab=50, pad_last=3, two_segments=True, device=None):
    ids = torch.randint(1, vocab, (batch_size, length))
    mask = torch.ones_like(ids)
    if pad_last:
        mask[-1, -pad_last:] = 0
    segments = torch.zeros_like(ids)
    if two_segments:
        segments[:, length // 2:] = 1
    if device is not None:  # drawn on the CPU: the same batch on every device
        return ids.to(device), mask.to(device), segments.to(device)
    return ids, mask, segments


def run_on(device, model, *args, **kwargs):
    """`model(*args, **kwargs)` run on `device` (a copy of the model, inputs moved there), outputs back on the
    CPU: the CPU-side references then check what the device computed."""
    if torch.device(device).type == "cpu":
        return model(*args, **kwargs)
    import copy

    def there(x):
        return x.to(device) if isinstance(x, torch.Tensor) else x

    def back(x):
        if isinstance(x, torch.Tensor):
            return x.cpu()
        return tuple(back(t) for t in x) if isinstance(x, tuple) else x

    out = copy.deepcopy(model).to(device)(*[there(a) for a in args], **{k: there(v) for k, v in kwargs.items()})
    return type(out)(**{k: back(v) for k, v in out.items()})


class OffHost(torch.Tensor):
    """A CPU tensor that behaves, for host conversions, like one in GPU memory: `.numpy()` and NumPy's own
    conversions (np.asarray, matplotlib) refuse it, as they refuse a CUDA tensor, until `.cpu()` or
    `.to("cpu")` brings it back as a plain tensor; every other op on it gives an OffHost. `.item()`,
    `.tolist()` and `float()` work, as they do on a GPU."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.numpy, torch.Tensor.__array__):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                            "tensor to host memory first.")
        to_cpu = func is torch.Tensor.cpu or (
            func is torch.Tensor.to and getattr(torch._C._nn._parse_to(*args[1:], **kwargs)[0], "type", None) == "cpu")
        out = super().__torch_function__(func, types, args, kwargs)
        return out.as_subclass(torch.Tensor) if to_cpu and isinstance(out, torch.Tensor) else out


def off_host(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every parameter and buffer an `OffHost` tensor: what it computes stays 'on the device'."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(p.detach().as_subclass(OffHost), p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = b.as_subclass(OffHost)
    return model


def load_script(path: str, name: str):
    """A script under the repository (not a package) imported as module `name`, for its tests."""
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
