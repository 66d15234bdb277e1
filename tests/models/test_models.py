
import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
)

from dietpe import (
    DietConfig,
    DietForMaskedLM,
    DietForQuestionAnswering,
    DietForSequenceClassification,
    DietModel,
    InputError,
)
from dietpe.config import POSITIONS
from dietpe.errors import ConfigError
from tests.conftest import batch, tiny


@pytest.mark.parametrize("position", POSITIONS)
def test_save_and_reload_round_trip_exactly(tmp_path, position):
    model = DietForMaskedLM(tiny(position=position, segment="per-head")).eval()
    ids, mask, seg = batch(8)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    again = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(again) is DietForMaskedLM and again.config.position == position
    for (n, p), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert n == n2 and torch.equal(p, p2), n
    with torch.no_grad():
        assert torch.equal(model(ids, mask, seg).logits, again(ids, mask, seg).logits)


def test_mlm_decoder_is_tied_to_word_embeddings(tmp_path):
    model = DietForMaskedLM(tiny())
    assert model.lm_head.decoder.weight.data_ptr() == model.diet.embeddings.word_embeddings.weight.data_ptr()
    model.save_pretrained(tmp_path)
    again = DietForMaskedLM.from_pretrained(tmp_path)
    assert again.lm_head.decoder.weight.data_ptr() == again.diet.embeddings.word_embeddings.weight.data_ptr()


def test_sparse_prediction_is_the_dense_loss_and_gradients_on_the_labelled_tokens(tmp_path):
    torch.manual_seed(0)
    ids, mask, seg = batch(length=12)
    labels = torch.full_like(ids, -100)
    labels[0, [1, 4, 7]], labels[1, [0, 5]] = ids[0, [1, 4, 7]], ids[1, [0, 5]]
    dense = DietForMaskedLM(tiny(position="diet-rel", segment="per-head"))
    sparse = DietForMaskedLM(tiny(position="diet-rel", segment="per-head", sparse_prediction=True))
    sparse.load_state_dict(dense.state_dict())
    outs = [m(ids, attention_mask=mask, token_type_ids=seg, labels=labels) for m in (dense, sparse)]
    # the labelled tokens' logits alone, in row-major order, and the same loss
    assert outs[1].logits.shape == (5, 50)
    torch.testing.assert_close(outs[1].logits, outs[0].logits[labels != -100], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[1].loss, outs[0].loss, rtol=1e-6, atol=1e-6)
    grads = [torch.autograd.grad(o.loss, list(m.parameters()), allow_unused=True)
             for o, m in zip(outs, (dense, sparse))]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(*grads) if a is not None)
    assert any(a is not None and a.abs().max() > 0 for a in grads[1])
    # without labels: every token's logits, as BERT's head gives them
    with torch.no_grad():
        assert sparse(ids, attention_mask=mask, token_type_ids=seg).logits.shape == (2, 12, 50)
    sparse.save_pretrained(tmp_path)
    assert DietForMaskedLM.from_pretrained(tmp_path).config.sparse_prediction is True


@pytest.mark.parametrize("sparse", [False, True])
def test_mlm_labels_are_one_per_token(sparse):
    ids, mask, seg = batch(length=12)
    model = DietForMaskedLM(tiny(sparse_prediction=sparse))
    flat = model(ids, labels=ids.reshape(-1))  # flat, as BERT's head takes them
    assert torch.equal(flat.loss, model(ids, labels=ids).loss)
    with pytest.raises(InputError, match=r"labels of shape \(23,\) for inputs of shape \(2, 12\)"):
        model(ids, labels=ids.reshape(-1)[1:])
    labels = torch.full_like(ids, -100)
    labels[0, 3] = 50  # the tiny vocabulary is 0 .. 49
    with pytest.raises(InputError, match=r"label 50 is outside the vocabulary \[0, 49\]"):
        model(ids, labels=labels)
    labels[0, 3] = -7
    with pytest.raises(InputError, match="label -7 is outside"):
        model(ids, labels=labels)


