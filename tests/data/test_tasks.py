"""Task readers: GLUE TSV layouts, XNLI per-language files, SQuAD JSON; errors name file and line."""

import json
from pathlib import Path

import pytest

from dietpe.data import tasks as T
from dietpe.errors import DataError


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_cola_has_no_header_and_reads_columns_1_and_3(tmp_path):
    d = tmp_path / "CoLA"
    _write(d / "train.tsv", "gj04\t1\t\tThe cat sat.\ngj04\t0\t*\tCat the sat.\n")
    _write(d / "dev.tsv", "gj04\t1\t\tA dog ran.")  # GLUE's dev.tsv has no final newline
    data = T.load_task(str(d))
    assert data.spec.name == "CoLA" and data.spec.metrics == ("mcc",)
    assert [(e.text_a, e.label) for e in data.train] == [("The cat sat.", 1), ("Cat the sat.", 0)]
    assert list(data.evals) == ["dev"] and data.evals["dev"][0].where == f"{d / 'dev.tsv'}:1"


def test_pair_tasks_read_two_segments_by_header_name(tmp_path):
    d = tmp_path / "STS-B"
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    _write(d / "train.tsv", head + "0\tg\tf\t2012\t0\tn\tn\tA man.\tA person.\t4.5\n")
    _write(d / "dev.tsv", head + "0\tg\tf\t2012\t0\tn\tn\tA cat.\tA dog.\t1.0\n")
    data = T.load_task(str(d))
    ex = data.train[0]
    assert (ex.text_a, ex.text_b, ex.label) == ("A man.", "A person.", 4.5)
    assert data.spec.kind == "regression" and data.spec.num_labels == 1


def test_mnli_has_two_dev_sets(tmp_path):
    d = tmp_path / "MNLI"
    head = "index\tpromptID\tpairID\tgenre\ts1bp\ts2bp\ts1p\ts2p\tsentence1\tsentence2\tlabel1\tgold_label\n"
    row = "0\t1\t2\tg\tx\tx\tx\tx\tP.\tH.\tneutral\tneutral\n"
    for f in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        _write(d / f, head + row)
    data = T.load_task(str(d))
    assert set(data.evals) == {"dev_matched", "dev_mismatched"}
    assert data.train[0].label == T.NLI_LABELS.index("neutral")


def test_a_label_outside_the_task_is_an_error_naming_file_and_line(tmp_path):
    d = tmp_path / "SST-2"
    f = _write(d / "train.tsv", "sentence\tlabel\ngood .\t1\nbad .\t7\n")
    _write(d / "dev.tsv", "sentence\tlabel\nok .\t0\n")
    with pytest.raises(DataError, match=rf"{f}:3: label '7' is not one of SST-2's labels"):
        T.load_task(str(d))


def test_malformed_lines_and_values(tmp_path):
    d = tmp_path / "STS-B"
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    f = _write(d / "train.tsv", head + "0\tg\tf\n")
    with pytest.raises(DataError, match=rf"{f}:2: 3 tab-separated columns"):
        T.read_tsv(f, T.GLUE["sts-b"])
    _write(f, head + "0\tg\tf\t2012\t0\tn\tn\tA.\tB.\t7.5\n")
    with pytest.raises(DataError, match=rf"{f}:2: label 7.5 lies outside STS-B's range"):
        T.read_tsv(f, T.GLUE["sts-b"])
    _write(f, "wrong\theader\n")
    with pytest.raises(DataError, match=rf"{f}:1: the header lacks the column 'sentence1'"):
        T.read_tsv(f, T.GLUE["sts-b"])
    with pytest.raises(DataError, match="no such file"):
        T.read_tsv(tmp_path / "missing.tsv", T.GLUE["sst-2"])


def test_a_tab_inside_a_text_is_an_error_not_a_shorter_sentence(tmp_path):
    """A row wider than the header (or, in a file without one such as CoLA's, than its first row) has a tab in a
    text: reading the cells by index would keep the text up to the tab and drop the rest without a word."""
    cola = _write(tmp_path / "cola.tsv", "gj04\t1\t\tOne sentence.\ngj04\t1\t\tA sentence\twith a tab.\n")
    with pytest.raises(DataError, match=rf"{cola}:2: 5 tab-separated columns where line 1 has 4"):
        T.read_tsv(cola, T.GLUE["cola"])
    sst = _write(tmp_path / "sst.tsv", "sentence\tlabel\ngood .\t1\ngood\t.\t1\n")
    with pytest.raises(DataError, match=rf"{sst}:3: 3 tab-separated columns where the header has 2"):
        T.read_tsv(sst, T.GLUE["sst-2"])


