"""Compiler- and memory-friendly models: a compiled forward has no graph break for any method, and activation
(gradient) checkpointing gives the gradients of the plain backward."""

import warnings

import pytest
import torch
from transformers import Trainer, TrainingArguments

from dietpe import ConfigError, DietForMaskedLM
from dietpe.config import POSITIONS
from dietpe.models.seq2seq import DietForConditionalGeneration
from tests.conftest import batch, tiny
from tests.models.test_seq2seq import source, tiny_s2s

CASES = [dict(position=p, segment="per-head" if p.startswith("dietpe") else "input") for p in POSITIONS] + [
    dict(position="diet-abs", segment="input", attention="linformer"),
    dict(position="diet-rel", segment="per-head", sharing="layer"),
]


def _name(case):
    return ":".join(str(v) for v in case.values())


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_compiled_forward_has_no_graph_break_and_the_same_output(case, device):
    model = DietForMaskedLM(tiny(**case)).eval().to(device)
    ids, mask, seg = batch(10, device=device)
    torch._dynamo.reset()
    # fullgraph=True raises at the first graph break; the eager backend keeps the test free of a C++ compiler
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(ids, attention_mask=mask, token_type_ids=seg).logits
        want = model(ids, attention_mask=mask, token_type_ids=seg).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _grads(model, *args, **kwargs):
    model.zero_grad()
    out = model(*args, **kwargs)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_activation_checkpointing_gives_the_same_gradients(case, device):
    model = DietForMaskedLM(tiny(**case)).train().to(device)  # the tiny config has no dropout: runs are comparable
    ids, mask, seg = batch(10, device=device)
    kwargs = dict(attention_mask=mask, token_type_ids=seg, labels=ids)
    loss, plain = _grads(model, ids, **kwargs)
    model.gradient_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in model.diet.layers)
    ckpt_loss, ckpt = _grads(model, ids, **kwargs)
    torch.testing.assert_close(ckpt_loss, loss)
    assert ckpt.keys() == plain.keys()
    assert any(n.startswith("diet.positions") for n in plain) or case["position"] in ("none", "sinusoidal", "rotary",
                                                                                         "alibi")
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("position", ["t5", "diet-rel", "xlnet"])
def test_seq2seq_checkpointing_gives_the_same_gradients(position):
    model = DietForConditionalGeneration(tiny_s2s(position)).train()
    src, mask = source()
    labels = torch.randint(3, 40, (3, 6))
    loss, plain = _grads(model, src, mask, labels=labels)
    model.gradient_checkpointing_enable()
    ckpt_loss, ckpt = _grads(model, src, mask, labels=labels)
    torch.testing.assert_close(ckpt_loss, loss)
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_reentrant_checkpointing_is_refused():
    with pytest.raises(ConfigError, match="use_reentrant=False"):
        DietForMaskedLM(tiny()).gradient_checkpointing_enable({"use_reentrant": True})


def test_trainer_accepts_gradient_checkpointing(tmp_path):
    model = DietForMaskedLM(tiny(position="diet-rel", segment="per-head"))
    ids, mask, seg = batch(10)
    data = [dict(input_ids=ids[i], attention_mask=mask[i], token_type_ids=seg[i], labels=ids[i]) for i in range(2)]
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=2, gradient_checkpointing=True,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=data).train()
    assert all(layer.gradient_checkpointing for layer in model.diet.layers)


def test_the_decoders_compile_without_a_graph_break():
    """The causal LM and the translation model compile whole too: the output's cache field is named once, at
    import, not looked up with dataclasses.fields inside the forward."""
    from dietpe import DietForCausalLM
    from tests.models.test_causal import tiny_lm

    ids = torch.randint(3, 40, (2, 7))
    for model, kwargs in ((DietForCausalLM(tiny_lm("rotary")).eval(), dict(use_cache=False)),
                          (DietForCausalLM(tiny_lm("diet-rel")).eval(), dict(use_cache=True)),
                          (DietForConditionalGeneration(tiny_s2s("t5")).eval(),
                           dict(decoder_input_ids=ids[:, :4], use_cache=False))):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.testing.assert_close(compiled(ids, **kwargs).logits, model(ids, **kwargs).logits)


@pytest.mark.parametrize("position", ["diet-rel", "t5"])
def test_a_compiled_training_step_compiles_once_more_for_a_new_length_not_once_per_length(position):
    """The Toeplitz terms' forward is a strided view and their gradient one skewed sum when compiled: the length
    stays symbolic (unfold and a loop over the rows fixed it, a new graph per length until dynamo's limit of 8,
    then eager without a word). The gradients equal eager's."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    torch.manual_seed(0)
    model = DietForMaskedLM(tiny(position=position, max_position_embeddings=160))
    eager = DietForMaskedLM(tiny(position=position, max_position_embeddings=160))
    eager.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="aot_eager")
    for length in (8, 9, 11, 140):
        ids = torch.randint(1, 50, (2, length), generator=torch.Generator().manual_seed(length))
        for m in (compiled, eager):
            m.zero_grad()
            m(ids, labels=ids).loss.backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)
    assert dynamo_utils.counters["frames"]["ok"] == 2  # the first length, then one symbolic graph
