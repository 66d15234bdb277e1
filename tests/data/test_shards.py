"""Prepared corpora: the shards hold the blocks the in-memory pipeline makes, byte-identical across runs and
process counts; damaged, stale and half-written preparations are refused or redone; datasets streamed by name
land in the same shards; the `documents` packing's collator keeps documents apart."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dietpe.cli import main as cli
from dietpe.data import corpus as C
from dietpe.data import shards as S
from dietpe.data.mlm import MlmCollator, document_layout, pack_sentences
from dietpe.data.tokenizer import train_wordpiece
from dietpe.errors import DataError

WORDS = "the a cat dog sat ran on under mat tree river old new big small red blue quickly slowly".split()


def write_corpus(path, documents=40, seed=0, valid=False):
    rng = random.Random(seed)
    paras = []
    for _ in range(documents):
        for _ in range(rng.randint(1, 3)):
            paras.append(" ".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 14))) + " ."
                                  for _ in range(rng.randint(1, 5))))
        paras.append("")
    path.mkdir(parents=True, exist_ok=True)
    (path / "train.txt").write_text("\n".join(paras) + "\n", encoding="utf-8")
    if valid:
        (path / "valid.txt").write_text("the cat sat on the mat .\n\nthe dog ran .\n", encoding="utf-8")
    return path


def in_memory(source, vocab_size, max_length, max_documents=None, packing="full-sentences"):
    """What `dietpe pretrain` did before shards: lists of documents, tokenizer, blocks."""
    docs, _ = C.read_corpus(str(source), "train")
    val, _ = C.read_corpus(str(source), "validation")
    docs = docs[:max_documents] if max_documents else docs
    if not val:
        cut = max(1, len(docs) // 20)
        docs, val = docs[cut:], docs[:cut]
    tok = train_wordpiece((s for d in docs for s in d), vocab_size=vocab_size)

    def encode(documents):
        return [[tok.backend_tokenizer.encode(s, add_special_tokens=False).ids for s in d] for d in documents]

    return (tok, pack_sentences(encode(docs), max_length, tok.cls_token_id, tok.sep_token_id, packing),
            pack_sentences(encode(val), max_length, tok.cls_token_id, tok.sep_token_id, packing))


def prep(source, cache, **kw):
    kw = dict(vocab_size=80, max_length=20, processes=1, log=lambda m: None) | kw
    return S.prepare(str(source), cache_dir=cache, **kw)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(C, "CHUNK_CHARS", 300)  # many chunks even in a tiny corpus


@pytest.mark.parametrize("valid,max_documents,processes", [(False, None, 1), (True, None, 2), (False, 25, 2)])
def test_shards_hold_the_in_memory_blocks(tmp_path, valid, max_documents, processes):
    src = write_corpus(tmp_path / "c", valid=valid)
    p = prep(src, tmp_path / "cache", max_documents=max_documents, processes=processes)
    tok, train, val = in_memory(src, 80, 20, max_documents)
    assert p.tokenizer.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert list(p.train) == train and list(p.validation) == val
    assert p.manifest["train"]["dtype"] == "uint16" and p.train.n_tokens == sum(map(len, train))


def test_documents_packing_matches_lists(tmp_path):
    src = write_corpus(tmp_path / "c")
    p = prep(src, tmp_path / "cache", packing="documents")
    _, train, _ = in_memory(src, 80, 20, packing="documents")
    assert list(p.train) == train
    for i in range(len(p.train)):  # every recorded start is a [CLS] and every [CLS] a start
        ex = p.train.example(i)
        cls = [j for j, t in enumerate(ex["input_ids"]) if t == p.tokenizer.cls_token_id]
        assert ex["doc_starts"] == cls and ex["doc_starts"][0] == 0


def test_same_corpus_twice_gives_byte_identical_shards(tmp_path):
    src = write_corpus(tmp_path / "c")
    a = prep(src, tmp_path / "a", processes=1)
    b = prep(src, tmp_path / "b", processes=2)
    assert a.folder.name == b.folder.name
    names = sorted(f.name for f in a.folder.iterdir())
    assert names == sorted(f.name for f in b.folder.iterdir()) and "manifest.json" in names
    for name in names:
        assert (a.folder / name).read_bytes() == (b.folder / name).read_bytes(), name


def test_cache_is_reused_and_keyed(tmp_path):
    src = write_corpus(tmp_path / "c")
    logs = []
    prep(src, tmp_path / "cache", log=logs.append)
    assert any("preparing" in m for m in logs)
    logs.clear()
    again = prep(src, tmp_path / "cache", log=logs.append)
    assert logs == [] and len(again.train)
    other = prep(src, tmp_path / "cache", max_length=24)  # another length: other shards, same tokenizer
    assert other.folder != again.folder
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 1
    with open(src / "train.txt", "a", encoding="utf-8") as f:  # the corpus changed: prepared anew
        f.write("a new document .\n")
    logs.clear()
    prep(src, tmp_path / "cache", log=logs.append)
    assert any("training" in m for m in logs) and any("preparing" in m for m in logs)


def test_the_key_is_the_content_not_the_path_or_a_limit_that_covers_it(tmp_path):
    """The same files reached by another path, or a --max-documents / tokenizer sample that covers the whole
    corpus, are the same documents: the same tokenizer and shards, not a second preparation."""
    src = write_corpus(tmp_path / "c", valid=True)
    first = prep(src, tmp_path / "cache")
    moved = tmp_path / "elsewhere"
    shutil.copytree(src, moved)
    for source, kw in ((moved, {}), (src, dict(max_documents=10_000)), (src, dict(tokenizer_sample=10_000))):
        logs = []
        assert prep(source, tmp_path / "cache", log=logs.append, **kw).folder == first.folder, (source, kw)
        assert logs == []
    assert len(list((tmp_path / "cache" / "shards").iterdir())) == 1
    assert prep(src, tmp_path / "cache", max_documents=5).folder != first.folder  # a real limit: other data


def damage(folder, how):
    tokens = folder / "train.tokens"
    if how == "truncated":
        tokens.write_bytes(tokens.read_bytes()[:-2])
    elif how == "corrupt":
        data = bytearray(tokens.read_bytes())
        data[3] ^= 1
        tokens.write_bytes(bytes(data))
    else:  # stale: a manifest that describes other data
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["key"]["max_length"] += 1
        (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("how,needle", [("truncated", "train.tokens: truncated"),
                                        ("corrupt", "train.tokens: corrupt shard"),
                                        ("stale", "manifest.json: stale manifest")])
def test_damaged_shards_are_refused_in_one_line(tmp_path, capsys, how, needle):
    src = write_corpus(tmp_path / "c")
    p = prep(src, tmp_path / "cache", vocab_size=200, max_length=24)
    damage(p.folder, how)
    with pytest.raises(DataError, match=needle):
        prep(src, tmp_path / "cache", vocab_size=200, max_length=24)
    code = cli(["prepare", str(src), "--cache-dir", str(tmp_path / "cache"), "--vocab-size", "200",
                "--max-length", "24"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("dietpe prepare: error: ") and needle in err[0]


def test_killed_preparation_is_not_trusted_and_a_rerun_completes(tmp_path, monkeypatch):
    src = write_corpus(tmp_path / "c")
    real = S.write_split
    calls = []

    def dies_on_validation(folder, name, *a, **kw):
        calls.append(name)
        if name == "validation":
            raise OSError(28, "No space left on device")
        return real(folder, name, *a, **kw)

    monkeypatch.setattr(S, "write_split", dies_on_validation)
    with pytest.raises(OSError):
        prep(src, tmp_path / "cache")
    shards_dir = tmp_path / "cache" / "shards"
    assert calls == ["train", "validation"] and list(shards_dir.iterdir()) == []  # nothing left to trust
    monkeypatch.setattr(S, "write_split", real)
    # a process killed mid-write leaves its temporary folder; the rerun removes it and completes
    good = prep(src, tmp_path / "other")
    killed = shards_dir / f"{good.folder.name}.tmp-999999999"
    shutil.copytree(good.folder, killed)
    (killed / "manifest.json").unlink()
    p = prep(src, tmp_path / "cache")
    assert [f.name for f in shards_dir.iterdir()] == [good.folder.name]
    assert (p.folder / "manifest.json").read_bytes() == (good.folder / "manifest.json").read_bytes()


def test_dataset_by_name_is_streamed_into_the_same_shards(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    src = write_corpus(tmp_path / "c")
    lines = (src / "train.txt").read_text(encoding="utf-8").split("\n")[:-1]
    calls = []

    def load_dataset(name, config=None, streaming=False, **kw):
        calls.append((name, config, streaming))
        rows = datasets.IterableDataset.from_generator(lambda: ({"text": t} for t in lines))
        return {"train": rows}

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    by_name = prep("someone/corpus:small", tmp_path / "cache")
    local = prep(src, tmp_path / "cache2")
    assert calls and all(c == ("someone/corpus", "small", True) for c in calls)
    assert list(by_name.train) == list(local.train) and list(by_name.validation) == list(local.validation)
    assert by_name.manifest["key"]["data"]["train"]["name"] == "someone/corpus:small"


def test_blocks_pickle_by_path(tmp_path):
    import pickle
    p = prep(write_corpus(tmp_path / "c"), tmp_path / "cache")
    data = pickle.dumps(p.train)
    assert len(data) < 1000 and list(pickle.loads(data)) == list(p.train)


def test_documents_collator_is_block_diagonal_with_restarting_positions():
    class Tok:
        pad_token_id, mask_token_id, all_special_ids = 0, 4, [0, 1, 2, 3, 4]

        def __len__(self):
            return 30

    collator = MlmCollator(Tok())
    features = [{"input_ids": [2, 7, 8, 3, 2, 9, 3], "doc_starts": [0, 4], "example_seed": 1},
                {"input_ids": [2, 5, 6, 7, 3], "doc_starts": [0], "example_seed": 2}]
    batch = collator(features)
    mask, pos = batch["attention_mask"], batch["position_ids"]
    assert mask.shape == (2, 1, 7, 7) and mask.dtype == torch.bool and pos.shape == (2, 7)
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2], [0, 1, 2, 3, 4, 0, 0]]
    doc = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    assert torch.equal(mask[0, 0], doc[:, None] == doc[None, :])
    real = torch.tensor([1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)  # padding only sees padding
    assert torch.equal(mask[1, 0], (real[:, None] & real[None, :]) | (~real[:, None] & ~real[None, :]))
    assert batch["labels"].shape == (2, 7)
    # the same layout as a function of starts and lengths, and premasking keeps the starts
    positions, m = document_layout([[0, 2]], [3], 4)
    assert positions.tolist() == [[0, 1, 0, 0]] and m[0, 0].tolist() == [
        [True, True, False, False], [True, True, False, False], [False, False, True, False],
        [False, False, False, True]]
    pre = collator.premask([{"input_ids": [2, 7, 8, 3, 2, 9, 3], "doc_starts": [0, 4]}], seed=0)
    assert pre[0]["doc_starts"] == [0, 4] and "labels" in pre[0]
    assert collator(pre)["attention_mask"].shape == (1, 1, 7, 7)


def test_prepare_command_prints_the_folder(tmp_path, capsys):
    src = write_corpus(tmp_path / "c")
    code = cli(["prepare", str(src), "--cache-dir", str(tmp_path / "cache"), "--vocab-size", "80",
                "--max-length", "20", "--processes", "2"])
    out = capsys.readouterr().out
    folder = next((tmp_path / "cache" / "shards").iterdir())
    assert code == 0 and str(folder) in out and "training blocks" in out
    blocks = np.fromfile(folder / "train.blocks", dtype=np.int64)
    assert blocks[0] == 0 and (np.diff(blocks) <= 20).all()


def test_lm_stream_shards_are_the_token_stream(tmp_path):
    from dietpe.tasks import lm
    src = write_corpus(tmp_path / "c", valid=True)
    p = prep(src, tmp_path / "cache", max_length=0, packing="stream", max_documents=30)
    docs, _ = C.read_corpus(str(src), "train")
    tok = train_wordpiece((s for d in docs[:30] for s in d), vocab_size=80)
    assert p.tokenizer.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert p.train.tokens.tolist() == lm.token_stream(docs[:30], tok)
    assert p.validation.tokens.tolist() == lm.read_stream(str(src), tok, "validation")


def test_second_method_trains_from_the_same_shards(tmp_path, capsys):
    from dietpe import methods
    from dietpe.tasks import pretrain as pt
    src = write_corpus(tmp_path / "c", documents=60)
    s = dict(size="toy", vocab_size=80, max_length=20, steps=2, batch_size=4, lr=1e-3, warmup=0.0, save_steps=2,
             weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0)
    for method in ("absolute", "diet-rel"):
        res = pt.run_pretrain(pt.PretrainJob(str(src), methods.parse_method(method), tmp_path / method,
                                             pt.PretrainSettings(**s), report_to="none", cache_dir=tmp_path / "cache"))
        assert res["steps"] == 2
    err = capsys.readouterr().err
    assert err.count("preparing the corpus") == 1 and err.count("training a WordPiece") == 1
    assert len(list((tmp_path / "cache" / "shards").iterdir())) == 1


def test_pretraining_runs_with_documents_packing(tmp_path):
    from dietpe import methods
    from dietpe.tasks import pretrain as pt
    src = write_corpus(tmp_path / "c", documents=60)
    s = dict(size="toy", vocab_size=80, max_length=24, steps=2, batch_size=4, lr=1e-3, warmup=0.0, save_steps=2,
             weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0)
    res = pt.run_pretrain(pt.PretrainJob(str(src), methods.parse_method("diet-rel"), tmp_path / "run",
                                         pt.PretrainSettings(**s), report_to="none", quiet=True,
                                         cache_dir=tmp_path / "cache", packing="documents"))
    assert res["steps"] == 2 and np.isfinite(res["val_loss"])
    prepared = next((tmp_path / "cache" / "shards").iterdir())
    assert json.loads((prepared / "manifest.json").read_text())["key"]["packing"] == "documents"
    assert json.loads((tmp_path / "run" / "run_settings.json").read_text())["packing"] == "documents"


def test_a_dataset_of_one_document_a_row_is_read_a_document_a_row(tmp_path, monkeypatch):
    """Wikipedia's and C4's rows are whole documents (lines inside): the same shards as a JSONL file of them,
    read a chunk at a time; WikiText's one-line rows stay paragraphs (the test above)."""
    datasets = pytest.importorskip("datasets")
    src = write_corpus(tmp_path / "c")
    documents = [d.strip() for d in (src / "train.txt").read_text(encoding="utf-8").split("\n\n") if d.strip()]
    assert any("\n" in d for d in documents)
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, streaming=False, **kw: {
        "train": datasets.IterableDataset.from_generator(lambda: ({"text": d} for d in documents))})
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    by_name = prep("someone/wiki", tmp_path / "cache")
    local = prep(tmp_path / "j" / "train.jsonl", tmp_path / "cache2")
    assert list(by_name.train) == list(local.train) and list(by_name.validation) == list(local.validation)
    assert len(by_name.validation) > 0