def test_xnli_zero_shot_layout(tmp_path):
    d = tmp_path / "xnli"
    for lang in ("en", "de", "fr"):
        _write(d / f"dev-{lang}.tsv", "P.\tH.\tentailment\nP2.\tH2.\tcontradictory\n")
        _write(d / f"test-{lang}.tsv", "P.\tH.\tneutral\n")
    with pytest.raises(DataError, match="train-en.tsv: no such file"):
        T.load_task(str(d))
    data = T.load_task(str(d), train_split="dev", eval_split="test")
    assert set(data.evals) == {"en", "de", "fr"}
    assert [e.label for e in data.train] == [T.NLI_LABELS.index("entailment"), T.NLI_LABELS.index("contradiction")]


def test_training_on_an_evaluated_set_or_its_translations_is_refused(tmp_path):
    d = tmp_path / "xnli"
    for lang in ("en", "de"):
        _write(d / f"dev-{lang}.tsv", "P.\tH.\tentailment\n")
    with pytest.raises(DataError, match=r"dev-en.tsv: the training file is also an evaluation set"):
        T.load_task(str(d), train_split="dev", eval_split="dev")
    with pytest.raises(DataError, match=r"dev-en.tsv: the evaluation sets \(dev-de.tsv, ...\) are translations"):
        T.load_task(str(d), train_split="dev", eval_split="dev", eval_files=[str(d / "dev-de.tsv")])
    q = tmp_path / "xquad"
    for lang in ("en", "de"):
        _squad(q / f"xquad.{lang}.json")
    with pytest.raises(DataError, match=r"xquad.en.json: the evaluation sets \(xquad.de.json, ...\) are translations"):
        T.load_task(str(q), train_split="en")
    cola = tmp_path / "CoLA"
    _write(cola / "dev.tsv", "gj04\t1\t\tOne sentence.\n")
    with pytest.raises(DataError, match=r"dev.tsv: the training file is also an evaluation set"):
        T.load_task(str(cola), train_split="dev")
    m = tmp_path / "mlqa"  # MLQA's layout, fine-tuned on SQuAD: scored with MLQA's own normalisation
    _squad(m / "train-v1.1.json")
    for lang in ("en", "de"):
        _squad(m / f"dev-context-{lang}-question-{lang}.json")
    assert T.load_task(str(m), "qa").spec is T.MLQA
    qnli = tmp_path / "QNLI"  # a GLUE folder without its training file: how to give one
    _write(qnli / "dev.tsv", "index\tquestion\tsentence\tlabel\n0\tq ?\ts .\tentailment\n")
    with pytest.raises(DataError, match=r"train.tsv: no such file \(the folder holds dev.tsv\); pass --train-file, or "
                                        r"the task by its Hugging Face name, nyu-mll/glue:qnli"):
        T.load_task(str(qnli))
    t = tmp_path / "tydiqa"  # TyDiQA's languages are not translations: its English file may train
    for lang in ("en", "sw"):
        _squad(t / f"tydiqa.goldp.{lang}.dev.json")
    assert set(T.load_task(str(t), "qa", train_split="en").evals) == {"sw"}


def _squad(path, context="Paris is the capital of France.", answer="Paris", start=0):
    doc = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "What is the capital?", "answers": [{"text": answer, "answer_start": start}]}]}]}]}
    return _write(path, json.dumps(doc))


def test_squad_reader_and_qa_layouts(tmp_path):
    d = tmp_path / "xquad"
    _squad(d / "xquad.en.json")
    _squad(d / "xquad.de.json")
    _squad(d / "train-v1.1.json")
    data = T.load_task(str(d))
    assert data.spec is T.SQUAD  # XQuAD: SQuAD v1.1's normalisation
    assert set(data.evals) == {"en", "de"}
    assert data.train[0].answers[0]["text"] == "Paris"
    assert T.qa_language("dev-context-es-question-es.json") == "es"
    assert T.qa_language("dev-context-es-question-en.json") is None  # cross-language pairs are not zero-shot
    assert T.qa_language("tydiqa.goldp.sw.dev.json") == "sw"


