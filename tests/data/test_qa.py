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
