"""`dietpe lm` and `dietpe lengths`: reruns of an output folder (same settings reuse, others are refused), and
mistakes refused in one line before the work (duplicate methods, an output that is a file, too few evaluation
tokens, a --train-length against a recorded one, a one-document corpus); a table of n/a alone is not plotted."""

import json

import pytest
import torch

from dietpe.cli import main as cli
from dietpe.data import synthetic
from dietpe.errors import ConfigError
from dietpe.tasks import lm

SMALL = ["--steps", "3", "--max-length", "8", "--vocab-size", "100", "--batch-size", "4", "--lengths", "1,2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    torch.set_num_threads(1)
    return synthetic.write_builtin(tmp_path_factory.mktemp("data"), seed=0, documents=60, train=8, dev=8)


@pytest.fixture(scope="module")
def alibi_run(data, tmp_path_factory):
    """A finished `dietpe lm` run of alibi at L = 8."""
    out = tmp_path_factory.mktemp("lm") / "run"
    assert cli(["lm", str(data["corpus"]), "--methods", "alibi", *SMALL, "-o", str(out)]) == 0
    return out / "alibi"


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_lm_rerun_reuses_same_settings_and_refuses_other_settings(data, tmp_path, capsys):
    out = tmp_path / "lm"
    base = ["lm", str(data["corpus"]), "--methods", "alibi,rotary", *SMALL, "-o", str(out)]
    assert cli(base) == 0
    first = json.loads((out / "lengths.json").read_text())
    (out / "rotary" / lm.RESULT).unlink()  # a run killed before rotary finished: resumed, alibi kept
    capsys.readouterr()
    assert cli(base) == 0
    err = capsys.readouterr().err
    assert "alibi: finished earlier, reusing it" in err and "rotary: finished earlier" not in err
    assert json.loads((out / "lengths.json").read_text()) == first  # the same run again: the same numbers
    for option, value, change in (("--steps", "4", "steps: 3 -> 4"), ("--vocab-size", "120", "vocab_size: 100 -> 120"),
                                  ("--lengths", "1,4", "lengths: [1, 2] -> [1, 4]")):
        assert cli([*base, option, value]) == 2
        err = _error(capsys)
        assert "holds a run with other settings" in err and change in err and "reusing" not in err
    assert cli(["lm", str(data["corpus"] / "train.txt"), *base[2:]]) == 2  # another corpus: its train file alone
    assert "holds a run with other settings (corpus: " in _error(capsys)
    assert json.loads((out / "lengths.json").read_text()) == first  # nothing overwritten


def test_lm_refuses_a_method_listed_twice(data, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"methods listed twice: \['absolute'\]"):
        lm.method_specs("absolute,absolute")
    with pytest.raises(ConfigError, match="methods listed twice"):
        lm.method_specs("alibi, alibi:segment=none")  # two spellings of one model
    assert lm.method_specs("alibi:segment=none,all").count("alibi") == 0  # `all` skips it, refuses nothing
    assert cli(["lm", str(data["corpus"]), "--methods", "absolute,absolute", *SMALL, "-o", str(tmp_path / "o")]) == 2
    assert "methods listed twice" in _error(capsys) and not (tmp_path / "o").exists()


def test_an_output_that_is_a_file_is_refused_before_any_work(data, alibi_run, tmp_path, capsys):
    file = tmp_path / "one.txt"
    file.write_text("x\n")
    cache = tmp_path / "cache"
    assert cli(["lm", str(data["corpus"]), "--methods", "alibi", *SMALL, "--cache-dir", str(cache),
                "-o", str(file)]) == 2
    assert "-o " in (err := _error(capsys)) and "is a file, not a folder" in err
    assert not cache.exists()  # refused before the corpus was prepared
    assert cli(["lengths", str(alibi_run), "--data", str(data["corpus"]), "--lengths", "1", "-o", str(file)]) == 2
    assert "-o " in (err := _error(capsys)) and "is a file, not a folder" in err and "lengths]" not in err


def test_a_table_of_n_a_alone_is_written_without_a_plot(data, tmp_path, capsys):
    out = tmp_path / "lm"
    # a learned table of L = 8 rows has no perplexity at 2L or 4L
    assert cli(["lm", str(data["corpus"]), "--methods", "absolute", *SMALL, "--lengths", "2,4", "-o", str(out)]) == 0
    assert "no plot: every perplexity is n/a" in capsys.readouterr().err
    assert not (out / "lengths.png").exists() and "lengths.png" not in (out / "lengths.md").read_text()
    assert "n/a (beyond the table)" in (out / "lengths.md").read_text() and (out / "lengths.csv").is_file()
    again = tmp_path / "again"
    again.mkdir()
    (again / "lengths.png").write_bytes(b"an old plot")  # removed: it is not this table's
    assert cli(["lengths", str(out / "absolute"), "--data", str(data["corpus"]), "--lengths", "2,4",
                "-o", str(again)]) == 0
    assert "[lengths] no plot" in capsys.readouterr().err and (again / "lengths.json").is_file()
    assert not (again / "lengths.png").exists()


def test_eval_tokens_too_few_names_the_option_and_the_window(data, alibi_run, tmp_path, capsys):
    assert cli(["lengths", str(alibi_run), "--data", str(data["corpus"]), "--eval-tokens", "10",
                "-o", str(tmp_path / "l")]) == 2
    err = _error(capsys)
    assert "--eval-tokens 10" in err and "8L = 64 tokens" in err and "give --eval-tokens 64 or more" in err
    assert not (tmp_path / "l").exists()
    # lm refuses it before training
    assert cli(["lm", str(data["corpus"]), "--methods", "alibi", *SMALL, "--eval-tokens", "10",
                "-o", str(tmp_path / "m")]) == 2
    assert "--eval-tokens 10" in (err := _error(capsys)) and "2L = 16 tokens" in err
    assert not (tmp_path / "m").exists()


def test_masked_eval_tokens_too_few_names_the_option(data):
    from dietpe import DietConfig, DietForMaskedLM
    from dietpe.data.tokenizer import train_wordpiece

    tok = train_wordpiece(["a b c d e f g"] * 4, vocab_size=40)
    model = DietForMaskedLM(DietConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32, position="alibi")).eval()
    stream = list(range(5, 40)) * 20
    with pytest.raises(ConfigError, match=r"--eval-tokens 1 is fewer than one window of the longest length, "
                                          r"2L = 16 tokens \(14 of text"):
        lm.length_perplexities(model, tok, stream, 8, (1, 2), tokens=1)


