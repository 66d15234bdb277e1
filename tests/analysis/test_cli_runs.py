"""`dietpe analyze` on run folders: the length it analyses (recorded by the run, capped by the position table, cut
short by the text), what its messages say about it, and a translation run folder resolved to its final model."""

import json

import numpy as np
import pytest

from dietpe import DietConfig, DietForMaskedLM
from dietpe.analysis import Analysis, write_report
from dietpe.cli import main
from dietpe.data.tokenizer import train_wordpiece

TEXT = [f"the {w} sat on the mat near {v} and the {v} ran to the {w} ." for w in ("cat", "dog", "bird", "fox")
        for v in ("tree", "house", "river", "hill", "road")]


def data_file(tmp_path, lines):
    path = tmp_path / "text.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def translate_run(tmp_path, max_length=12):
    """A `dietpe translate train` run folder: final/ (a learned table of 32 positions) and run_settings.json."""
    seq2seq = pytest.importorskip("dietpe.models.seq2seq")
    tok = train_wordpiece(TEXT * 3, vocab_size=80, min_frequency=1)
    cfg = seq2seq.DietSeq2SeqConfig.from_preset("bert-tiny", position="diet-abs", vocab_size=len(tok),
                                                max_position_embeddings=32, hidden_size=32, intermediate_size=64)
    run = tmp_path / "mt"
    seq2seq.DietForConditionalGeneration(cfg).save_pretrained(run / "final")
    tok.save_pretrained(run / "final")
    (run / "run_settings.json").write_text(json.dumps({"task": "translate train", "max_length": max_length}))
    return run


def pretrain_run(tmp_path, max_length=16):
    """A `dietpe pretrain` run folder: model/ (an absolute table of 24 positions) and pretrain_results.json."""
    tok = train_wordpiece(TEXT * 3, vocab_size=80, min_frequency=1)
    cfg = DietConfig.from_preset("bert-tiny", position="absolute", vocab_size=len(tok), max_position_embeddings=24,
                                 hidden_size=32, intermediate_size=64)
    run = tmp_path / "pt"
    DietForMaskedLM(cfg).save_pretrained(run / "model")
    tok.save_pretrained(run / "model")
    (run / "pretrain_results.json").write_text(json.dumps({"settings": {"max_length": max_length}}))
    return run


def summary(out):
    s = json.loads((out / "summary.json").read_text())
    return s["batch_size"], s["length"]


def test_a_translate_checkpoint_is_analysed_at_its_recorded_training_length(tmp_path, capsys):
    data = data_file(tmp_path, TEXT * 4)
    run = translate_run(tmp_path, max_length=12)
    assert main(["analyze", str(run / "final"), "--data", str(data), "-o", str(tmp_path / "a"),
                 "--batch-size", "2"]) == 0
    assert summary(tmp_path / "a") == (2, 12)  # run_settings.json's max_length, not max_position_embeddings 32
    assert "analysing 2 sequences of 12 tokens (the training length)" in capsys.readouterr().err
    # without the run's record, the position limit is used and named as such, never as the training length
    bare = tmp_path / "bare"
    (run / "final").rename(bare)
    assert main(["analyze", str(bare), "--data", str(data), "-o", str(tmp_path / "b"), "--batch-size", "2"]) == 0
    err = capsys.readouterr().err
    assert summary(tmp_path / "b") == (2, 32)
    assert "32 tokens (the model's position limit, max_position_embeddings" in err
    assert "training length)" not in err


def test_a_translate_run_folder_is_analysed_through_its_final_model(tmp_path, capsys):
    data = data_file(tmp_path, TEXT * 4)
    run = translate_run(tmp_path)
    assert main(["analyze", str(run), "--data", str(data), "--batch-size", "2"]) == 0
    out = capsys.readouterr()
    index = run / "final" / "analysis" / "index.md"
    assert out.out.strip() == str(index) and f"2 sequences of 12 tokens from `{data}`" in index.read_text()
    assert f"analysing its model in {run / 'final'}" in out.err
    (run / "final" / "config.json").unlink()  # a run that has not finished: named, not a traceback
    assert main(["analyze", str(run), "--data", str(data)]) == 2
    assert "no final/ model yet" in capsys.readouterr().err


def test_the_messages_state_a_capped_length_as_capped(tmp_path, capsys):
    run = pretrain_run(tmp_path, max_length=16)
    data = data_file(tmp_path, TEXT * 4)
    assert main(["analyze", str(run), "--data", str(data), "-o", str(tmp_path / "a"), "--batch-size", "2",
                 "--length", "100"]) == 0
    err = capsys.readouterr().err
    assert summary(tmp_path / "a") == (2, 24)
    assert "100 tokens (--length 100) capped to 24: the model's position table has 24 rows" in err
    assert "analysing 2 sequences of 24 tokens" in err and "beyond the training length 16" in err
    assert "100-token inputs" not in err


def test_the_messages_state_the_batch_a_short_text_gives(tmp_path, capsys):
    run = pretrain_run(tmp_path, max_length=16)
    one = tmp_path / "one.txt"
    one.write_text("cat\n")
    assert main(["analyze", str(run), "--data", str(one), "-o", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    b, n = summary(tmp_path / "b")
    assert (b, n) == (1, 3)  # [CLS] cat [SEP]
    assert f"analysing 1 sequence of {n} tokens, not 8 of 16 (the training length): the text is too short" in err
    assert "16-token inputs" not in err


def test_the_index_prints_fractional_rank_extremes_as_the_mean(tmp_path):
    full = np.array([[29.62, 29.25, 30.0]])
    a = Analysis(position="absolute", segment="input", head_size=16, position_rank=None, length=32, batch_size=2,
                 rtol=1e-5, ranks={"token-to-token q·kᵀ": full - 0.5, "position term": full - 1,
                                   "full logits": full})
    text = write_report(a, tmp_path, "t").read_text()
    assert "29.6 (29.2–30.0)" in text and "(29–30)" not in text
    assert "at most 29.5)" in text and "range 28.2–29.0." in text