def test_special_token_names_in_the_text_are_text(tmp_path):
    src = write_corpus(tmp_path / "c")
    with open(src / "train.txt", "a", encoding="utf-8") as f:
        f.write("the cat [MASK] sat [SEP] on [PAD] the mat .\n\n")
    p = prep(src, tmp_path / "cache")
    specials = set(p.tokenizer.all_special_ids) - {p.tokenizer.cls_token_id, p.tokenizer.sep_token_id}
    for block in p.train:
        assert not specials & set(block)  # no [MASK] or [PAD] input from the text
        assert sum(t == p.tokenizer.sep_token_id for t in block) <= 1 + sum(t == p.tokenizer.cls_token_id
                                                                             for t in block)


def test_validation_is_held_out_text(tmp_path):
    src = write_corpus(tmp_path / "c", valid=True)
    with pytest.raises(DataError, match="the same text as the training corpus"):
        prep(src, tmp_path / "cache", validation=str(src / "train.txt"))
    p = prep(src, tmp_path / "cache", validation=str(src))  # a folder: its validation file
    assert p.manifest["key"]["data"]["validation"]["origin"].endswith("valid.txt")
    (src / "valid.txt").unlink()
    with pytest.raises(DataError, match="the folder has no validation file"):
        prep(src, tmp_path / "cache", validation=str(src))


