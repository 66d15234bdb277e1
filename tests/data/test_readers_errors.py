"""The data readers on real-world files: a UTF-8 byte-order mark (some official GLUE downloads have one), corpus
folders in other common layouts, and invalid UTF-8 named by file and line (not a byte offset in a chunk)."""

import json

import pytest

from dietpe.data import corpus as C
from dietpe.data import tasks as T
from dietpe.data.parallel import read_lines
from dietpe.data.text import iter_lines, read_text
from dietpe.errors import DataError

BOM = "\ufeff"


def _write(path, text, encoding="utf-8"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode(encoding))
    return path


def test_glue_tsvs_that_begin_with_a_byte_order_mark_read(tmp_path):
    d = tmp_path / "SST-2"
    _write(d / "train.tsv", BOM + "sentence\tlabel\ngood .\t1\nbad .\t0\n")
    _write(d / "dev.tsv", BOM + "sentence\tlabel\r\nok .\t1\r\n")
    data = T.load_task(str(d))
    assert [(e.text_a, e.label) for e in data.train] == [("good .", 1), ("bad .", 0)]
    assert data.evals["dev"][0].label == 1
    cola = tmp_path / "CoLA"
    _write(cola / "train.tsv", BOM + "gj04\t1\t\tThe cat sat.\n")
    _write(cola / "dev.tsv", "gj04\t0\t*\tCat the sat.\n")
    assert T.load_task(str(cola)).train[0].text_a == "The cat sat."
    generic = tmp_path / "mine"
    _write(generic / "train.tsv", BOM + "sentence\tlabel\na .\tx\nb .\ty\n")
    _write(generic / "dev.tsv", "sentence\tlabel\na .\tx\n")
    assert T.load_task(str(generic), "tsv").spec.labels == ("x", "y")


def test_squad_json_corpora_and_parallel_files_with_a_byte_order_mark_read(tmp_path):
    doc = {"data": [{"paragraphs": [{"context": "the cat sat .", "qas": [
        {"id": "1", "question": "who sat ?", "answers": [{"text": "the cat", "answer_start": 0}]}]}]}]}
    assert T.read_squad(_write(tmp_path / "q.json", BOM + json.dumps(doc)))[0].id == "1"
    assert C.read_file(_write(tmp_path / "c.tsv", BOM + "text\nthe cat sat . it ran .\n")) == [
        ["the cat sat .", "it ran ."]]
    assert C.read_file(_write(tmp_path / "c.jsonl", BOM + '{"text": "a b ."}\n')) == [["a b ."]]
    assert C.read_file(_write(tmp_path / "c.txt", BOM + "a b .\n")) == [["a b ."]]
    assert read_lines(_write(tmp_path / "p.de", BOM + "w1 w2\nw3\n")) == ["w1 w2", "w3"]


@pytest.mark.parametrize("train, valid", [
    ("train.txt", "valid.txt"), ("ptb.train.txt", "ptb.valid.txt"), ("wiki.train.tokens", "wiki.valid.tokens"),
    ("wiki.train.raw", "wiki.valid.raw"), ("corpus-train.txt", "corpus-dev.txt"), ("my_train.jsonl", "my_val.jsonl"),
    ("wikitext-2-raw/wiki.train.raw", "wikitext-2-raw/wiki.valid.raw"),  # an unpacked archive's one folder
])
def test_corpus_folders_in_common_layouts_are_found(tmp_path, train, valid):
    line = '{"text": "the cat sat ."}\n' if train.endswith(".jsonl") else "the cat sat .\n"
    _write(tmp_path / train, line * 3)
    _write(tmp_path / valid, line)
    _write(tmp_path / (train.rsplit("/", 1)[0] + "/README.md" if "/" in train else "README.md"), "notes\n")
    docs, origin = C.read_corpus(str(tmp_path), "train")
    assert origin.endswith(train) and docs
    val, val_origin = C.read_corpus(str(tmp_path), "validation")
    assert val_origin.endswith(valid) and val


