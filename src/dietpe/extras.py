"""Optional dependencies: the model library needs torch, transformers, safetensors and tokenizers; the study,
translation, plots and data tools need more, installed as extras (`pip install 'dietpe[study]'`). A missing one
is reported in one line naming the extra, not as a bare ModuleNotFoundError deep in a traceback."""

from __future__ import annotations

import importlib

from dietpe.errors import DietError

# top-level module -> the extra that installs it (pyproject.toml's [project.optional-dependencies])
EXTRAS = {"matplotlib": "study", "scipy": "study", "accelerate": "study", "tensorboard": "study", "psutil": "study",
          "sacrebleu": "translate", "datasets": "data", "x_transformers": "bench"}
# the extras 'dietpe[all]' installs (not 'bench': peer libraries for comparison only)
ALL = ("study", "translate", "data")


class MissingExtra(DietError, ModuleNotFoundError):
    """An optional dependency is not installed; the message says which extra installs it."""


def message(module: str, extra: str | None = None) -> str:
    """`extra`: the one the command asking belongs to, where several install the module (accelerate)."""
    extra = extra or EXTRAS.get(module.split(".")[0], "all")
    also = " (or 'dietpe[all]')" if extra in ALL else ""
    return f"this needs the '{module.split('.')[0]}' package: pip install 'dietpe[{extra}]'{also}"


def need(module: str, extra: str | None = None):
    """Import `module`, or raise MissingExtra naming the extra that installs it (`extra`: the command's own,
    where several do)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != module.split(".")[0]:
            raise
        error = MissingExtra(message(module, extra))
        error.name = e.name
        raise error from None


def missing(e: BaseException) -> str | None:
    """The one-line message for an ImportError caused by a missing extra (also transformers' own, such as
    the Trainer's 'requires accelerate'), else None."""
    if isinstance(e, MissingExtra):
        return str(e)
    if isinstance(e, ModuleNotFoundError) and e.name and e.name.split(".")[0] in EXTRAS:
        return message(e.name)
    if isinstance(e, ImportError):
        for module in EXTRAS:
            if module in str(e):
                return message(module)
    return None