def test_a_run_whose_corpus_changed_is_not_resumed(tmp_path, capsys):
    from dietpe.cli import main

    src = write_corpus(tmp_path / "c", valid=True)
    base = ["pretrain", str(src), "--method", "alibi", "--recipe", "toy", "--steps", "2", "--threads", "1",
            "--cache-dir", str(tmp_path / "cache"), "-o", str(tmp_path / "run")]
    assert main(base) == 0
    write_corpus(tmp_path / "c", seed=1)  # the same name, other text
    capsys.readouterr()
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "holds a run with other settings (data.train." in err and "data.train.sha256: " in err


def test_a_run_recorded_before_its_data_was_still_resumes(tmp_path):
    from dietpe.errors import ConfigError
    from dietpe.tasks.checkpoints import RUN_SETTINGS, check_run_settings

    (tmp_path / "model").mkdir()
    (tmp_path / RUN_SETTINGS).write_text(json.dumps({"seed": 0}))  # written before "data" was recorded
    check_run_settings(tmp_path, {"seed": 0, "data": {"sha256": "a"}}, products=("model",), added=("data",))
    with pytest.raises(ConfigError, match="seed: 0 -> 1"):
        check_run_settings(tmp_path, {"seed": 1, "data": {"sha256": "a"}}, products=("model",), added=("data",))
    with pytest.raises(ConfigError, match="data.sha256: None -> 'a'"):
        check_run_settings(tmp_path, {"seed": 0, "data": {"sha256": "a"}}, products=("model",))


