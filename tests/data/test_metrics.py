"""Official metrics against hand-computed values and the SQuAD v1.1 script's behaviour."""

import math

import numpy as np
import pytest

from dietpe.data import metrics as M


def test_matthews_f1_accuracy_on_a_confusion_table():
    # tp=3, tn=2, fp=1, fn=2
    gold = [1, 1, 1, 1, 1, 0, 0, 0]
    pred = [1, 1, 1, 0, 0, 1, 0, 0]
    mcc = (3 * 2 - 1 * 2) / math.sqrt(4 * 5 * 3 * 4)
    assert M.matthews(pred, gold) == pytest.approx(100 * mcc)
    assert M.f1_binary(pred, gold) == pytest.approx(100 * 2 * 3 / (2 * 3 + 1 + 2))
    assert M.accuracy(pred, gold) == pytest.approx(100 * 5 / 8)
    assert M.matthews([1] * 8, gold) == 0.0  # constant predictions: no correlation


def test_pearson_and_spearman_with_ties():
    x = [1.0, 2.0, 2.0, 3.0, 5.0]
    y = [2.0, 1.0, 4.0, 3.0, 9.0]
    assert M.pearson(x, y) == pytest.approx(100 * np.corrcoef(x, y)[0, 1])
    rx, ry = [1, 2.5, 2.5, 4, 5], [2, 1, 4, 3, 5]  # average ranks for the tie
    assert M.spearman(x, y) == pytest.approx(100 * np.corrcoef(rx, ry)[0, 1])
    assert M.spearman([1, 2, 3], [10, 20, 1000]) == pytest.approx(100.0)


def test_nan_predictions_give_nan_for_both_correlations():
    """A diverged run's predictions are no score: not 0 (all NaN) or a rank of NaN among numbers."""
    gold = [1.0, 2.0, 3.0, 4.0]
    for pred in ([math.nan] * 4, [1.0, math.nan, 3.0, 2.0]):
        assert math.isnan(M.pearson(pred, gold)) and math.isnan(M.spearman(pred, gold))


def test_squad_normalisation_and_scores():
    assert M.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert M.squad_em("the Eiffel Tower", "Eiffel Tower.") == 1.0
    assert M.squad_f1("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 * 0.5 * 1 / 1.5)
    scores = M.squad_scores({"a": "Paris", "b": "in London"},
                            {"a": ["Paris", "paris France"], "b": ["London"], "c": ["Rome"]})
    assert scores["exact_match"] == pytest.approx(100 / 3)  # "c" has no prediction: 0
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)


def test_mlqa_normalisation_is_per_language():
    from dietpe.data.metrics import mlqa_normalize, squad_scores

    assert mlqa_normalize("Der Hund, «das» Tier!", "de") == "hund tier"  # German articles, Unicode punctuation
    assert mlqa_normalize("El perro", "es") == "perro" and mlqa_normalize("The dog", "en") == "dog"
    assert mlqa_normalize("北京大学，2008年", "zh") == "北 京 大 学 2008 年"  # characters, as MLQA's script
    assert mlqa_normalize("the «x»", "xx") == "«x»"  # outside MLQA's languages: SQuAD's
    # Chinese: one wrong character of four still shares three tokens (SQuAD's split would give F1 0)
    scores = squad_scores({"q": "北京大楼"}, {"q": ["北京大学"]}, lang="zh")
    assert scores["f1"] == pytest.approx(75.0) and scores["exact_match"] == 0.0
    assert squad_scores({"q": "北京大楼"}, {"q": ["北京大学"]})["f1"] == 0.0
