"""diet: where and how position enters a Transformer.

DIET (Chen et al. 2021), TUPE (Ke et al. 2021), Shaw et al. (2018), Transformer-XL/XLNet, T5, rotary and ALiBi
behind one attention equation, as Hugging Face models. See `dietpe.positions.base` for the four entry points.
"""

from dietpe.config import PRESETS, DietConfig
from dietpe.errors import ConfigError, DataError, DietError, InputError
from dietpe.integrations import Positions, attach
from dietpe.models import (
    DietCausalConfig,
    DietCausalModel,
    DietForCausalLM,
    DietForConditionalGeneration,
    DietForMaskedLM,
    DietForQuestionAnswering,
    DietForSequenceClassification,
    DietModel,
    DietPreTrainedModel,
    DietSeq2SeqConfig,
)

__version__ = "0.1.0"

__all__ = ["DietConfig", "PRESETS", "DietModel", "DietPreTrainedModel", "DietForMaskedLM",
           "DietForSequenceClassification", "DietForQuestionAnswering", "DietForConditionalGeneration",
           "DietSeq2SeqConfig", "DietCausalConfig", "DietCausalModel", "DietForCausalLM", "DietError", "ConfigError",
           "InputError", "DataError", "attach", "Positions"]
