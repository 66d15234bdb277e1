"""`dietpe analyze` end to end on a tiny checkpoint, and `report` on a batch in memory."""

import json
import re

import torch

from dietpe import DietConfig, DietForMaskedLM, DietModel
from dietpe.analysis import compare_section, report, sample_batch
from dietpe.cli import main
from dietpe.data.tokenizer import train_wordpiece

TEXT = [f"the {w} sat on the mat near {v} and the {v} ran to the {w} ." for w in ("cat", "dog", "bird", "fox")
        for v in ("tree", "house", "river", "hill", "road")]


def checkpoint(tmp_path, position):
    tok = train_wordpiece(TEXT * 3, vocab_size=80, min_frequency=1)
    cfg = DietConfig.from_preset("bert-tiny", position=position, segment="per-head", vocab_size=len(tok),
                                 max_position_embeddings=24, hidden_size=32, intermediate_size=64)
    path = tmp_path / position
    DietForMaskedLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path, tok


def test_analyze_writes_an_index_listing_every_png(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text("\n".join(TEXT) + "\n")
    ckpt, _ = checkpoint(tmp_path, "diet-abs")
    out = tmp_path / "out"
    assert main(["analyze", str(ckpt), "--data", str(data), "--out", str(out), "--batch-size", "3",
                 "--length", "20"]) == 0
    index = out / "index.md"
    assert capsys.readouterr().out.strip() == str(index)
    linked = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", index.read_text())
    assert sorted(linked) == sorted(p.name for p in out.glob("*.png"))
    assert set(linked) == {"ranks.png", "position_patterns.png", "offset_profiles.png", "segment_attention.png"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["length"] == 20 and summary["batch_size"] == 3
    # diet-abs at init: the position term has rank d_p = d_h = 16 on a 20 × 20 batch
    assert summary["ranks"]["position term"] == [[16.0, 16.0], [16.0, 16.0]]


def test_analyze_names_a_missing_file(tmp_path, capsys):
    ckpt, _ = checkpoint(tmp_path, "absolute")
    assert main(["analyze", str(ckpt), "--data", str(tmp_path / "nope.txt")]) == 2
    assert "nope.txt" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "missing"), "--data", str(ckpt / "config.json")]) == 2
    assert "missing" in capsys.readouterr().err


def test_report_on_a_model_in_memory(tmp_path):
    cfg = DietConfig.from_preset("bert-tiny", position="absolute", vocab_size=50, max_position_embeddings=16,
                                 hidden_size=32, intermediate_size=64)
    index = report(DietModel(cfg), torch.randint(5, 50, (2, 12)), tmp_path / "abs", title="absolute")
    text = index.read_text()
    assert "cosine_similarity.png" in text and (tmp_path / "abs" / "cosine_similarity.png").is_file()
    assert "segment_attention.png" not in text  # input segments: nothing per head to draw
    # what `dietpe compare` embeds: every picture linked relative to the comparison's directory, and it exists
    section = compare_section({"absolute": index}, tmp_path)
    links = re.findall(r"\]\(([^)]+)\)", section)
    assert "abs/ranks.png" in links and "abs/index.md" in links
    assert all((tmp_path / link).is_file() for link in links)


def test_sample_batch_cuts_full_windows_without_padding(tmp_path):
    tok = train_wordpiece(TEXT, vocab_size=80, min_frequency=1)
    batch = sample_batch(tok, TEXT, batch_size=4, length=10, seed=1)
    ids = batch["input_ids"]
    assert ids.shape == (4, 10) and bool(batch["attention_mask"].all())
    assert (ids[:, 0] == tok.cls_token_id).all() and (ids[:, -1] == tok.sep_token_id).all()
    assert torch.equal(ids, sample_batch(tok, TEXT, batch_size=4, length=10, seed=1)["input_ids"])


def test_a_seq2seq_checkpoint_is_analysed_through_its_encoder(tmp_path):
    import pytest

    seq2seq = pytest.importorskip("dietpe.models.seq2seq")
    from dietpe.analysis import encoder_of, position_pattern
    from dietpe.analysis.cli import load_checkpoint

    cfg = seq2seq.DietSeq2SeqConfig.from_preset("bert-tiny", position="diet-rel", vocab_size=60,
                                                max_position_embeddings=16, hidden_size=32, intermediate_size=64)
    model = seq2seq.DietForConditionalGeneration(cfg)
    model.save_pretrained(tmp_path / "mt")
    loaded, _ = load_checkpoint(tmp_path / "mt")
    assert type(loaded) is seq2seq.DietForConditionalGeneration and encoder_of(loaded) is loaded.encoder
    expected = model.encoder.positions.method.logit("r")[0, 0, 15 + 2].item()  # R[2] of the encoder, not the decoder
    assert position_pattern(loaded, 8)[0][0, 5, 3].item() == expected


def test_analyze_without_a_recorded_training_length_names_the_position_limit(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text("\n".join(TEXT * 8) + "\n")
    ckpt, _ = checkpoint(tmp_path, "diet-rel")  # max_position_embeddings=24, no run folder recording a length
    assert main(["analyze", str(ckpt), "--data", str(data), "-o", str(tmp_path / "a"), "--batch-size", "2"]) == 0
    err = capsys.readouterr().err
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["length"] == 24
    assert "2 sequences of 24 tokens (the model's position limit, max_position_embeddings" in err
    assert "(the training length)" not in err
    assert main(["analyze", str(ckpt), "--data", str(data), "-o", str(tmp_path / "b"), "--batch-size", "2",
                 "--length", "40"]) == 0  # diet-rel has no table to cap it
    err = capsys.readouterr().err
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["length"] == 40
    assert "40 tokens is beyond the model's max_position_embeddings 24" in err
