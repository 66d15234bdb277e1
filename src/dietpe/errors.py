"""Errors raised for the user's mistakes. Each message names the value, the limit or the allowed values."""


class DietError(ValueError):
    """Base class: a mistake in the user's configuration or data, reported without a traceback by the CLI."""


class ConfigError(DietError):
    """An invalid model or run configuration (unknown name, nonsensical combination)."""


class NotServed(ConfigError):
    """A backend cannot serve this call (its device, its inputs, its terms): `attn_backend="auto"` then runs
    the next backend that can; a backend asked for by name reports it."""


class InputError(DietError):
    """Model inputs outside what the configuration allows (token ids, lengths, segment ids)."""


class DataError(DietError):
    """A missing, empty or malformed data file; the message names the file and line."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (or its type's name): a library's reason, in one line."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def module_main(main, prog: str) -> int:
    """`main()` of a `python -m dietpe....` tool, as the `dietpe` command ends: a DietError or a missing file in one
    line on stderr and exit code 2, not a traceback."""
    import sys

    try:
        return int(main() or 0)
    except (DietError, FileNotFoundError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def may_read(tensor) -> bool:
    """Whether an InputError check may read `tensor`'s values (min/max of ids, `all()` of a mask). Reading
    copies a result to the host: free on the CPU, but on a GPU it stalls the queue, and a training step would
    pay it every time. So values are read on the CPU and at inference (no gradient); in a GPU training step the
    inputs come from the command's own collators, already in range. Never while compiling (a graph break), nor
    while a CUDA graph is captured (a copy to the host is not allowed there)."""
    import torch

    if torch.compiler.is_compiling():
        return False
    kind = tensor.device.type
    if kind == "cpu":
        return True
    if kind == "meta" or torch.is_grad_enabled():
        return False
    return not (kind == "cuda" and torch.cuda.is_current_stream_capturing())


def value_range(tensor) -> tuple[int, int]:
    """(min, max) of an integer tensor, read in one copy to the host (one sync on a GPU, not two)."""
    import torch

    lo, hi = torch.aminmax(tensor)
    lo, hi = torch.stack((lo, hi)).tolist()
    return int(lo), int(hi)
