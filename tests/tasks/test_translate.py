"""`dietpe translate train` / `eval` end to end on a generated word-substitution language pair: training lowers the
validation loss, a killed run resumes to the same weights, bad input fails with the file and line, beam search
writes detokenised output and a SacreBLEU score, and cached decoding gives what uncached decoding gives."""

import json
import random
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file

from dietpe.cli import main
from dietpe.data.parallel import train_joint_bpe
from dietpe.models.seq2seq import DietForConditionalGeneration, DietSeq2SeqConfig
from dietpe.tasks.checkpoints import COMPLETE

WORDS = {f"w{i}": f"v{i}" for i in range(24)}
TINY = ":hidden_size=32:num_hidden_layers=1:num_decoder_layers=1:num_attention_heads=2:intermediate_size=64"


def corpus(path, name, n, seed):
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        words = rng.choices(list(WORDS), k=rng.randint(3, 7))
        src.append(" ".join(words))
        tgt.append(" ".join(WORDS[w] for w in words))
    (path / f"{name}.xx").write_text("\n".join(src) + "\n")
    (path / f"{name}.yy").write_text("\n".join(tgt) + "\n")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs")
    corpus(path, "train", 400, 0)
    corpus(path, "val", 40, 1)
    return path


def train(data, out, *extra):
    return main(["translate", "train", "--data", str(data), "--source", "xx", "--target", "yy",
                 "--output-dir", str(out), "--vocab-size", "80", "--batch-size", "16", "--lr", "3e-3",
                 "--warmup-steps", "5", "--dropout", "0", "--threads", "1", "--method", "sinusoidal" + TINY, *extra])