def test_squad_errors_name_the_place(tmp_path):
    f = _squad(tmp_path / "bad.json", answer="Rome", start=0)
    with pytest.raises(DataError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[0\]: answer 'Rome'"):
        T.read_squad(f)
    f.write_text('{"data": [\n  {"paragraphs": ]}')
    with pytest.raises(DataError, match=rf"{f}:2: not valid JSON"):
        T.read_squad(f)


def test_a_test_file_without_labels_is_named_as_such(tmp_path):
    with pytest.raises(DataError, match=r"test-en.tsv:1: 2 tab-separated columns, XNLI needs at least 3 \(a test "
                                        r"file without labels\? evaluate on the dev files: --eval-split dev\)"):
        T.read_tsv(_write(tmp_path / "test-en.tsv", "a .\tb .\n"), T.XNLI)
    with pytest.raises(DataError, match=r"1 tab-separated columns, XNLI needs at least 3$"):
        T.read_tsv(_write(tmp_path / "one.tsv", "a .\n"), T.XNLI)


def test_blank_answers_and_repeated_ids_are_refused(tmp_path):
    with pytest.raises(DataError, match=r"qas\[0\]\.answers\[0\]: an answer needs non-blank 'text'"):
        T.read_squad(_squad(tmp_path / "empty.json", answer="", start=0))
    with pytest.raises(DataError, match="non-blank"):
        T.read_squad(_squad(tmp_path / "space.json", context="Paris is", answer=" ", start=5))
    doc = json.loads(_squad(tmp_path / "one.json").read_text())
    doc["data"].append(doc["data"][0])
    with pytest.raises(DataError, match=r"data\[1\]\.paragraphs\[0\]\.qas\[0\]: question id 'q1' is also "
                                        r".*data\[0\]\.paragraphs\[0\]\.qas\[0\]'s; ids must be unique"):
        T.read_squad(_write(tmp_path / "twice.json", json.dumps(doc)))


def test_mlqa_folder_evaluates_the_asked_split_of_every_language(tmp_path):
    d = tmp_path / "mlqa"
    for split in ("dev", "test"):
        for lang in ("ar", "de", "en"):
            _squad(d / f"{split}-context-{lang}-question-{lang}.json")
    train = _squad(tmp_path / "train-v1.1.json")
    for split in ("dev", "test"):
        data = T.load_task(str(d), "qa", train_file=str(train), eval_split=split)
        assert {lang: Path(f).name.split("-")[0] for lang, f in _files(data).items()} == \
            {"ar": split, "de": split, "en": split}


def _files(data):
    """{language: the file its examples came from}."""
    return {lang: examples[0].where.split(":")[0] for lang, examples in data.evals.items()}


def test_hugging_face_tasks_evaluate_on_their_labelled_validation_splits(monkeypatch):
    """MNLI has validation_matched and validation_mismatched, no `validation`; a task with none is refused."""
    import datasets

    from dietpe.data import corpus

    rows = datasets.Dataset.from_dict(dict(premise=["p"], hypothesis=["h"], label=[0]))
    splits = dict(train=rows, validation_matched=rows, validation_mismatched=rows, test_matched=rows)
    monkeypatch.setattr(corpus, "load_hf_splits", lambda name: datasets.DatasetDict(splits))
    monkeypatch.setattr(T, "load_hf_splits", lambda name: datasets.DatasetDict(splits))
    data = T.load_task("nyu-mll/glue:mnli")
    assert sorted(data.evals) == ["validation_matched", "validation_mismatched"] and len(data.train) == 1
    del splits["validation_matched"], splits["validation_mismatched"]
    with pytest.raises(DataError, match="no validation split to evaluate on \\(has train, test_matched\\)"):
        T.load_task("nyu-mll/glue:mnli")


def test_unknown_directory_asks_for_the_task(tmp_path):
    d = tmp_path / "mystery"
    _write(d / "train.tsv", "sentence\tlabel\nx\ty\n")
    _write(d / "dev.tsv", "sentence\tlabel\nz\ty\n")
    with pytest.raises(DataError, match="pass --task"):
        T.load_task(str(d))
    data = T.load_task(str(d), task="tsv")
    assert data.spec.labels == ("y",)