def test_sparse_prediction_is_a_boolean():
    with pytest.raises(ConfigError, match="sparse_prediction"):
        tiny(sparse_prediction="yes")


def test_auto_classes_resolve_every_head(tmp_path):
    cfg = tiny(position="diet-abs")
    cfg.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), DietConfig)
    assert type(AutoModel.from_config(cfg)) is DietModel
    assert type(AutoModelForSequenceClassification.from_config(cfg)) is DietForSequenceClassification
    assert type(AutoModelForQuestionAnswering.from_config(cfg)) is DietForQuestionAnswering


def test_readme_example(tmp_path):
    model = DietForMaskedLM(DietConfig(position="diet-rel", segment="per-head", num_hidden_layers=1))
    model.save_pretrained(tmp_path)
    again = DietForMaskedLM.from_pretrained(tmp_path)
    ids = torch.tensor([[101, 7592, 2088, 102, 2129, 102]])
    seg = torch.tensor([[0, 0, 0, 0, 1, 1]])
    model.eval(), again.eval()
    with torch.no_grad():
        assert torch.equal(model(ids, token_type_ids=seg).logits, again(ids, token_type_ids=seg).logits)


def test_classification_regression_and_qa_heads_train():
    ids, mask, seg = batch(8)
    cls = DietForSequenceClassification(tiny(num_labels=3, position="diet-rel", segment="per-head"))
    out = cls(ids, mask, seg, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and out.loss > 0
    out.loss.backward()
    reg = DietForSequenceClassification(tiny(num_labels=1, position="t5"))
    out = reg(ids, mask, seg, labels=torch.tensor([0.5, 3.0]))
    assert out.logits.shape == (2, 1)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), torch.tensor([.5, 3.])))
    qa = DietForQuestionAnswering(tiny(position="tupe-a"))
    out = qa(ids, mask, seg, start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 4]))
    assert out.start_logits.shape == (2, 8) and out.loss > 0
    with pytest.raises(InputError, match=r"\[0, 2\]"):
        cls(ids, mask, seg, labels=torch.tensor([0, 3]))


def test_output_attentions_returns_each_layer_probabilities():
    model = DietModel(tiny(position="diet-rel")).eval()
    ids, mask, seg = batch(7)
    with torch.no_grad():
        out = model(ids, mask, seg, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 7, 7)
    torch.testing.assert_close(out.attentions[1].sum(-1), torch.ones(2, 2, 7))
    assert float(out.attentions[0][1, :, :, -3:].abs().max()) == 0.0  # padded keys get no weight


def test_presets_and_sizes():
    small = DietConfig.from_preset("bert-small", position="diet-abs")
    assert (small.hidden_size, small.num_hidden_layers, small.num_attention_heads) == (512, 4, 8)
    assert small.rank == small.head_size == 64
    base = DietConfig.from_preset("bert-base")
    assert (base.hidden_size, base.num_hidden_layers, base.num_attention_heads) == (768, 12, 12)


def test_bad_inputs_are_named():
    model = DietModel(tiny(position="absolute", segment="input")).eval()
    with pytest.raises(InputError, match=r"token id 50 is outside the vocabulary \[0, 49\]"):
        model(torch.tensor([[1, 50]]))
    with pytest.raises(InputError, match=r"sequence length 25 exceeds max_position_embeddings=24"):
        model(torch.ones(1, 25, dtype=torch.long))
    with pytest.raises(InputError, match=r"token_type_ids must lie in \[0, 1\].*got 2"):
        model(torch.ones(1, 4, dtype=torch.long), token_type_ids=torch.tensor([[0, 1, 2, 0]]))
    for position in ("diet-abs", "tupe-a", "tupe-r"):
        with pytest.raises(InputError, match="max_position_embeddings=24"):
            DietModel(tiny(position=position))(torch.ones(1, 30, dtype=torch.long))