def test_train_lowers_validation_loss_then_eval_scores_bleu(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(data, out, "--method", "diet-rel" + TINY, "--max-steps", "40", "--eval-steps", "10",
                 "--save-steps", "20") == 0
    summary = json.loads((out / "final" / "train_summary.json").read_text())
    evals = [row["eval_loss"] for row in summary["curves"] if "eval_loss" in row]
    assert summary["steps"] == 40 and len(evals) >= 4
    assert evals[-1] < evals[0] - 0.3 and evals == sorted(evals, reverse=True)
    assert (out / "final" / "model.safetensors").is_file() and (out / "final" / "tokenizer.json").is_file()
    assert "validation loss" in capsys.readouterr().err

    hyp = tmp_path / "hyp.yy"
    assert main(["translate", "eval", str(out), "--source", str(data / "val.xx"), "--reference",
                 str(data / "val.yy"), "--output", str(hyp), "--beams", "3", "--limit", "12", "--speed",
                 "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    lines = hyp.read_text().splitlines()
    assert len(lines) == 12 and all(w.startswith("v") for line in lines for w in line.split())  # detokenised
    report = json.loads((tmp_path / "hyp.yy.json").read_text())
    assert report["signature"].startswith("nrefs:1|") and 0 <= report["bleu"] <= 100
    assert report["mismatched_sentences"] == 0 and report["cached_sentences_per_s"] > 0
    assert "BLEU" in printed and "sent/s with cache" in printed


def test_a_killed_run_resumes_to_the_same_weights(data, tmp_path, capsys):
    args = ["--method", "shaw" + TINY, "--max-steps", "6", "--save-steps", "3", "--eval-steps", "3",
            "--max-train-pairs", "120", "--logging-steps", "1"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert train(data, full, *args) == 0
    assert train(data, killed, *args) == 0
    # as if killed while writing checkpoint-6: no completion marker, no final model
    shutil.rmtree(killed / "final")
    (killed / "checkpoint-6" / COMPLETE).unlink()
    capsys.readouterr()
    assert train(data, killed, *args) == 0
    err = capsys.readouterr().err
    assert "removing incomplete checkpoint" in err and "resuming from" in err and "checkpoint-3" in err
    a, b = load_file(full / "final" / "model.safetensors"), load_file(killed / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=key)
    sa, sb = (json.loads((d / "final" / "train_summary.json").read_text()) for d in (full, killed))
    assert sa["train_loss"] is not None and sa["train_loss"] == sb["train_loss"]  # the whole run's, resumed or not
    assert sa["curves"] == sb["curves"]
    # finished runs are not redone; a different method may not reuse the directory
    assert train(data, killed, *args) == 0 and "finished already" in capsys.readouterr().err
    assert train(data, killed, "--method", "t5" + TINY, "--max-steps", "6") == 2
    assert "method: 'shaw:" in (err := capsys.readouterr().err) and "-> 't5:" in err


def test_mismatched_files_fail_with_both_counts(data, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("train.xx", "val.xx", "val.yy"):
        shutil.copy(data / name, bad / name)
    (bad / "train.yy").write_text("v1 v2\n" * 7)
    assert train(bad, tmp_path / "run", "--max-steps", "2") == 2
    err = capsys.readouterr().err
    assert "train.xx has 400 lines but" in err and "train.yy has 7" in err and "Traceback" not in err


def test_empty_and_long_lines_are_skipped_and_counted(data, tmp_path, capsys):
    odd = tmp_path / "odd"
    shutil.copytree(data, odd)
    src = (odd / "train.xx").read_text().splitlines()
    src[4] = ""
    src[9] = " ".join(["w1"] * 50)
    (odd / "train.xx").write_text("\n".join(src) + "\n")
    out = tmp_path / "run"
    assert train(odd, out, "--max-steps", "2", "--max-length", "20") == 0
    report = json.loads((out / "data_report.json").read_text())["train"]
    assert (report["kept"], report["empty_lines"], report["too_long_lines"]) == (398, [5], [10])
    assert "398 of 400 pairs kept" in capsys.readouterr().err
    assert train(odd, tmp_path / "strict", "--max-steps", "2", "--max-length", "20", "--bad-lines", "error") == 2
    assert "train.xx:5: empty line" in capsys.readouterr().err
    assert not (tmp_path / "strict").exists()  # a refused file leaves no run behind: its fix meets no other one
    assert train(odd, tmp_path / "strict", "--max-steps", "1", "--max-length", "64", "--max-train-pairs", "4",
                 "--bad-lines", "error") == 0


def test_eval_refuses_a_source_longer_than_a_learned_table(tmp_path, capsys):
    tokenizer = train_joint_bpe(["w1 w2 w3 v1 v2 v3"] * 3, vocab_size=40, min_frequency=1)
    config = DietSeq2SeqConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_decoder_layers=1,
                               num_attention_heads=2, intermediate_size=32, position="absolute",
                               max_position_embeddings=8)
    model_dir = tmp_path / "model"
    DietForConditionalGeneration(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (tmp_path / "src").write_text("w1 w2\n" + "w1 " * 12 + "\n")
    rc = main(["translate", "eval", str(model_dir), "--source", str(tmp_path / "src"), "--beams", "2"])
    assert rc == 2
    assert "src:2: 13 tokens (with </s>) exceed 8" in capsys.readouterr().err
    (tmp_path / "src").write_text("w1 w2\n")
    assert main(["translate", "eval", str(model_dir), "--source", str(tmp_path / "src"), "--max-new-tokens",
                 "9"]) == 2
    assert "--max-new-tokens 9 exceeds max_position_embeddings=8" in capsys.readouterr().err


def test_eval_refuses_to_write_over_its_inputs(tmp_path, capsys):
    """--output or --report naming the source or the reference file (or each other) is refused before decoding:
    the translations would replace the file they were read from."""
    tokenizer = train_joint_bpe(["w1 w2 w3 v1 v2 v3"] * 3, vocab_size=40, min_frequency=1)
    config = DietSeq2SeqConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_decoder_layers=1,
                               num_attention_heads=2, intermediate_size=32, position="diet-rel")
    model_dir = tmp_path / "model"
    DietForConditionalGeneration(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    src, ref = tmp_path / "src", tmp_path / "ref"
    src.write_text("w1 w2\n")
    ref.write_text("v1 v2\n")
    base = ["translate", "eval", str(model_dir), "--source", str(src), "--reference", str(ref)]
    for extra, message in [(["--output", str(ref)], "--output .* is the --reference file"),
                           (["--output", str(tmp_path / "." / "src")], "--output .* is the --source file"),
                           (["--report", str(src)], "--report .* is the --source file"),
                           (["--output", str(tmp_path / "o"), "--report", str(tmp_path / "o")], "both")]:
        assert main(base + extra) == 2
        assert re.search(message, capsys.readouterr().err)
    assert (src.read_text(), ref.read_text()) == ("w1 w2\n", "v1 v2\n")


def test_the_collator_leaves_out_the_source_mask_only_when_nothing_is_padded():
    from dietpe.tasks.translate import TranslationCollator

    collate = TranslationCollator(pad_id=0, start_id=1)
    even = collate([dict(input_ids=[5, 6, 7], labels=[8, 9]), dict(input_ids=[5, 6, 9], labels=[8])])
    ragged = collate([dict(input_ids=[5, 6, 7], labels=[8, 9]), dict(input_ids=[5], labels=[8])])
    assert "attention_mask" not in even  # no mask: attend to every source token, and SDPA may take flash
    assert ragged["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    model = DietForConditionalGeneration(DietSeq2SeqConfig(vocab_size=16, hidden_size=16, num_hidden_layers=1,
                                                           num_attention_heads=2, intermediate_size=32,
                                                           position="diet-rel")).eval()
    with torch.no_grad():
        without = model(**{k: v for k, v in even.items() if k != "labels"}).logits
        with_ones = model(**{k: v for k, v in even.items() if k != "labels"},
                          attention_mask=torch.ones_like(even["input_ids"])).logits
    torch.testing.assert_close(without, with_ones, rtol=0, atol=0)


def test_a_translation_does_not_depend_on_the_batch_it_is_decoded_in():
    """Each sentence's decoding limit is its own source's (1.5 x length + 10), not its batch's longest source's."""
    from types import SimpleNamespace

    from dietpe.models.seq2seq import DietForConditionalGeneration, DietSeq2SeqConfig
    from dietpe.tasks.translate import cap_batches, translate

    torch.manual_seed(0)
    model = DietForConditionalGeneration(DietSeq2SeqConfig.from_preset(
        "transformer-tiny", vocab_size=24, pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    model.generation_config.suppress_tokens = [0, 1, 2]  # never ends: every sentence decodes to its limit
    tokenizer = SimpleNamespace(pad_token_id=0, batch_decode=lambda rows, skip_special_tokens: [
        " ".join(str(t) for t in row.tolist() if t > 2) for row in rows])
    ids = [[3 + (i * 7 + j) % 20 for j in range(n)] + [2] for i, n in enumerate((2, 9, 3, 5, 2, 8))]
    alone = translate(model, tokenizer, ids, 1, 2, 0.6, progress=False)[0]
    together = translate(model, tokenizer, ids, 6, 2, 0.6, progress=False)[0]
    assert together == alone
    assert [len(h.split()) for h in alone] == [int(1.5 * len(s)) + 10 for s in ids]
    assert cap_batches([4, 0, 2, 3], [14, 14, 16, 17], 8) == [[4, 0], [2], [3]]
    assert cap_batches([4, 0, 2], [14, 14, 14], 2) == [[4, 0], [2]]


def test_accumulated_micro_batches_give_the_loss_of_one_batch(data, tmp_path):
    """--grad-accum 2 × 8 sentences is one batch of 16: the step's loss (and so its gradient) is the mean over
    its target tokens, not the mean of two micro-batches' means."""
    args = ["--max-steps", "1", "--logging-steps", "1", "--max-train-pairs", "64", "--eval-steps", "1000"]

    def first_loss(out, *extra):
        assert main(["translate", "train", "--data", str(data), "--source", "xx", "--target", "yy",
                     "--output-dir", str(out), "--vocab-size", "80", "--lr", "3e-3", "--warmup-steps", "5",
                     "--dropout", "0", "--threads", "1", "--method", "sinusoidal" + TINY, *args, *extra]) == 0
        summary = json.loads((out / "final" / "train_summary.json").read_text())
        return next(row["loss"] for row in summary["curves"] if "loss" in row)

    whole = first_loss(tmp_path / "whole", "--batch-size", "16")
    parts = first_loss(tmp_path / "parts", "--batch-size", "8", "--grad-accum", "2")
    assert parts == pytest.approx(whole, rel=1e-5)


def test_speed_counts_the_sentences_that_differ_not_their_batch():
    """One sentence decoded longer without the cache: the others of its batch, padded differently by generate(),
    are still the same sentences."""
    from types import SimpleNamespace

    from transformers import LogitsProcessorList

    from dietpe.tasks.translate import translate

    torch.manual_seed(0)
    model = DietForConditionalGeneration(DietSeq2SeqConfig.from_preset(
        "transformer-tiny", vocab_size=24, pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    with torch.no_grad():  # </s> likely, so sentences end early
        model.encoder.embeddings.word_embeddings.weight[2] *= 4
    generate = model.generate

    def no_end_for_the_second(input_ids, scores):  # its two beams may not end
        scores[2:4, 2] = -float("inf")
        return scores

    def patched(*args, use_cache=True, **kwargs):
        if not use_cache:
            kwargs["logits_processor"] = LogitsProcessorList([no_end_for_the_second])
        return generate(*args, use_cache=use_cache, **kwargs)

    model.generate = patched
    tokenizer = SimpleNamespace(pad_token_id=0, batch_decode=lambda rows, skip_special_tokens: [
        " ".join(str(t) for t in r.tolist() if t > 2) for r in rows])
    ids = [[5, 6, 7, 2], [8, 9, 10, 2], [11, 12, 13, 2]]
    a = generate(torch.tensor(ids), num_beams=2, max_new_tokens=12, use_cache=True).tolist()
    b = patched(torch.tensor(ids), num_beams=2, max_new_tokens=12, use_cache=False).tolist()
    words = [[t for t in row if t not in (0, 2)] for row in a], [[t for t in row if t not in (0, 2)] for row in b]
    differ = sum(x != y for x, y in zip(*words))
    assert differ == 1 and len(a[0]) != len(b[0])  # one sentence, and the batch padded to another length
    _, timing = translate(model, tokenizer, ids, 3, 2, 0.6, max_new_tokens=12, speed=True, progress=False)
    assert timing["mismatched_sentences"] == differ
