"""Hugging Face model classes, registered with the Auto classes under model_type "diet"."""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
)

from dietpe.config import DietConfig
from dietpe.models.modeling import (
    DietForMaskedLM,
    DietForQuestionAnswering,
    DietForSequenceClassification,
    DietModel,
    DietPreTrainedModel,
)
from dietpe.models.seq2seq import DietForConditionalGeneration, DietSeq2SeqConfig
from dietpe.models.causal import DietCausalConfig, DietCausalModel, DietForCausalLM

AutoConfig.register("diet", DietConfig, exist_ok=True)
AutoModel.register(DietConfig, DietModel, exist_ok=True)
AutoModelForMaskedLM.register(DietConfig, DietForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(DietConfig, DietForSequenceClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(DietConfig, DietForQuestionAnswering, exist_ok=True)
AutoConfig.register("diet-seq2seq", DietSeq2SeqConfig, exist_ok=True)
AutoModelForSeq2SeqLM.register(DietSeq2SeqConfig, DietForConditionalGeneration, exist_ok=True)
AutoConfig.register("diet-causal", DietCausalConfig, exist_ok=True)
AutoModel.register(DietCausalConfig, DietCausalModel, exist_ok=True)
AutoModelForCausalLM.register(DietCausalConfig, DietForCausalLM, exist_ok=True)

__all__ = ["DietModel", "DietPreTrainedModel", "DietForMaskedLM", "DietForSequenceClassification",
           "DietForQuestionAnswering", "DietForConditionalGeneration", "DietSeq2SeqConfig", "DietCausalConfig",
           "DietCausalModel", "DietForCausalLM"]