def test_parameter_increase_of_diet_abs_is_per_layer_per_head_tables():
    base = sum(p.numel() for p in DietModel(tiny(position="none")).parameters())
    cfg = tiny(position="diet-abs", segment="input", position_rank=3)
    extra = sum(p.numel() for p in DietModel(cfg).parameters()) - base
    assert extra == 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.max_position_embeddings * 3
    shared = tiny(position="diet-abs", segment="input", position_rank=3, sharing="layer")
    assert sum(p.numel() for p in DietModel(shared).parameters()) - base == extra // cfg.num_hidden_layers


def test_position_terms_are_built_once_per_forward(monkeypatch):
    """Shared terms (T5: one table for every layer) are multiplied out once, not per layer or example."""
    from dietpe.positions.terms import TableBias

    calls = []
    original = TableBias.dense

    def counting(self, q=None, rows=None):
        calls.append(self._dense is None)
        return original(self, q, rows)

    monkeypatch.setattr(TableBias, "dense", counting)
    model = DietModel(tiny(position="t5", num_hidden_layers=4, attn_backend="eager")).eval()
    ids, mask, seg = batch(6, batch_size=3)
    model(ids, mask, seg)
    assert len(calls) == 4 and sum(calls) == 1  # four layers read it, one built it


RESET_OFF = [p for p in POSITIONS if p.startswith("tupe")]


@pytest.mark.parametrize("position, fields", [(p, {}) for p in POSITIONS] + [(p, {"tupe_reset": False})
                                                                          for p in RESET_OFF])
def test_every_parameter_gets_a_gradient(position, fields):
    """The loss reaches every parameter (TUPE's without its [CLS] reset too): DistributedDataParallel refuses a
    parameter no loss reaches, unless told to search the graph for it every step."""
    from dietpe import DietForCausalLM
    from dietpe.models.causal import CAUSAL_POSITIONS
    from tests.models.test_causal import tiny_lm

    ids, mask, seg = batch()
    model = DietForMaskedLM(tiny(position=position, **fields))
    model(ids, attention_mask=mask, token_type_ids=seg, labels=ids).loss.backward()
    models = [model]
    if position in CAUSAL_POSITIONS:
        lm = DietForCausalLM(tiny_lm(position, **fields))  # TUPE's reset is off there
        lm(ids % 40, labels=ids % 40).loss.backward()
        models.append(lm)
    for m in models:
        assert [n for n, p in m.named_parameters() if p.grad is None] == []


def test_loading_refuses_weights_the_checkpoint_lacks_or_holds_at_another_shape(tmp_path):
    """transformers initialises a missing weight at random (a silent wrong model) and a resized one fails deep
    inside; the commands' loader names both. A fine-tuning head is meant to be new."""
    import json

    from safetensors.torch import load_file, save_file

    from dietpe import DataError, DietForSequenceClassification
    from dietpe.validate import load_whole

    DietForMaskedLM(tiny(position="diet-rel")).save_pretrained(tmp_path / "whole")
    head = ("classifier.", "qa_outputs.", "diet.pooler.")
    assert isinstance(load_whole(DietForSequenceClassification, tmp_path / "whole", new=head),
                      DietForSequenceClassification)
    DietForMaskedLM(tiny(position="diet-rel")).save_pretrained(tmp_path / "lacking")
    weights = load_file(tmp_path / "lacking" / "model.safetensors")
    del weights["diet.layers.0.attention.query.weight"]
    save_file(weights, tmp_path / "lacking" / "model.safetensors", metadata={"format": "pt"})
    for cls, new in ((DietForMaskedLM, ()), (DietForSequenceClassification, head)):
        with pytest.raises(DataError, match=r"lacking: the weights lack diet\.layers\.0\.attention\.query\.weight"):
            load_whole(cls, tmp_path / "lacking", new=new)
    DietForMaskedLM(tiny(position="diet-rel")).save_pretrained(tmp_path / "edited")
    config = json.loads((tmp_path / "edited" / "config.json").read_text())
    (tmp_path / "edited" / "config.json").write_text(json.dumps({**config, "vocab_size": 60}))
    with pytest.raises(DataError, match="at another shape than config.json gives"):
        load_whole(DietForMaskedLM, tmp_path / "edited")