def test_train_length_does_not_override_a_recorded_length(data, alibi_run, tmp_path, capsys):
    base = ["lengths", str(alibi_run), "--data", str(data["corpus"]), "--lengths", "1"]
    assert cli([*base, "--train-length", "4", "-o", str(tmp_path / "a")]) == 2
    err = _error(capsys)
    assert "records training length 8" in err and "--train-length is 4" in err
    assert cli([*base, "--train-length", "8", "-o", str(tmp_path / "b")]) == 0  # the same length: accepted
    assert json.loads((tmp_path / "b" / "lengths.json").read_text())[0]["train_length"] == 8


def test_a_one_document_corpus_names_options_lm_has(tmp_path, capsys):
    one = tmp_path / "one.txt"
    one.write_text("one lonely document . it has two sentences .\n")
    assert cli(["lm", str(one), "--methods", "alibi", *SMALL, "-o", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "one document only" in err and "give a --validation corpus" not in err and "more documents" in err
    two = tmp_path / "two.txt"
    two.write_text("first document .\n\nsecond document .\n")
    assert cli(["lm", str(two), "--methods", "alibi", *SMALL, "--max-documents", "1", "-o", str(tmp_path / "p")]) == 2
    assert "--max-documents 1 leaves one document only" in _error(capsys)


def test_rows_of_a_learned_table_beyond_the_training_length_are_named(tmp_path, capsys):
    """`dietpe lengths` on a table longer than the run's training: its figures beyond 1L read untrained rows."""
    from dietpe import DietConfig
    from dietpe.tasks.checkpoints import RUN_SETTINGS
    from dietpe.tasks.lengths import untrained_rows
    from dietpe.tasks.perplexity import write_report

    table = DietConfig(position="absolute", max_position_embeddings=512)
    note = untrained_rows(tmp_path, "absolute", table, 32)
    assert "512 rows" in note and "reached the first 32" in note
    kept = DietConfig(position="diet-rel", input_positions=True, max_position_embeddings=512)
    assert "512 rows" in untrained_rows(tmp_path, "diet-rel", kept, 32)
    assert untrained_rows(tmp_path, "diet-rel", DietConfig(position="diet-rel"), 32) is None  # no learned table
    assert untrained_rows(tmp_path, "absolute", table, 512) is None  # trained at the table's length
    (tmp_path / RUN_SETTINGS).write_text(json.dumps({"init": "bert-base-uncased"}))
    assert untrained_rows(tmp_path, "absolute", table, 32) is None  # BERT's training reached them
    row = dict(method="absolute", kind="masked", train_length=32, ppl={1: 10.0, 2: 20.0})
    md = write_report([row], (1, 2), tmp_path / "out", "t", "lengths", [note])
    assert md.endswith(f"\n- {note}\n") and note in (tmp_path / "out" / "lengths.md").read_text()


def test_lm_rerun_of_a_corpus_changed_under_its_name_is_refused(data, tmp_path, capsys):
    import shutil

    corpus = tmp_path / "corpus"
    shutil.copytree(data["corpus"], corpus)
    base = ["lm", str(corpus), "--methods", "alibi", *SMALL, "-o", str(tmp_path / "lm")]
    assert cli(base) == 0
    with open(corpus / "train.txt", "a", encoding="utf-8") as f:
        f.write("a new line of text .\n")
    capsys.readouterr()
    assert cli(base) == 2
    err = _error(capsys)
    assert "holds a run with other settings (data.train." in err and "reusing" not in err
