"""BERT checkpoints made by transformers load into diet with the same outputs (random weights, every head),
a diet `absolute` model exports as a BERT that transformers loads without diet, and another position method
starts from BERT's content weights with a report of what was loaded, initialised and dropped."""

import logging

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)

from dietpe import (
    ConfigError,
    DataError,
    DietForMaskedLM,
    DietForQuestionAnswering,
    DietForSequenceClassification,
    DietModel,
)
from dietpe.models.bert import from_bert, to_bert

PAIRS = [(BertModel, DietModel), (BertForMaskedLM, DietForMaskedLM),
         (BertForSequenceClassification, DietForSequenceClassification),
         (BertForQuestionAnswering, DietForQuestionAnswering)]


def bert_config(num_labels=3, **kw):
    return BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=40, num_labels=num_labels, **kw)


def inputs():
    ids = torch.randint(1, 60, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    segments = torch.zeros_like(ids)
    segments[:, 6:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=segments)


def outputs(out):
    return [t for t in (getattr(out, k, None) for k in ("last_hidden_state", "pooler_output", "logits",
                                                          "start_logits", "end_logits")) if t is not None]


@pytest.mark.parametrize("bert_cls,diet_cls", PAIRS)
def test_bert_checkpoint_gives_the_same_outputs_and_exports_back(tmp_path, bert_cls, diet_cls):
    bert = bert_cls(bert_config(2 if bert_cls is BertForQuestionAnswering else 3)).eval()  # QA: start, end
    bert.save_pretrained(tmp_path / "bert")  # safetensors
    model, report = from_bert(str(tmp_path / "bert"))  # the class from the checkpoint's architecture
    assert type(model) is diet_cls and not report.initialised and not report.dropped
    model.eval()
    x = inputs()
    with torch.no_grad():
        for a, b in zip(outputs(model(**x)), outputs(bert(**x)), strict=True):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=0)
    to_bert(model, tmp_path / "export")
    again = bert_cls.from_pretrained(tmp_path / "export").eval()  # plain transformers, no diet involved
    assert type(again) is bert_cls and again.config.model_type == "bert"
    with torch.no_grad():
        for a, b in zip(outputs(again(**x)), outputs(bert(**x)), strict=True):
            torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_another_method_starts_from_bert_content_weights(tmp_path, caplog):
    BertForMaskedLM(bert_config()).save_pretrained(tmp_path / "bert")
    with caplog.at_level(logging.INFO, logger="dietpe.bert"):
        model, report = from_bert(str(tmp_path / "bert"), DietForMaskedLM, position="diet-rel", segment="input")
    assert report.dropped == ["bert.embeddings.position_embeddings.weight"]
    assert report.initialised == ["diet.positions.method.r"]  # the new method's parameters only
    assert "lm_head.decoder.weight" in report.loaded and "diet.layers.1.output_norm.bias" in report.loaded
    assert "1 initialised, 1 dropped" in caplog.text and "diet.positions.method.r" in caplog.text
    bert = BertForMaskedLM.from_pretrained(tmp_path / "bert")
    torch.testing.assert_close(model.diet.layers[0].attention.query.weight,
                               bert.bert.encoder.layer[0].attention.self.query.weight)
    # BERT's encoder into a classifier: the head is initialised, and said to be
    _, report = from_bert(str(tmp_path / "bert"), DietForSequenceClassification)
    assert set(report.initialised) == {"classifier.weight", "classifier.bias", "diet.pooler.weight",
                                       "diet.pooler.bias"}
    assert any(n.startswith("cls.predictions") for n in report.dropped)
    _, report = from_bert(str(tmp_path / "bert"), DietForMaskedLM, keep_input_positions=False)
    assert report.initialised == ["diet.positions.method.weight"]
    # kept beside another method: BERT's table becomes an input table besides DIET-REL's per-head terms
    kept, report = from_bert(str(tmp_path / "bert"), DietForMaskedLM, position="diet-rel", segment="input",
                             keep_input_positions=True)
    assert kept.config.input_positions and report.initialised == ["diet.positions.method.r"]
    torch.testing.assert_close(kept.diet.positions.input_positions.weight,
                               bert.bert.embeddings.position_embeddings.weight)
    ids = torch.randint(0, 40, (1, 6))
    with torch.no_grad():  # the input table is used: other positions, other outputs
        a = kept(ids).logits
        b = kept(ids, position_ids=torch.arange(6) + 3).logits
    assert (a - b).abs().max() > 1e-4


def test_refusals(tmp_path):
    BertModel(bert_config()).save_pretrained(tmp_path / "bert")
    with pytest.raises(ConfigError, match="input_positions=True adds BERT's learned input position table to a "
                                          "per-head method; position='sinusoidal'"):
        from_bert(str(tmp_path / "bert"), position="sinusoidal", keep_input_positions=True)
    model, _ = from_bert(str(tmp_path / "bert"), position="rotary")
    with pytest.raises(ConfigError, match="only position='absolute'"):
        to_bert(model, tmp_path / "out")
    (tmp_path / "bert" / "model.safetensors").rename(tmp_path / "bert" / "pytorch_model.bin")
    with pytest.raises(DataError, match="safetensors only"):
        from_bert(str(tmp_path / "bert"))
    BertModel(bert_config(position_embedding_type="relative_key")).save_pretrained(tmp_path / "rel")
    with pytest.raises(ConfigError, match="relative_key"):
        from_bert(str(tmp_path / "rel"))


def test_a_checkpoint_of_another_family_is_refused_even_with_cls(tmp_path):
    """BertConfig reads any config.json: a GPT-2 folder became a random bert-base with cls= given."""
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "gpt2")
    for cls in (None, DietForMaskedLM):
        with pytest.raises(ConfigError, match="model_type 'gpt2' is not BERT's"):
            from_bert(str(tmp_path / "gpt2"), cls)
