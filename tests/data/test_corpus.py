"""Reading pre-training corpora: local layouts, errors, Hugging Face names without a network."""

import json

import pytest

from dietpe.data import corpus as C
from dietpe.errors import DataError


def test_text_file_blank_lines_end_documents_and_sentences_are_split(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text(" = Title = \n The cat sat . It slept . \n\n Another document here .\n")
    docs, origin = C.read_corpus(str(f))
    assert origin == str(f)
    assert docs == [["= Title =", "The cat sat .", "It slept ."], ["Another document here ."]]


def test_directory_layout_finds_train_and_validation(tmp_path):
    (tmp_path / "train.txt").write_text("a b .\n\nc d .\n")
    (tmp_path / "valid.txt").write_text("e f .\n")
    assert C.read_corpus(str(tmp_path), "train")[0] == [["a b ."], ["c d ."]]
    assert C.read_corpus(str(tmp_path), "validation")[0] == [["e f ."]]
    (tmp_path / "valid.txt").unlink()
    assert C.read_corpus(str(tmp_path), "validation")[0] == []  # the caller holds out part of train


def test_jsonl_errors_name_file_and_line(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "one. two."}) + "\n{broken\n")
    with pytest.raises(DataError, match=rf"{f}:2: not valid JSON"):
        C.read_corpus(str(f))
    f.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DataError, match=rf"{f}:1: .*'text'"):
        C.read_corpus(str(f))


def test_tsv_needs_a_text_column(tmp_path):
    f = tmp_path / "c.tsv"
    f.write_text("id\tcontent\n1\thello\n")
    with pytest.raises(DataError, match=rf"{f}:1: .*'text'"):
        C.read_corpus(str(f))
    f.write_text("id\ttext\n1\thello there. bye.\n")
    assert C.read_corpus(str(f))[0] == [["hello there.", "bye."]]


def test_empty_and_missing_corpora_are_refused(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("\n \n")
    with pytest.raises(DataError, match="empty"):
        C.read_corpus(str(f))
    with pytest.raises(DataError, match="no such file"):
        C.read_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(DataError, match="no train file"):
        C.read_corpus(str(tmp_path / ""), "train") if False else C.read_corpus(str(_empty_dir(tmp_path)))


def _empty_dir(tmp_path):
    d = tmp_path / "nothing"
    d.mkdir()
    return d


def test_hugging_face_name_without_network_says_so(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    assert C.is_hf_name("wikitext:wikitext-2-raw-v1")
    with pytest.raises(DataError, match="no network"):
        C.read_corpus("wikitext:wikitext-2-raw-v1")


def test_hugging_face_rows_become_documents(monkeypatch):
    import datasets

    rows = datasets.Dataset.from_dict({"text": [" = T = ", " Some text . More . ", "", " Next doc . "]})
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.DatasetDict(train=rows))
    docs, origin = C.read_corpus("someone/corpus", "train")
    assert docs == [["= T =", "Some text .", "More ."], ["Next doc ."]]
    assert "huggingface:someone/corpus" in origin


def test_a_mistyped_path_under_a_local_folder_is_no_dataset_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    assert not C.is_hf_name("data/wikitext") and C.is_hf_name("wikimedia/wikipedia:20231101.en")
    with pytest.raises(DataError, match="^data/wikitext: no such file or directory$"):
        C.read_corpus("data/wikitext")
