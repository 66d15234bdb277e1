"""TUPE Fig. 2: the first layer's content logits of an input-position model split into word-to-word,
word-to-position, position-to-word and position-to-position correlations (eq. 6)."""

import math

import pytest
import torch

from dietpe import DietConfig, DietModel
from dietpe.analysis import attention_logits, report
from dietpe.analysis.correlations import TERMS, four_correlations, has_input_positions


def model(position="absolute", **overrides):
    cfg = DietConfig.from_preset("bert-tiny", position=position, vocab_size=100, max_position_embeddings=32,
                                 hidden_size=32, intermediate_size=64, **overrides)
    torch.manual_seed(0)
    m = DietModel(cfg).eval()
    with torch.no_grad():  # a trained norm is not the identity: the split must carry γ, β and σ
        for p in (m.embeddings.LayerNorm.weight, m.embeddings.LayerNorm.bias):
            p.add_(torch.randn_like(p) * 0.3)
    return m


def batch():
    ids = torch.randint(1, 100, (3, 12), generator=torch.Generator().manual_seed(1))
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return {"input_ids": ids, "token_type_ids": types}


@pytest.mark.parametrize("spec", [dict(position="absolute"), dict(position="sinusoidal", position_scale=0.2),
                                  dict(position="t5", input_positions=True)])  # BERT-A, sinusoids, BERT-R
def test_the_four_terms_add_up_to_the_first_layers_content_logits(spec):
    m = model(**spec)
    terms = four_correlations(m, batch())
    assert list(terms) == list(TERMS)
    content = attention_logits(m, batch())[0].content
    torch.testing.assert_close(sum(terms.values()), content, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_terms_follow_eq_6_for_one_pair():
    """(x_i W_Q)(y_j W_K)ᵀ/√d_h with x, y the word and position parts of LN(w + p + s), written out for (i, j)."""
    m = model()
    b = batch()
    terms = four_correlations(m, b)
    ln, attn = m.embeddings.LayerNorm, m.layers[0].attention
    ids, types = b["input_ids"][1], b["token_type_ids"][1]
    w = m.embeddings.word_embeddings.weight[ids] + m.positions.input_segments.weight[types]  # (L, D)
    p = m.positions.method.weight[: len(ids)]
    sigma = torch.stack([torch.sqrt(((w[t] + p[t]) - (w[t] + p[t]).mean()).pow(2).mean() + ln.eps)
                         for t in range(len(ids))])
    part = {"word": [ln.weight * (w[t] - w[t].mean()) / sigma[t] + ln.bias for t in range(len(ids))],
            "position": [ln.weight * (p[t] - p[t].mean()) / sigma[t] for t in range(len(ids))]}
    dh, head, i, j = attn.head_size, 1, 4, 9
    heads = slice(head * dh, (head + 1) * dh)
    for name in TERMS:
        a, _, bb = name.split("-")
        q = attn.query.weight[heads] @ part[a][i] + (attn.query.bias[heads] if a == "word" else 0)
        k = attn.key.weight[heads] @ part[bb][j] + (attn.key.bias[heads] if bb == "word" else 0)
        assert float(terms[name][1, head, i, j]) == pytest.approx(float(q @ k / math.sqrt(dh)), abs=1e-5)


def test_without_positions_the_position_terms_vanish():
    m = model()
    with torch.no_grad():
        m.positions.method.weight.zero_()
    terms = four_correlations(m, batch())
    for name in ("word-to-position", "position-to-word", "position-to-position"):
        assert float(terms[name].abs().max()) == 0.0


@pytest.mark.parametrize("position", ["diet-rel", "diet-abs", "rotary", "tupe-a", "none"])
def test_models_without_input_positions_have_no_four_terms(position):
    m = model(position)
    assert not has_input_positions(m)
    with pytest.raises(ValueError, match="eq. 6"):
        four_correlations(m, batch())


def test_the_report_draws_them_for_an_absolute_model(tmp_path):
    index = report(model(), batch(), tmp_path / "abs")
    assert "![correlations](correlations.png)" in index.read_text() and (tmp_path / "abs" / "correlations.png").is_file()
    index = report(model("diet-rel"), batch(), tmp_path / "rel")
    assert not (tmp_path / "rel" / "correlations.png").exists()