def test_a_folder_without_a_train_file_says_what_it_holds(tmp_path):
    _write(tmp_path / "notes.md", "x\n")
    with pytest.raises(DataError, match=r"no train file found .* the folder holds notes\.md"):
        C.read_corpus(str(tmp_path))
    _write(tmp_path / "a.train.txt", "x .\n")
    _write(tmp_path / "b.train.txt", "y .\n")
    with pytest.raises(DataError, match=r"several train files \(a\.train\.txt, b\.train\.txt\)"):
        C.read_corpus(str(tmp_path))
    mixed = tmp_path / "mixed"  # one split in two formats: neither is silently preferred
    _write(mixed / "train.txt", "x .\n")
    _write(mixed / "train.jsonl", '{"text": "y ."}\n')
    with pytest.raises(DataError, match=r"several train files \(train\.txt, train\.jsonl\)"):
        C.read_corpus(str(mixed))


def test_invalid_utf8_is_named_by_file_line_and_column_far_past_the_first_read_chunk(tmp_path):
    good = "".join(f"line {i} of a long corpus .\n" for i in range(20000)).encode()  # far past one read chunk
    f = _write(tmp_path / "big.txt", good + b"ok ok caf\xe9 .\n")
    with pytest.raises(DataError, match=rf"^{f}:20001: not UTF-8 text \(byte 0xe9 at column 10"):
        C.read_corpus(str(f))
    with pytest.raises(DataError, match=rf"^{f}:20001: "):
        read_text(f)
    with pytest.raises(DataError, match=rf"^{f}:20001: "):
        list(iter_lines(f))
    tsv = _write(tmp_path / "SST-2" / "train.tsv", b"sentence\tlabel\ngood .\t1\n\xff\t0\n")
    _write(tmp_path / "SST-2" / "dev.tsv", "sentence\tlabel\nok .\t1\n")
    with pytest.raises(DataError, match=rf"^{tsv}:3: not UTF-8"):
        T.load_task(str(tmp_path / "SST-2"))
    squad = _write(tmp_path / "q.json", b'{"data": [\n{"title": "caf\xe9"}]}')
    with pytest.raises(DataError, match=rf"^{squad}:2: not UTF-8"):
        T.read_squad(squad)
    par = _write(tmp_path / "p.de", b"w1\nw2 \xc3\n")
    with pytest.raises(DataError, match=rf"^{par}:2: not UTF-8"):
        read_lines(par)


@pytest.mark.parametrize("doc, where, expected", [
    ([], "", "an object with a 'data' list, found a list"),
    ({"data": [["x"]]}, "data[0]", "expected an object"),
    ({"data": [{"paragraphs": {"a": 1}}]}, "data[0].paragraphs", "expected a list, found an object"),
    ({"data": [{"paragraphs": [{"context": "c", "qas": [7]}]}]}, "data[0].paragraphs[0].qas[0]",
     "expected an object"),
    ({"data": [{"paragraphs": [{"context": "c", "qas": [{"id": 1, "question": "q", "answers": "c"}]}]}]},
     "qas[0].answers", "expected a list, found a string"),
    ({"data": [{"paragraphs": [{"context": "c", "qas": [{"id": 1, "question": "q", "answers": [None]}]}]}]},
     "qas[0].answers[0]", "an answer needs 'text'"),
])
def test_squad_json_of_the_wrong_shape_names_the_file_the_place_and_what_was_expected(tmp_path, doc, where,
                                                                                       expected):
    f = _write(tmp_path / "train.json", json.dumps(doc))
    with pytest.raises(DataError) as e:
        T.read_squad(f)
    assert str(e.value).startswith(str(f)) and where in str(e.value) and expected in str(e.value)


def test_doc_stride_must_leave_room_for_context(tmp_path):
    from dietpe.data.qa import encode_train
    from dietpe.data.tokenizer import train_wordpiece
    from dietpe.errors import ConfigError

    tok = train_wordpiece(["the cat sat on the mat near the river ."] * 5, vocab_size=60, min_frequency=1)
    ex = [T.QAExample("1", "the cat", "the cat sat on the mat near the river .",
                      [{"text": "the mat", "answer_start": 15}], "f.json: data[0].paragraphs[0].qas[0]")]
    assert encode_train(ex, tok, 12, 3)  # room 12 - 3 - 2 = 7 > 3
    with pytest.raises(ConfigError, match=r"--doc-stride 7 must be less than 7, .*--ft-max-length 12"):
        encode_train(ex, tok, 12, 7)
    with pytest.raises(ConfigError, match=r"qas\[0\]: the question is 2 tokens, leaving no room"):
        encode_train(ex, tok, 5, 0)
