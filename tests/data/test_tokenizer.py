"""WordPiece training and loading."""

import pytest

from diet.data.tokenizer import load_tokenizer, train_wordpiece
from diet.errors import DataError

TEXT = ["the cat sat on the mat .", "the dog sat on the log .", "a cat and a dog ."] * 5


def test_trained_tokenizer_has_bert_special_tokens_and_pairs():
    tok = train_wordpiece(TEXT, vocab_size=200)
    assert tok.pad_token_id == 0
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    enc = tok("the cat", "a dog")
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert tokens == ["[CLS]", "the", "cat", "[SEP]", "a", "dog", "[SEP]"]
    assert enc["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]


def test_save_and_load_round_trip(tmp_path):
    tok = train_wordpiece(TEXT, vocab_size=200)
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again("the dog sat")["input_ids"] == tok("the dog sat")["input_ids"]
    assert len(again) == len(tok)


def test_loading_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match=str(bad)):
        load_tokenizer(bad)


def test_empty_text_is_refused():
    with pytest.raises(DataError, match="empty"):
        train_wordpiece([], vocab_size=100)
