"""The numbers behind the pictures: position-only patterns (DIET Fig. 4/7, TUPE Fig. 6), segment attention
(Fig. 6), cosine similarity of position embeddings (Fig. 5), and the logits decomposition (Fig. 2)."""

import pytest
import torch

from dietpe import DietConfig, DietForMaskedLM, DietModel
from dietpe.analysis import (
    attention_logits,
    offset_profile,
    position_cosine_similarity,
    position_embeddings,
    position_pattern,
    segment_pattern,
    toeplitz_deviation,
    two_segments,
)
from dietpe.config import POSITIONS


def model(position="diet-rel", **overrides):
    cfg = DietConfig.from_preset("bert-tiny", position=position, vocab_size=100, max_position_embeddings=32,
                                 hidden_size=32, intermediate_size=64, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0, **overrides)
    return DietModel(cfg).eval()


def is_toeplitz(p: torch.Tensor) -> bool:
    """Every entry equals the one up-left of it: p[..., i, j] == p[..., i-1, j-1]."""
    return torch.equal(p[..., 1:, 1:], p[..., :-1, :-1])


def test_diet_rel_pattern_is_toeplitz_and_its_profile_is_the_learned_r():
    m = model("diet-rel")
    pattern = torch.stack(position_pattern(m, 20))  # (layers, H, 20, 20)
    assert is_toeplitz(pattern)
    assert float(toeplitz_deviation(pattern).max()) == 0.0
    offsets, values = offset_profile(pattern)
    r = m.positions.method.logit("r")  # effective R, (layers, H, 2n-1) over offsets -(n-1)..n-1, n = 32
    span = 31
    torch.testing.assert_close(values, r[..., offsets + span].detach())  # a mean of equal numbers
    # R[i-j]: the entry below the diagonal reads offset +1
    assert pattern[0, 1, 5, 4] == r[0, 1, 1 + span]


@pytest.mark.parametrize("position", ["t5", "alibi", "xlnet"])
def test_relative_patterns_are_toeplitz(position):
    # XLNet's pattern is its query-free term v·W_R R_{i-j}
    pattern = torch.stack(position_pattern(model(position), 24))
    assert is_toeplitz(pattern)
    assert not torch.equal(pattern, torch.zeros_like(pattern))


def test_absolute_patterns_are_not_toeplitz():
    for position in ("diet-abs", "tupe-a", "absolute"):
        pattern = next(p for p in position_pattern(model(position), 24) if p is not None)
        deviation = toeplitz_deviation(pattern) / (pattern.amax((-1, -2)) - pattern.amin((-1, -2)))
        assert deviation.min() > 0.1, position


def test_diet_abs_pattern_is_p_q_p_k_transposed_and_head_sharing_repeats_it():
    m = model("diet-abs", position_rank=4)
    p_q, p_k = m.positions.method.logit("p_q"), m.positions.method.logit("p_k")  # effective factors
    pattern = position_pattern(m, 10)
    torch.testing.assert_close(pattern[1], (p_q[1, :, :10] @ p_k[1, :, :10].transpose(-1, -2)).detach())
    shared = position_pattern(model("diet-abs", sharing="head"), 10)[0]
    assert shared.shape == (2, 10, 10) and torch.equal(shared[0], shared[1])


def test_every_method_draws_a_pattern_or_says_it_has_none():
    drawn = {p for p in POSITIONS if any(x is not None for x in position_pattern(model(p), 12))}
    assert drawn == set(POSITIONS) - {"none", "rotary", "shaw"}  # q/k-only or query-only position
    # TUPE-R = TUPE-A's absolute correlation + a relative bias: not Toeplitz, but the difference is
    a, r = model("tupe-a"), model("tupe-r")
    r.positions.method.load_state_dict(a.positions.method.state_dict(), strict=False)
    diff = position_pattern(r, 12)[0] - position_pattern(a, 12)[0]
    assert float(toeplitz_deviation(diff[:, 1:, 1:]).max()) < 1e-6  # away from the [CLS] reset


def test_segment_pattern_reads_the_per_head_table():
    m = model("diet-rel", segment="per-head", type_vocab_size=2)
    seg = two_segments(32, 16)
    pattern = segment_pattern(m, seg)
    table = m.positions.head_segments.logit("table").detach()  # effective Ŝ, (layers, H, 2, 2)
    for layer in range(2):
        for h in range(2):
            expected = table[layer, h][seg[:, None], seg[None, :]]
            assert torch.equal(pattern[layer][h], expected)
    assert pattern[0][1, 3, 20] == table[0, 1, 0, 1]  # query in segment 0, key in segment 1
    assert segment_pattern(model("diet-rel", segment="input"), seg) is None


def test_cosine_similarity_of_identical_rows_is_one_and_of_orthogonal_rows_zero():
    same = torch.randn(1, 8).expand(6, 8)
    assert torch.allclose(position_cosine_similarity(same), torch.ones(15))
    assert torch.allclose(position_cosine_similarity(torch.eye(5)), torch.zeros(10))
    m = model("absolute")
    table = position_embeddings(m)
    assert table.shape == (32, 32) and torch.equal(table, m.positions.method.weight.detach())
    assert position_embeddings(model("diet-rel")) is None
    assert position_embeddings(model("tupe-a")).shape == (32, 32)


@pytest.mark.parametrize("causal", [False, True])
def test_each_layers_input_is_the_models_own_hidden_state(causal):
    """The hooks that catch each layer's input leave the layers' arguments alone: every layer after the first
    sees the hidden states the model computes, position terms and masks included (weights far from their
    initialisation, where a layer run without its terms would differ visibly)."""
    from dietpe import DietForCausalLM
    from dietpe.analysis.logits import encoder_of, layer_inputs
    from tests.models.test_causal import tiny_lm

    torch.manual_seed(0)
    m = (DietForCausalLM(tiny_lm("diet-rel")) if causal else DietForMaskedLM(model("diet-rel").config)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    ids = torch.randint(5, 40, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    caught = layer_inputs(encoder_of(m), batch)
    hidden = m(**batch, output_hidden_states=True).hidden_states
    assert len(caught) >= 2
    for i, x in enumerate(caught):
        torch.testing.assert_close(x, hidden[i], rtol=0, atol=1e-5)  # the backends may differ in rounding


def test_full_logits_are_what_the_model_softmaxes():
    for position, segment in [("diet-abs", "per-head"), ("tupe-a", "input"), ("xlnet", "per-head"),
                              ("rotary", "input"), ("absolute", "input")]:
        m = DietForMaskedLM(model(position, segment=segment).config).eval()
        ids = torch.randint(5, 100, (2, 16))
        seg = (torch.arange(16) >= 9).long().expand(2, -1)
        batch = {"input_ids": ids, "token_type_ids": seg}
        logits = attention_logits(m, batch)
        probs = m(ids, token_type_ids=seg, output_attentions=True).attentions
        for x, p in zip(logits, probs):
            torch.testing.assert_close(torch.softmax(x.full, -1), p, atol=1e-5, rtol=1e-4)
            assert (x.segment is not None) == (segment == "per-head")
        if position == "absolute":
            assert logits[0].position is None
