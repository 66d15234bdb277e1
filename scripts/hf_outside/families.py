"""Thin model testers that run transformers' own common model tests (`ModelTesterMixin`, from the
`tests/test_modeling_common.py` that transformers' source distribution ships) on Llama, GPT-2 and Qwen2, plain
or with a diet method attached right after each model is built.

This file is copied by `scripts/hf_outside/check.py` into a package beside transformers' common tests (it
imports them relatively). transformers' per-model test files live only in its repository, so the testers here
are diet's own: each gives the mixin a tiny config and the inputs every common test takes.

`DIETPE_OUTSIDE` selects the run: unset or `plain` (transformers alone, dietpe not imported), `import` (dietpe
imported, nothing attached), `own` (each family's own scheme: `rotary` for Llama and Qwen2, `absolute` for
GPT-2) or a method spec (`diet-rel`). The
hook wraps each tested class's `__init__`: the finished model gets `dietpe.attach(model, spec)`, as a user
attaching right after `from_config` or `from_pretrained` would.
"""

from __future__ import annotations

import functools
import os
import unittest

import torch

from transformers import (GPT2Config, GPT2DoubleHeadsModel, GPT2ForQuestionAnswering,
                          GPT2ForSequenceClassification, GPT2ForTokenClassification, GPT2LMHeadModel, GPT2Model,
                          LlamaConfig, LlamaForCausalLM, LlamaForQuestionAnswering, LlamaForSequenceClassification,
                          LlamaForTokenClassification, LlamaModel, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2ForQuestionAnswering, Qwen2ForSequenceClassification, Qwen2ForTokenClassification,
                          Qwen2Model)

from .test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask

#: each family's own position scheme: attaching it should change nothing transformers' tests can see
OWN = {"llama": "rotary", "qwen2": "rotary", "gpt2": "absolute"}

LLAMA_CLASSES = (LlamaModel, LlamaForCausalLM, LlamaForSequenceClassification, LlamaForQuestionAnswering,
                 LlamaForTokenClassification)
GPT2_CLASSES = (GPT2Model, GPT2LMHeadModel, GPT2DoubleHeadsModel, GPT2ForSequenceClassification,
                GPT2ForTokenClassification, GPT2ForQuestionAnswering)
QWEN2_CLASSES = (Qwen2Model, Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2ForQuestionAnswering,
                 Qwen2ForTokenClassification)


def _llama_config(t) -> LlamaConfig:
    return LlamaConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=48,
                       num_hidden_layers=t.num_hidden_layers, num_attention_heads=t.num_attention_heads,
                       num_key_value_heads=2, max_position_embeddings=t.max_position_embeddings,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _gpt2_config(t) -> GPT2Config:
    return GPT2Config(vocab_size=t.vocab_size, n_embd=t.hidden_size, n_inner=48, n_layer=t.num_hidden_layers,
                      n_head=t.num_attention_heads, n_positions=t.max_position_embeddings, resid_pdrop=0.0,
                      embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0, pad_token_id=0,
                      bos_token_id=1, eos_token_id=2)


def _qwen2_config(t) -> Qwen2Config:
    # the second layer slides (window 4 < the 9 tokens of the inputs): sliding masks and caches are tested too
    return Qwen2Config(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=48,
                       num_hidden_layers=t.num_hidden_layers, num_attention_heads=t.num_attention_heads,
                       num_key_value_heads=2, max_position_embeddings=t.max_position_embeddings,
                       use_sliding_window=True, sliding_window=4, max_window_layers=1,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


class DecoderTester:
    """What `ModelTesterMixin` reads from `self.model_tester`: sizes, a config, inputs with a random padding
    mask."""

    def __init__(self, parent, make_config):
        self.parent, self.make_config = parent, make_config
        self.batch_size, self.seq_length, self.is_training = 4, 9, True
        self.vocab_size, self.hidden_size, self.num_hidden_layers, self.num_attention_heads = 64, 32, 2, 4
        self.max_position_embeddings = 64

    def get_config(self):
        return self.make_config(self)

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        mask = random_attention_mask([self.batch_size, self.seq_length])
        return self.get_config(), {"input_ids": input_ids, "attention_mask": mask}


class _Outside(ModelTesterMixin):
    # transformers' source distribution does not ship GenerationTesterMixin (tests/generation/), so no class is
    # declared generative here; diet's own tests cover generate (tests/integrations/test_contract.py)
    all_generative_model_classes = ()
    make_config = None

    def setUp(self):
        self.model_tester = DecoderTester(self, type(self).make_config)


class LlamaOutsideTest(_Outside, unittest.TestCase):
    all_model_classes = LLAMA_CLASSES
    make_config = staticmethod(_llama_config)


class GPT2OutsideTest(_Outside, unittest.TestCase):
    all_model_classes = GPT2_CLASSES
    make_config = staticmethod(_gpt2_config)

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels)
        if return_labels and model_class is GPT2DoubleHeadsModel:
            # in no task mapping: labels for its `loss`, the language-model loss alone (so the choice head gets
            # no gradient, and the gradient-checkpointing tests fail on it, plain and attached alike)
            inputs["labels"] = torch.zeros_like(inputs["input_ids"])
        return inputs


class Qwen2OutsideTest(_Outside, unittest.TestCase):
    all_model_classes = QWEN2_CLASSES
    make_config = staticmethod(_qwen2_config)


def _attach_after_init(cls, spec: str) -> None:
    import dietpe

    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, config, *args, **kwargs):
        original(self, config, *args, **kwargs)
        if type(self) is cls:  # the outermost class: the model is finished
            dietpe.attach(self, OWN[config.model_type] if spec == "own" else spec)

    cls.__init__ = __init__


def _install(run: str) -> None:
    if run == "plain":
        return
    if run == "import":  # dietpe imported, nothing attached: importing it must change nothing
        import dietpe  # noqa: F401
        return
    for cls in LLAMA_CLASSES + GPT2_CLASSES + QWEN2_CLASSES:
        _attach_after_init(cls, run)


_install(os.environ.get("DIETPE_OUTSIDE", "plain"))
