"""diet: where and how position enters a Transformer.

DIET (Chen et al. 2021), TUPE (Ke et al. 2021), Shaw et al. (2018), Transformer-XL/XLNet, T5, rotary and ALiBi
behind one attention equation, as Hugging Face models. See `dietpe.positions.terms` for the four entry points.
"""

from dietpe.errors import ConfigError, DataError, DietError, InputError

__version__ = "0.1.0"

# `import dietpe` registers the models with transformers' Auto classes. The `dietpe` command imports them only
# for the command it runs, so its --help stays light (torch and transformers take seconds to import).
_LAZY = {"DietConfig": "dietpe.config", "PRESETS": "dietpe.config", **{name: "dietpe.models" for name in (
    "DietCausalConfig", "DietCausalModel", "DietForCausalLM", "DietForConditionalGeneration", "DietForMaskedLM",
    "DietForQuestionAnswering", "DietForSequenceClassification", "DietModel", "DietPreTrainedModel",
    "DietSeq2SeqConfig")}, "attach": "dietpe.integrations", "Positions": "dietpe.integrations"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        importlib.import_module("dietpe.models")  # registers with the Auto classes
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dietpe' has no attribute {name!r}")


__all__ = ["DietConfig", "PRESETS", "DietModel", "DietPreTrainedModel", "DietForMaskedLM",
           "DietForSequenceClassification", "DietForQuestionAnswering", "DietForConditionalGeneration",
           "DietSeq2SeqConfig", "DietCausalConfig", "DietCausalModel", "DietForCausalLM", "DietError", "ConfigError",
           "InputError", "DataError", "attach", "Positions"]


def _is_command() -> bool:
    import os
    import sys

    return os.path.basename(sys.argv[0] if sys.argv else "") in ("dietpe", "dietpe.exe", "dietpe-script.py")


if not _is_command():
    import dietpe.models  # noqa: E402,F401  registers with the Auto classes
    from dietpe.integrations import Positions, attach  # noqa: E402,F401
