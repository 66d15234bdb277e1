"""Official task metrics: GLUE's (Matthews correlation, Pearson/Spearman, F1, accuracy) and SQuAD v1.1's
F1 / exact match with the official `evaluate-v1.1.py` answer normalisation (lower-case, drop punctuation,
drop the articles a/an/the, squeeze white space; the maximum over the gold answers). MLQA's official script
(`mlqa_evaluation_v1.py`, which XTREME uses for MLQA) normalises per language: every Unicode punctuation mark,
the language's articles, and Chinese split into characters (`mlqa_normalize`).

All scores are returned in percent, as the papers' tables print them.
"""

from __future__ import annotations

import re
import string
import sys
import unicodedata
from collections import Counter
from functools import lru_cache
from collections.abc import Sequence

import numpy as np


def accuracy(pred: Sequence[int], gold: Sequence[int]) -> float:
    pred, gold = np.asarray(pred), np.asarray(gold)
    return float((pred == gold).mean() * 100)


def f1_binary(pred: Sequence[int], gold: Sequence[int]) -> float:
    """F1 of the positive class 1 (GLUE's MRPC and QQP)."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    tp = float(((pred == 1) & (gold == 1)).sum())
    fp = float(((pred == 1) & (gold == 0)).sum())
    fn = float(((pred == 0) & (gold == 1)).sum())
    return 0.0 if tp == 0 else 100 * 2 * tp / (2 * tp + fp + fn)


def matthews(pred: Sequence[int], gold: Sequence[int]) -> float:
    """Matthews correlation of binary predictions (CoLA); 0 when a row or column of the table is empty."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    tp = float(((pred == 1) & (gold == 1)).sum())
    tn = float(((pred == 0) & (gold == 0)).sum())
    fp = float(((pred == 1) & (gold == 0)).sum())
    fn = float(((pred == 0) & (gold == 1)).sum())
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denom == 0 else float(100 * (tp * tn - fp * fn) / denom)


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.std() == 0 or y.std() == 0:
        return 0.0
    return float(100 * np.corrcoef(x, y)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if np.isnan(x).any() or np.isnan(y).any():
        return float("nan")  # as pearson gives: a diverged run's predictions rank nothing
    return pearson(_ranks(x), _ranks(y))


CLASSIFICATION = {"accuracy": accuracy, "f1": f1_binary, "mcc": matthews}
REGRESSION = {"pearson": pearson, "spearman": spearman}


def task_metrics(names: Sequence[str], pred, gold) -> dict[str, float]:
    """The named metrics of predictions against gold labels."""
    table = {**CLASSIFICATION, **REGRESSION}
    return {name: table[name](pred, gold) for name in names}


def chance(names: Sequence[str], gold, num_labels: int) -> dict[str, float]:
    """Each metric's score of the best constant predictor on these gold labels: the majority-class rate for
    accuracy, all-positive F1, 0 for Matthews correlation; for regression (`num_labels` 1) predicting the mean,
    which correlates 0. What a model that ignored its input would reach."""
    gold = np.asarray(gold)
    if len(gold) == 0:
        return {name: float("nan") for name in names}
    if num_labels == 1:
        return task_metrics(names, np.full(len(gold), float(gold.mean())), gold)
    constants = [np.full(len(gold), c) for c in range(num_labels)]
    return {name: max(task_metrics([name], p, gold)[name] for p in constants) for name in names}


# -- SQuAD v1.1 ---------------------------------------------------------------------------------------------

def normalize_answer(s: str) -> str:
    """The official SQuAD v1.1 normalisation."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


@lru_cache(maxsize=1)
def _punctuation() -> frozenset:
    return frozenset(chr(i) for i in range(sys.maxunicode + 1)
                     if unicodedata.category(chr(i)).startswith("P")) | frozenset(string.punctuation)


MLQA_ARTICLES = {
    "en": r"\b(a|an|the)\b", "es": r"\b(un|una|unos|unas|el|la|los|las)\b",
    "vi": r"\b(của|là|cái|chiếc|những)\b",
    "de": r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b", "ar": r"\sال^|ال",
    "hi": None, "zh": None,  # no articles
}


def _mixed_segmentation(text: str, punctuation) -> list[str]:
    """MLQA's Chinese tokens: each CJK character and punctuation mark alone, other runs split on spaces."""
    out, run = [], ""
    for ch in text:
        if re.search(r"[\u4e00-\u9fa5]", ch) or ch in punctuation:
            out.extend(run.split())
            run = ""
            out.append(ch)
        else:
            run += ch
    return out + run.split()


def mlqa_normalize(s: str, lang: str) -> str:
    """MLQA's official answer normalisation for `lang`; SQuAD's for a language outside MLQA's seven."""
    if lang not in MLQA_ARTICLES:
        return normalize_answer(s)
    punctuation = _punctuation()
    s = "".join(ch for ch in s.lower() if ch not in punctuation)
    if MLQA_ARTICLES[lang]:
        s = re.sub(MLQA_ARTICLES[lang], " ", s)
    tokens = _mixed_segmentation(s, punctuation) if lang == "zh" else s.split()
    return " ".join(t for t in tokens if t.strip())


def squad_f1(prediction: str, truth: str, lang: str | None = None) -> float:
    norm = normalize_answer if lang is None else (lambda x: mlqa_normalize(x, lang))
    pred_tokens = norm(prediction).split()
    gold_tokens = norm(truth).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_em(prediction: str, truth: str, lang: str | None = None) -> float:
    norm = normalize_answer if lang is None else (lambda x: mlqa_normalize(x, lang))
    return float(norm(prediction) == norm(truth))


def squad_scores(predictions: dict[str, str], answers: dict[str, list[str]],
                 lang: str | None = None) -> dict[str, float]:
    """F1 and exact match (percent), each the max over gold answers, averaged over all questions in `answers`
    (a question without a prediction scores 0, as in the official script); with `lang`, MLQA's normalisation."""
    f1 = em = 0.0
    for qid, golds in answers.items():
        pred = predictions.get(qid, "")
        f1 += max(squad_f1(pred, g, lang) for g in golds)
        em += max(squad_em(pred, g, lang) for g in golds)
    n = max(len(answers), 1)
    return {"f1": 100 * f1 / n, "exact_match": 100 * em / n}
