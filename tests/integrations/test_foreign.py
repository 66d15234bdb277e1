"""Foreign checkpoints: diet's classes refuse a folder diet did not write; from_bert takes a model object."""

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from dietpe import DietForCausalLM, DietForMaskedLM
from dietpe.errors import ConfigError
from dietpe.models.bert import from_bert

TINY_BERT = dict(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                 max_position_embeddings=32)


@pytest.mark.parametrize("make, cls, way", [
    (lambda: BertForMaskedLM(BertConfig(**TINY_BERT)), DietForMaskedLM, "from_bert"),
    (lambda: LlamaForCausalLM(LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                          num_attention_heads=2)), DietForCausalLM, "attach"),
    (lambda: GPT2LMHeadModel(GPT2Config(vocab_size=30, n_embd=16, n_layer=1, n_head=2)), DietForCausalLM, "attach"),
])
def test_foreign_folder_is_refused(tmp_path, make, cls, way):
    make().save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=rf"model_type '\w+' was not written by diet.*{way}") as e:
        cls.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)


def test_diet_folders_still_load(tmp_path):
    from dietpe import DietConfig

    model = DietForMaskedLM(DietConfig.from_preset("bert-tiny", vocab_size=30)).eval()
    model.save_pretrained(tmp_path)
    x = torch.randint(0, 30, (1, 8))
    torch.testing.assert_close(DietForMaskedLM.from_pretrained(tmp_path).eval()(x).logits, model(x).logits)


def test_from_bert_takes_a_model_object(tmp_path):
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(**TINY_BERT, hidden_dropout_prob=0, attention_probs_dropout_prob=0)).eval()
    x = torch.randint(0, 30, (2, 8))
    model, report = from_bert(bert)
    torch.testing.assert_close(model.eval()(x).logits, bert(x).logits, atol=1e-5, rtol=0)
    bert.save_pretrained(tmp_path)
    from_path, _ = from_bert(str(tmp_path))
    assert sorted(report.loaded) == sorted(_.loaded)
    with pytest.raises(ConfigError, match="expected a transformers BERT model"):
        from_bert(torch.nn.Linear(2, 2))
