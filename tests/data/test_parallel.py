"""Parallel text: aligned reading, counted skips, errors naming file and line, an exactly reversible vocabulary."""

import pytest

from dietpe import DataError
from dietpe.data.parallel import (
    SPECIAL_TOKENS,
    encode_pairs,
    encode_sources,
    find_split,
    load_joint_tokenizer,
    read_lines,
    read_parallel,
    train_joint_bpe,
)

SENTENCES = ["a man rides a red bike .", "two dogs play in the snow", "Eine Frau liest ein Buch.",
             "Ein Kind spielt im Park, lachend!", "the women are walking ; \"quoted\" text"] * 4


@pytest.fixture(scope="module")
def tokenizer():
    return train_joint_bpe(SENTENCES, vocab_size=200, min_frequency=1)


def test_read_lines_counts_like_wc(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"one\r\ntwo  \n\nfour\xe2\x80\xa8still four\n")  # U+2028 is not a line end here
    assert read_lines(f) == ["one", "two", "", "four\u2028still four"]


def test_read_lines_names_the_line_of_bad_utf8(tmp_path):
    f = tmp_path / "bad.de"
    f.write_bytes(b"gut\nauch gut\nschlecht \xff\n")
    with pytest.raises(DataError, match=r"bad\.de:3: not UTF-8"):
        read_lines(f)


def test_mismatched_line_counts_are_refused(tmp_path):
    (tmp_path / "s").write_text("a\nb\nc\n")
    (tmp_path / "t").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"s has 3 lines but .*t has 2"):
        read_parallel(tmp_path / "s", tmp_path / "t")
    (tmp_path / "empty").write_text("")
    with pytest.raises(DataError, match="empty"):
        read_parallel(tmp_path / "empty", None)
    with pytest.raises(DataError, match="no such file"):
        read_parallel(tmp_path / "missing", None)


def test_find_split(tmp_path):
    (tmp_path / "train.de").write_text("x\n")
    (tmp_path / "dev.de").write_text("x\n")
    assert find_split(tmp_path, "train", "de").name == "train.de"
    assert find_split(tmp_path, "valid", "de").name == "dev.de"
    with pytest.raises(DataError, match="tried val.en, valid.en"):
        find_split(tmp_path, "valid", "en")


def test_joint_bpe_layout_and_exact_detokenisation(tokenizer, tmp_path):
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    for text in SENTENCES[:5]:
        ids = tokenizer(text)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id and ids.count(tokenizer.eos_token_id) == 1
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    tokenizer.save_pretrained(tmp_path)
    assert load_joint_tokenizer(tmp_path)("a red bike")["input_ids"] == tokenizer("a red bike")["input_ids"]
    with pytest.raises(DataError, match="no tokenizer"):
        load_joint_tokenizer(tmp_path / "nowhere")


def test_bad_pairs_are_skipped_and_counted(tokenizer):
    src = ["a man rides", "", "two dogs", "a man rides a red bike . " * 5, "Eine Frau"]
    tgt = ["Ein Mann", "Ein Kind", "", "Ein Mann", "a woman"]
    pairs, report = encode_pairs(tokenizer, src, tgt, max_source_length=12, max_target_length=12)
    assert report.total == 5 and report.kept == 2 == len(pairs)
    assert report.empty == [2, 3] and report.too_long == [4]
    assert "2 skipped for an empty line (lines 2, 3)" in report.summary("train")
    assert pairs[0]["input_ids"] == tokenizer("a man rides")["input_ids"]
    assert pairs[1]["labels"] == tokenizer("a woman")["input_ids"]


def test_bad_pairs_can_be_errors_naming_file_and_line(tokenizer):
    files = ("train.de", "train.en")
    with pytest.raises(DataError, match=r"train\.en:1: empty line"):
        encode_pairs(tokenizer, ["a"], [""], 10, 10, bad="error", files=files)
    with pytest.raises(DataError, match=r"train\.de:2: \d+ tokens .* exceed the limit of 4"):
        encode_pairs(tokenizer, ["a", "a man rides a red bike"], ["b", "c"], 4, 10, bad="error", files=files)


def test_sources_for_translation_are_refused_not_truncated(tokenizer):
    assert len(encode_sources(tokenizer, ["a man", "two dogs"], None)) == 2
    with pytest.raises(DataError, match=r"val\.de:2: empty line"):
        encode_sources(tokenizer, ["a man", ""], None, "val.de")
    with pytest.raises(DataError, match=r"val\.de:1: \d+ tokens .* exceed 3"):
        encode_sources(tokenizer, ["a man rides a red bike"], 3, "val.de")
