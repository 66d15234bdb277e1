"""Span question answering (SQuAD v1.1 style, as BERT fine-tunes it): question and context go in as two
segments, long contexts are cut into overlapping windows (`doc_stride` tokens of overlap, or starts `doc_step`
apart as BERT's run_squad and XTREME cut them), the model predicts start and end logits, and the answer is the
best-scoring valid span of the context (start <= end, at most `max_answer_length` tokens), mapped back to the
original text through the tokenizer's offsets.
"""

from __future__ import annotations

import unicodedata
from collections import defaultdict

import numpy as np

from dietpe.data.tasks import QAExample
from dietpe.errors import ConfigError

SPECIAL = 3  # [CLS] question [SEP] context [SEP]


def check_windows(examples: list[QAExample], tokenizer, max_length: int, doc_stride: int,
                  doc_step: int | None = None) -> list[int]:
    """Every question must leave room for context in a window, and the stride (the overlap of windows) must be
    smaller than that room; otherwise the tokenizer stops with an error or a Rust panic. Names the question.
    With `doc_step` (the windows' starts that far apart) the overlap is each question's room less the step.
    Returns the questions' lengths in tokens."""
    if not examples:
        return []
    lengths = [len(ids) for ids in tokenizer([e.question for e in examples], add_special_tokens=False)["input_ids"]]
    i = max(range(len(examples)), key=lengths.__getitem__)
    room = max_length - SPECIAL - lengths[i]
    if room < 1:
        raise ConfigError(f"{examples[i].where}: the question is {lengths[i]} tokens, leaving no room for the "
                          f"context within --ft-max-length {max_length} ({SPECIAL} special tokens); raise "
                          f"--ft-max-length")
    if doc_step is None and doc_stride >= room:
        raise ConfigError(f"--doc-stride {doc_stride} must be less than {room}, the room for context that "
                          f"--ft-max-length {max_length} leaves after {SPECIAL} special tokens and the longest "
                          f"question ({lengths[i]} tokens, {examples[i].where}); lower --doc-stride or raise "
                          f"--ft-max-length")
    return lengths


def windows(examples: list[QAExample], tokenizer, max_length: int, doc_stride: int, doc_step: int | None = None):
    """The context windows of every question, in the questions' order: (example index, encoding, window) per
    window, `encoding` the tokenizer's output holding it (its `sequence_ids(window)`, offsets, ids). Windows
    overlap by `doc_stride` tokens; with `doc_step`, by each question's room less the step (at least 0), so
    their starts lie `doc_step` apart as in BERT's run_squad, whose `doc_stride` means that distance."""
    lengths = check_windows(examples, tokenizer, max_length, doc_stride, doc_step)
    groups = defaultdict(list)  # overlap -> example indices (one tokenizer call per overlap)
    for i, n in enumerate(lengths):
        groups[doc_stride if doc_step is None else max(0, max_length - SPECIAL - n - doc_step)].append(i)
    out = []
    for overlap, indices in groups.items():
        enc = tokenizer([examples[i].question for i in indices], [examples[i].context for i in indices],
                        truncation="only_second", max_length=max_length, stride=overlap,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
        out += [(indices[k], enc, w) for w, k in enumerate(enc["overflow_to_sample_mapping"])]
    return sorted(out, key=lambda window: window[0])  # stable: an example's windows stay in order


def encode_train(examples: list[QAExample], tokenizer, max_length: int, doc_stride: int,
                 doc_step: int | None = None) -> list[dict]:
    """Training features: windows with the first answer's token span (or [CLS] when the window lacks it)."""
    features = []
    for index, enc, i in windows(examples, tokenizer, max_length, doc_stride, doc_step):
        ex, offsets = examples[index], enc["offset_mapping"][i]
        answer = ex.answers[0]
        start_char, end_char = answer["answer_start"], answer["answer_start"] + len(answer["text"])
        types = enc.sequence_ids(i)
        ctx = [k for k, t in enumerate(types) if t == 1]
        start = end = 0
        if ctx and offsets[ctx[0]][0] <= start_char and offsets[ctx[-1]][1] >= end_char:
            start = next(k for k in ctx if offsets[k][1] > start_char)
            end = next(k for k in reversed(ctx) if offsets[k][0] < end_char)
        features.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                         "attention_mask": enc["attention_mask"][i], "start_positions": start,
                         "end_positions": end})
    return features


def encode_eval(examples: list[QAExample], tokenizer, max_length: int, doc_stride: int,
                doc_step: int | None = None):
    """Evaluation features and, per feature, (example index, offsets with None outside the context)."""
    features, meta = [], []
    for index, enc, i in windows(examples, tokenizer, max_length, doc_stride, doc_step):
        types = enc.sequence_ids(i)
        meta.append((index, [o if t == 1 else None for o, t in zip(enc["offset_mapping"][i], types)]))
        features.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                         "attention_mask": enc["attention_mask"][i]})
    return features, meta


def best_answers(examples: list[QAExample], meta, start_logits, end_logits, n_best: int = 20,
                 max_answer_length: int = 30) -> dict[str, str]:
    """The highest-scoring valid span per question, over all its windows."""
    by_example = defaultdict(list)
    for f, (ex_index, _) in enumerate(meta):
        by_example[ex_index].append(f)
    predictions = {}
    for ex_index, feats in by_example.items():
        ex = examples[ex_index]
        best_score, best_text = -np.inf, ""
        for f in feats:
            offsets = meta[f][1]
            s_log, e_log = np.asarray(start_logits[f]), np.asarray(end_logits[f])
            n = len(offsets)
            for s in np.argsort(s_log[:n])[::-1][:n_best]:
                if offsets[s] is None:
                    continue
                for e in np.argsort(e_log[:n])[::-1][:n_best]:
                    if offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                        continue
                    score = s_log[s] + e_log[e]
                    if score > best_score:
                        best_score, best_text = score, ex.context[offsets[s][0]:_span_end(ex.context, offsets[e][1])]
        predictions[ex.id] = best_text
    return predictions


def _span_end(context: str, end: int) -> int:
    """`end` moved past the combining marks right after it: a normaliser that strips accents (BERT's uncased
    WordPiece) ends a token's offsets before the Devanagari vowel sign or Thai tone mark it dropped."""
    while end < len(context) and unicodedata.category(context[end]).startswith("M"):
        end += 1
    return end
