"""Span QA's windows and answers: a perfect model's logits give the gold text back, combining marks included
where BERT's uncased normaliser strips them from the tokens (Hindi vowel signs, Thai tone marks)."""

import numpy as np
import pytest

from dietpe.data.qa import best_answers, encode_eval, encode_train
from dietpe.data.tasks import QAExample
from dietpe.data.tokenizer import TokenizerSpec, train_tokenizer


@pytest.mark.parametrize("context,answer,question", [
    ("सुपर बाउल में जॉन एलवे ने खेला।", "जॉन एलवे", "किसने खेला?"),
    ("เขาได้รับรางวัล สี่ ครั้ง ในปีนั้น", "สี่", "กี่ครั้ง"),
    ("Ha Noi la thu đo cu\u0309a Vie\u0323t Nam", "Vie\u0323t", "thu do?"),  # decomposed accents
    ("The capital of France is Paris, by the Seine.", "Paris", "What is the capital?"),
], ids=["hindi", "thai", "decomposed", "english"])
def test_the_gold_span_gives_the_gold_text(context, answer, question):
    ex = [QAExample("q1", question, context, [{"text": answer, "answer_start": context.index(answer)}], "x")]
    tokenizer = train_tokenizer([context, question] * 5, TokenizerSpec("wordpiece", 200, min_frequency=1))
    train = encode_train(ex, tokenizer, 64, 16)
    _, meta = encode_eval(ex, tokenizer, 64, 16)
    n = len(meta[0][1])
    start, end = np.full(n, -10.0), np.full(n, -10.0)
    start[train[0]["start_positions"]], end[train[0]["end_positions"]] = 10.0, 10.0
    assert best_answers(ex, meta, [start], [end]) == {"q1": answer}


def run_squad_starts(n: int, room: int, step: int) -> list[int]:
    """BERT's run_squad.py: the context's windows of at most `room` tokens, their starts `step` apart, the last
    one where a window reaches the end."""
    starts, start = [], 0
    while start < n:
        starts.append(start)
        if start + min(n - start, room) == n:
            break
        start += min(n - start, step)
    return starts


@pytest.mark.parametrize("words", [5, 40, 77])
def test_windows_a_step_apart_are_run_squads(words):
    context = " ".join(f"w{k % 13}" for k in range(words))
    questions = ["q?", "a much longer question about w1 w2 w3 ?"]  # two lengths: two rooms, one step
    examples = [QAExample(f"q{i}", q, context, [{"text": "w0", "answer_start": 0}], "x")
                for i, q in enumerate(questions)]
    tokenizer = train_tokenizer([context] + questions, TokenizerSpec("wordpiece", 200, min_frequency=1))
    n = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    max_length, step = 24, 5
    features, meta = encode_eval(examples, tokenizer, max_length, doc_stride=0, doc_step=step)
    assert [index for index, _ in meta] == sorted(index for index, _ in meta)  # the questions' order
    for index, question in enumerate(questions):
        room = max_length - 3 - len(tokenizer(question, add_special_tokens=False)["input_ids"])
        token_starts = [offsets for i, offsets in meta if i == index]
        firsts = [next(k for k, o in enumerate(offsets) if o is not None) for offsets in token_starts]
        # the window's first context token is token `start` of the context: its offsets say which
        all_offsets = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        starts = [all_offsets.index(tuple(offsets[f])) for offsets, f in zip(token_starts, firsts)]
        assert starts == run_squad_starts(n, room, step)
    train = encode_train(examples, tokenizer, max_length, doc_stride=0, doc_step=step)
    assert [f["input_ids"] for f in train] == [f["input_ids"] for f in features]
