"""Numerical rank (DIET Fig. 2/8) and Theorem 1 on tiny models: ranks of the logits and of the position terms."""

import pytest
import torch

from dietpe import DietConfig, DietModel
from dietpe.analysis import attention_logits, default_rtol, numerical_rank, position_pattern


def model(position, **overrides):
    cfg = DietConfig.from_preset("bert-tiny", position=position, vocab_size=1000, max_position_embeddings=96,
                                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **overrides)
    return DietModel(cfg).eval()


def test_numerical_rank_counts_singular_values_above_the_stated_tolerance():
    a, b = torch.randn(30, 5), torch.randn(5, 40)
    assert int(numerical_rank(a @ b)) == 5
    assert int(numerical_rank(torch.zeros(4, 4))) == 0
    # the tolerance is relative to σ_max: a component at 1e-3 · σ_max counts with rtol 1e-4, not with 1e-2
    u, _ = torch.linalg.qr(torch.randn(20, 20, dtype=torch.float64))
    m = u[:, :3] @ torch.diag(torch.tensor([1.0, 0.5, 1e-3], dtype=torch.float64)) @ u[:, :3].T
    assert int(numerical_rank(m, rtol=1e-4)) == 3
    assert int(numerical_rank(m, rtol=1e-2)) == 2
    assert default_rtol(20, 30) == pytest.approx(30 * torch.finfo(torch.float32).eps)
    # batched: one rank per matrix
    assert numerical_rank(torch.stack([a @ b, a[:, :3] @ b[:3]])).tolist() == [5, 3]


def test_diet_abs_position_term_has_rank_d_p():
    for d_p in (8, 64):
        m = model("diet-abs", position_rank=d_p)
        pattern = position_pattern(m, 96)  # length 96 > d_p
        ranks = numerical_rank(torch.stack(pattern))  # (layers, H)
        assert ranks.flatten().tolist() == [d_p] * 4


def test_theorem_1_input_additive_logits_are_bounded_by_the_head_size():
    ids = torch.randperm(995)[:192].view(2, 96) + 5  # distinct tokens: X has full rank
    d_h = 64
    for position in ("absolute", "sinusoidal"):
        logits = attention_logits(model(position, segment="input"), {"input_ids": ids})
        ranks = torch.stack([numerical_rank(x.full) for x in logits])  # (layers, B, H)
        assert ranks.max() == d_h  # the bound, reached by generic random weights
        assert all(x.position is None for x in logits)  # position lives inside the token term
    # at init, unit-size sinusoids swamp the 0.02-size token embeddings: some heads fall below the bound
    assert ranks.min() < d_h


def test_theorem_1_per_head_positions_raise_the_rank_to_d_h_plus_d_p():
    ids = torch.randperm(995)[:192].view(2, 96) + 5  # distinct tokens: X has full rank
    logits = attention_logits(model("diet-abs", position_rank=8, segment="input"), {"input_ids": ids})
    for x in logits:
        assert numerical_rank(x.content).max() == 64
        assert numerical_rank(x.position).tolist() == [[8, 8]]
        assert numerical_rank(x.full).flatten().tolist() == [72] * 4  # d_h + d_p > d_h


def test_input_additive_position_pattern_is_rank_bounded_and_first_layer_only():
    pattern = position_pattern(model("absolute"), 96)
    assert pattern[1] is None
    assert numerical_rank(pattern[0]).tolist() == [64, 64]


def test_tupe_reset_adds_two_rank_one_columns():
    ranks = numerical_rank(position_pattern(model("tupe-a"), 96)[0])
    assert ranks.tolist() == [66, 66]
    no_reset = numerical_rank(position_pattern(model("tupe-a", tupe_reset=False), 96)[0])
    assert no_reset.tolist() == [64, 64]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_theorem_1_holds_for_a_model_in_any_precision_and_the_model_comes_back_as_it_was(dtype):
    """The ranks are taken on float64 logits of the model's own weights: a bfloat16 model's float32 rounding
    noise would otherwise read full rank (96) in every head of an input-additive model."""
    from dietpe.analysis import analyze

    m = model("absolute", segment="input").to(dtype)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    ids = torch.randperm(995)[:192].view(2, 96) + 5
    a = analyze(m, {"input_ids": ids})
    assert a.ranks["full logits"].max() <= 64  # d_h
    after = m.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


def test_a_padded_batch_and_a_causal_lm_are_refused_naming_why():
    from dietpe.analysis import analyze
    from dietpe.errors import InputError
    from dietpe.models.causal import DietCausalConfig, DietForCausalLM

    ids = torch.randint(5, 1000, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    with pytest.raises(InputError, match="padding"):
        analyze(model("diet-rel"), {"input_ids": ids, "attention_mask": mask})
    lm = DietForCausalLM(DietCausalConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64, position="alibi"))
    with pytest.raises(InputError, match="causal LM"):
        analyze(lm, ids)


@pytest.mark.parametrize("kwargs, words", [(dict(length=2), "length=2 must be an integer >= 3"),
                                           (dict(length=0), "length=0"), (dict(batch_size=0), "batch_size=0")])
def test_sample_batch_refuses_sizes_it_cannot_cut(kwargs, words):
    from dietpe.analysis import sample_batch
    from dietpe.data.tokenizer import train_wordpiece
    from dietpe.errors import InputError

    tok = train_wordpiece(["the cat sat on the mat"] * 20, vocab_size=60, min_frequency=1)
    with pytest.raises(InputError, match=words):
        sample_batch(tok, ["the cat sat on the mat"], **kwargs)
