"""The Python API's inputs: `inputs_embeds` is honoured, and every malformed input is refused with one line
that names the value and what was expected, before any computation."""

import pytest
import torch

from dietpe import DietForMaskedLM, DietForQuestionAnswering, DietForSequenceClassification, DietModel, InputError
from tests.conftest import batch, tiny

L = 8


@pytest.fixture
def model():
    return DietForMaskedLM(tiny(position="diet-rel", segment="per-head")).eval()


@pytest.mark.parametrize("position", ["absolute", "diet-abs", "t5"])
def test_inputs_embeds_give_the_same_output_as_their_ids(position):
    model = DietForMaskedLM(tiny(position=position)).eval()
    ids, mask, seg = batch(L)
    embeds = model.get_input_embeddings()(ids)
    with torch.no_grad():
        by_ids = model(ids, mask, seg).logits
        by_embeds = model(attention_mask=mask, token_type_ids=seg, inputs_embeds=embeds).logits
    assert torch.equal(by_ids, by_embeds)


def test_inputs_embeds_receive_gradients():
    model = DietModel(tiny(position="diet-abs"))
    embeds = torch.randn(2, L, 16, requires_grad=True)
    model(inputs_embeds=embeds).last_hidden_state.sum().backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0


BAD = {
    "attention_mask shape": (dict(attention_mask=torch.ones(2, L + 1, dtype=torch.long)),
                             r"attention_mask has shape \(2, 9\), but the input is \(batch, length\) = \(2, 8\)"),
    "token_type_ids shape": (dict(token_type_ids=torch.zeros(1, L, dtype=torch.long)),
                             r"token_type_ids has shape \(1, 8\)"),
    "token_type_ids float": (dict(token_type_ids=torch.zeros(2, L)), "token_type_ids must be integers"),
    "segment id too large": (dict(token_type_ids=torch.full((2, L), 2)), r"token_type_ids must lie in \[0, 1\]"),
    "position_ids shape": (dict(position_ids=torch.arange(L + 2)[None]), r"position_ids has shape \(1, 10\)"),
    "unknown keyword": (dict(head_mask=None), "unexpected keyword argument.*'head_mask'"),
    "both ids and embeds": (dict(inputs_embeds=torch.zeros(2, L, 16)), "exactly one of input_ids and inputs_embeds"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_malformed_inputs_are_refused_naming_the_value(model, case):
    kwargs, message = BAD[case]
    ids = batch(L)[0]
    with pytest.raises(InputError, match=message):
        model(ids, **kwargs)


@pytest.mark.parametrize("ids,message", [
    (torch.zeros(2, 0, dtype=torch.long), r"empty input: \(batch, length\) = \(2, 0\)"),
    (torch.zeros(0, 5, dtype=torch.long), r"empty input: \(batch, length\) = \(0, 5\)"),
    (torch.zeros(5, dtype=torch.long), r"integer tensor \(batch, length\), got shape \(5,\)"),
    (torch.zeros(2, 5), r"integer tensor \(batch, length\), got shape \(2, 5\) torch.float32"),
    (torch.full((2, 5), 50), r"token id 50 is outside the vocabulary \[0, 49\]"),
])
def test_malformed_input_ids_are_refused(model, ids, message):
    with pytest.raises(InputError, match=message):
        model(ids)


@pytest.mark.parametrize("embeds,message", [
    (torch.zeros(2, L, 15), r"inputs_embeds must be \(batch, length, hidden_size=16\), got \(2, 8, 15\)"),
    (torch.zeros(2, L), r"inputs_embeds must be \(batch, length, hidden_size=16\), got \(2, 8\)"),
    (torch.full((2, L, 16), float("nan")), "inputs_embeds contains NaN"),
])
def test_malformed_inputs_embeds_are_refused(model, embeds, message):
    with pytest.raises(InputError, match=message):
        model(inputs_embeds=embeds)


def test_nothing_given_is_refused(model):
    with pytest.raises(InputError, match="exactly one of input_ids and inputs_embeds"):
        model()


@pytest.mark.parametrize("cls", [DietModel, DietForSequenceClassification, DietForQuestionAnswering])
def test_every_head_refuses_unknown_keywords(cls):
    with pytest.raises(InputError, match="unexpected keyword argument.*'labelz'"):
        cls(tiny())(batch(L)[0], labelz=torch.zeros(2, dtype=torch.long))


def _blocks(*shape):
    return torch.ones(*shape, dtype=torch.bool)


EMPTY_ROW = _blocks(2, 1, L, L)
EMPTY_ROW[1, 0, 3] = False
BAD_MASKS = {
    "3-D": (_blocks(2, L, L), r"attention_mask has shape \(2, 8, 8\); give \(batch, length\) = \(2, 8\) or 4-D"),
    "4-D wrong keys": (_blocks(2, 1, L, L + 1),
                       r"attention_mask has shape \(2, 1, 8, 9\), but a 4-D mask must be \(batch\|1, 1\|heads, "
                       r"queries, keys\) = \(2\|1, 1\|2, 8, 8\)"),
    "4-D wrong heads": (_blocks(2, 3, L, L), r"shape \(2, 3, 8, 8\), but a 4-D mask must be"),
    "4-D wrong batch": (_blocks(3, 1, L, L), r"shape \(3, 1, 8, 8\), but a 4-D mask must be"),
    "float 0/1": (torch.ones(2, 1, L, L), r"additive float mask \(0 = attend, <= -10000 = blocked\) but holds 1.0"),
    "float NaN": (torch.full((2, 1, L, L), float("nan")), r"additive float mask .* but holds nan"),
    "integer 2": (torch.full((2, 1, L, L), 2), r"integer mask \(1 = attend, 0 = not\) but holds 2"),
    "complex": (torch.zeros(2, 1, L, L, dtype=torch.complex64), r"attention_mask has dtype torch.complex64"),
    "a query sees nothing": (EMPTY_ROW, r"attention_mask lets query 3 \(batch row 1\) attend to no key"),
}


@pytest.mark.parametrize("case", list(BAD_MASKS))
def test_malformed_attention_masks_are_refused_in_one_line(model, case):
    mask, message = BAD_MASKS[case]
    with pytest.raises(InputError, match=message):
        model(batch(L)[0], attention_mask=mask)


def test_a_causal_4d_mask_whose_query_sees_only_later_keys_is_refused():
    from tests.models.test_causal import tiny_lm
    from dietpe import DietForCausalLM

    mask = torch.eye(L, dtype=torch.bool).roll(1, dims=1)[None, None]  # query i sees key i + 1 only
    mask[..., -1, :] = False
    mask[..., -1, -1] = True
    with pytest.raises(InputError, match=r"attention_mask lets query 0 \(batch row 0\) attend to no key"):
        DietForCausalLM(tiny_lm("alibi"))(torch.ones(1, L, dtype=torch.long), attention_mask=mask)
    with pytest.raises(InputError, match=r"attention_mask has shape \(1, 1, 3, 8\), but a 4-D mask must be "
                                         r"\(batch\|1, 1\|heads, queries, keys\) = \(1\|1, 1\|2, 8, 8\)"):
        DietForCausalLM(tiny_lm("alibi"))(torch.ones(1, L, dtype=torch.long), attention_mask=mask[..., :3, :])


def test_linformer_refuses_a_4d_mask():
    model = DietModel(tiny(attention="linformer", position="absolute"))
    with pytest.raises(InputError, match="attention='linformer' .* cannot take a 4-D attention_mask"):
        model(batch(L)[0], attention_mask=_blocks(2, 1, L, L))


def test_values_are_read_at_inference_on_cuda_but_not_while_a_cuda_graph_is_captured(monkeypatch):
    """The checks of values copy a result to the host, which a CUDA graph's capture does not allow (it fails the
    capture): on CUDA they read at inference, not in a training step, and not while capturing."""
    import types

    from dietpe.errors import may_read

    on_cuda = types.SimpleNamespace(device=torch.device("cuda"))  # only its device is looked at
    capturing = []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: bool(capturing))
    assert not may_read(on_cuda)  # a training step
    with torch.no_grad():
        assert may_read(on_cuda)
        capturing.append(True)
        assert not may_read(on_cuda)
        assert may_read(torch.zeros(1))  # the CPU's cost nothing, and no graph is captured there