def test_a_folder_another_process_renamed_into_place_first_is_kept(tmp_path, monkeypatch):
    import errno
    import os

    final = tmp_path / "cache" / "shards" / "abc"
    real = os.replace

    def beaten(src, dst):  # the other process's rename lands between the check and ours
        Path(dst).mkdir(parents=True)
        (Path(dst) / "manifest.json").write_text("theirs")
        raise OSError(errno.ENOTEMPTY, "Directory not empty")

    monkeypatch.setattr(os, "replace", beaten)
    S._atomic_dir(final, lambda tmp: (tmp / "manifest.json").write_text("ours"))
    monkeypatch.setattr(os, "replace", real)
    assert (final / "manifest.json").read_text() == "theirs" and [p.name for p in final.parent.iterdir()] == ["abc"]


def test_an_empty_validation_file_is_refused_before_the_corpus_is_read(tmp_path, monkeypatch):
    src = write_corpus(tmp_path / "c")
    (src / "valid.txt").write_text("\n\n")
    monkeypatch.setattr(S, "train_tokenizer", lambda *a: pytest.fail("the corpus was read first"))
    with pytest.raises(DataError, match=r"valid.txt: the validation corpus is empty \(no non-blank lines\)"):
        prep(src, tmp_path / "cache")


def test_a_file_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    import builtins
    import hashlib
    import os

    f = tmp_path / "train.txt"
    f.write_text("one text .\n")
    opened = []
    real = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: (opened.append(p), real(p, *a, **k))[1])
    first = S.file_sha256(f)
    assert S.file_sha256(f) == first == hashlib.sha256(b"one text .\n").hexdigest() and len(opened) == 1
    stat = f.stat()
    f.write_text("two text .\n")  # the same size, its modification time set back: still read again
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert S.file_sha256(f) == hashlib.sha256(b"two text .\n").hexdigest() and len(opened) == 2
