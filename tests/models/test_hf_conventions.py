"""diet's models keep Hugging Face's conventions where a user of BERT or Llama relies on them: return_dict=False
tuples, output_attentions / output_hidden_states from the config, resize_token_embeddings, the heads' label
shapes and problem_type, a config override given to from_pretrained checked like a constructor's, and Hugging
Face's attn_implementation choosing the backend that runs (never recorded while another runs)."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig

from dietpe import (
    ConfigError,
    DietConfig,
    DietForCausalLM,
    DietForMaskedLM,
    DietForQuestionAnswering,
    DietForSequenceClassification,
    DietModel,
)
from dietpe.models.causal import DietCausalConfig
from tests.conftest import tiny
from tests.models.test_causal import tiny_lm


def _ids(vocab=50):
    return torch.randint(3, vocab, (2, 8), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("make", [lambda: DietModel(tiny()), lambda: DietForMaskedLM(tiny()),
                                  lambda: DietForCausalLM(tiny_lm("diet-rel"))])
def test_return_dict_false_gives_the_outputs_fields_as_a_tuple(make):
    model = make().eval()
    x = _ids(model.config.vocab_size)
    full = model(x, output_hidden_states=True)
    as_tuple = model(x, output_hidden_states=True, return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(full.to_tuple())
    torch.testing.assert_close(as_tuple[0], full.to_tuple()[0], rtol=0, atol=0)
    model.config.return_dict = False  # the config's choice where the call makes none
    assert isinstance(model(x), tuple) and not isinstance(model(x, return_dict=True), tuple)


def test_the_config_asks_for_attentions_and_hidden_states_where_the_call_does_not():
    model = DietForMaskedLM(tiny(position="diet-rel")).eval()
    x = _ids()
    assert model(x).attentions is None and model(x).hidden_states is None
    model.config.output_attentions = model.config.output_hidden_states = True
    out = model(x)
    assert len(out.attentions) == 2 and len(out.hidden_states) == 3
    assert model(x, output_attentions=False).attentions is None  # the call's choice wins


@pytest.mark.parametrize("make", [lambda: DietForMaskedLM(tiny(position="diet-abs")),
                                  lambda: DietForCausalLM(tiny_lm("alibi"))])
def test_resize_token_embeddings_resizes_the_heads_bias(make):
    model = make().eval()
    with torch.no_grad():
        model.lm_head.bias.normal_()
    x = _ids(model.config.vocab_size)
    before = model(x).logits
    model.resize_token_embeddings(70)
    after = model(torch.cat([x, torch.full((2, 1), 65)], 1)).logits
    assert after.shape[-1] == 70 and model.config.vocab_size == 70
    if isinstance(model, DietForMaskedLM):  # the old rows keep their logits; the new token changes the rest
        torch.testing.assert_close(model(x).logits[..., :50], before, rtol=0, atol=0)
    model.resize_token_embeddings(40)
    assert model.lm_head.bias.shape == (40,) and model(x.clamp_max(39)).logits.shape[-1] == 40


def test_classification_labels_follow_hugging_faces_shapes_and_problem_type():
    x = _ids()
    reg = DietForSequenceClassification(tiny(num_labels=1)).eval()
    column = torch.tensor([[0.5], [1.0]])
    out = reg(x, labels=column)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.view(-1), column.view(-1)))
    torch.testing.assert_close(reg(x, labels=column.view(-1)).loss, out.loss)
    multi = DietForSequenceClassification(tiny(num_labels=3, problem_type="multi_label_classification")).eval()
    targets = torch.tensor([[1.0, 0, 1], [0, 1, 0]])
    out = multi(x, labels=targets)
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, targets))
    single = DietForSequenceClassification(tiny(num_labels=3)).eval()
    out = single(x, labels=torch.tensor([2, 0]))
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([2, 0])))
    # float labels and no problem_type: multi-label, as BERT infers it
    torch.testing.assert_close(single(x, labels=targets).loss, F.binary_cross_entropy_with_logits(out.logits, targets))
    qa = DietForQuestionAnswering(tiny()).eval()
    start, end = torch.tensor([1, 2]), torch.tensor([3, 4])
    torch.testing.assert_close(qa(x, start_positions=start[:, None], end_positions=end[:, None]).loss,
                               qa(x, start_positions=start, end_positions=end).loss)


def test_a_from_pretrained_override_is_checked_like_a_constructors(tmp_path):
    tiny().save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="position='bogus' is not one of"):
        AutoConfig.from_pretrained(tmp_path, position="bogus")
    with pytest.raises(ConfigError, match="not divisible by num_attention_heads=5"):
        DietForMaskedLM.from_pretrained(tmp_path, num_attention_heads=5)
    assert AutoConfig.from_pretrained(tmp_path, num_attention_heads=4).num_attention_heads == 4
    with pytest.raises(ConfigError, match="hidden_act='gleu' is not one of"):
        DietConfig(hidden_act="gleu")
    with pytest.raises(ConfigError, match=r"pad_token_id=99 must be a token id in \[0, 49\]"):
        DietCausalConfig(vocab_size=50, pad_token_id=99)


def _backends(model) -> set[str]:
    from dietpe.attention.layer import MultiHeadAttention

    return {m.backend.name for m in model.modules() if isinstance(m, MultiHeadAttention)}


def test_attn_implementation_chooses_the_backend_that_runs(tmp_path):
    from transformers import AutoModelForMaskedLM

    DietForMaskedLM(tiny(position="diet-rel")).save_pretrained(tmp_path)
    for implementation, backend in (("eager", "eager"), ("sdpa", "sdpa")):
        model = DietForMaskedLM.from_pretrained(tmp_path, attn_implementation=implementation)
        assert model.config.attn_backend == backend and _backends(model) == {backend}
        model = AutoModelForMaskedLM.from_config(tiny(position="diet-rel"), attn_implementation=implementation)
        assert _backends(model) == {backend}
        assert _backends(DietForCausalLM(tiny_lm("t5", attn_implementation=implementation))) == {backend}
    model = DietForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    x = _ids()
    eager = model(x).logits
    model.set_attn_implementation("sdpa")
    assert _backends(model) == {"sdpa"} and model.config.attn_backend == "sdpa"
    torch.testing.assert_close(model(x).logits, eager, atol=1e-5, rtol=1e-5)


def test_an_attn_implementation_diet_cannot_run_is_refused_naming_the_choices(tmp_path):
    DietForMaskedLM(tiny()).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="'flash_attention_2'.*'eager', 'sdpa', 'flex_attention'"):
        DietForMaskedLM.from_pretrained(tmp_path, attn_implementation="flash_attention_2")
    with pytest.raises(ConfigError, match="attn_backend='sdpa' is given too"):
        DietConfig(attn_implementation="eager", attn_backend="sdpa")
    with pytest.raises(ConfigError, match="'paged_attention'"):
        DietForMaskedLM(tiny()).set_attn_implementation("paged_attention")
    with pytest.raises(ConfigError, match="attn_backend='sdpa' cannot serve position='shaw'"):
        DietForMaskedLM(tiny(position="shaw")).set_attn_implementation("sdpa")


@pytest.mark.parametrize("typo, meant", [("positon", "position"), ("segmnet", "segment"),
                                         ("t5_num_bucket", "t5_num_buckets"), ("num_decoder_layer", None)])
def test_a_misspelt_field_is_refused_naming_the_field_meant(typo, meant):
    from dietpe.models.seq2seq import DietSeq2SeqConfig

    with pytest.raises(ConfigError, match=f"unknown field '{typo}'; did you mean '{meant or 'num_decoder_layers'}'"):
        (DietSeq2SeqConfig if meant is None else DietConfig)(**{typo: 1})
    assert DietConfig(num_labels=3, sep_token_id=1, my_note="kept").my_note == "kept"  # Hugging Face's keywords


def test_a_masked_lm_step_split_into_accumulated_micro_batches_is_the_one_batch_step(tmp_path):
    """The loss is the mean over the step's labelled tokens (their number varies by micro-batch): 8 examples
    as 8 x 1 and as 4 x 2 accumulated give the same update, up to float rounding (a mean of micro-batch means
    would weight the tokens of a sparsely masked micro-batch more)."""
    from transformers import Trainer, TrainingArguments

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 50, (8, 12), generator=g)
    labels = torch.full_like(ids, -100)
    for i, n in enumerate([1, 1, 1, 1, 1, 1, 1, 12]):  # however shuffled, one micro-batch holds 4 labels, one 15
        labels[i, :n] = ids[i, :n]
    rows = [{"input_ids": ids[i], "labels": labels[i]} for i in range(8)]
    weights = []
    for per_device, accumulate in ((8, 1), (4, 2)):
        torch.manual_seed(0)
        model = DietForMaskedLM(tiny(position="diet-rel"))
        args = TrainingArguments(str(tmp_path / f"{per_device}"), per_device_train_batch_size=per_device,
                                 gradient_accumulation_steps=accumulate, max_steps=1, learning_rate=0.1,
                                 optim="sgd", lr_scheduler_type="constant", report_to=[], save_strategy="no",
                                 use_cpu=True, disable_tqdm=True, dataloader_drop_last=False, seed=0)
        Trainer(model=model, args=args, train_dataset=rows).train()
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    moved = max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0])
    assert moved < 1e-6, moved
