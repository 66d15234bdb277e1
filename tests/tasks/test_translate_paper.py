"""Translation as the papers ran it: token-count batches, GNMT's length penalty against its formula, the `paper`
recipe, decoding defaults from the training recipe, and `dietpe translate prepare` (local files, WMT's SGML,
Multi30k, Hugging Face rows)."""

import json
import random
from types import SimpleNamespace

import pytest
import torch

from dietpe.cli import main
from dietpe.errors import ConfigError, DataError
from dietpe.models.beam import gnmt_length_penalty
from dietpe.models.seq2seq import DietForConditionalGeneration, DietSeq2SeqConfig
from dietpe.tasks import translate as T
from dietpe.tasks import wmt


def test_token_batches_hold_at_most_the_tokens_with_padding_and_every_pair_once():
    rng = random.Random(0)
    lengths = [rng.randint(1, 40) for _ in range(300)] + [90]  # one pair longer than a batch
    batches = T.token_batches(lengths, 100)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert longest * len(b) <= 100 or len(b) == 1  # tensor2tensor's count: the padded batch
        # greedy: the next pair (by length) would not have fit
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)  # batches of similar lengths
    for b, nxt in zip(batches, batches[1:]):
        assert max(lengths[i] for i in b + nxt[:1]) * (len(b) + 1) > 100
    pairs = [{"input_ids": [5] * n, "labels": [6] * (n // 2 + 1)} for n in lengths]
    ds = T.TokenBatches(pairs, 100)
    assert len(ds) == len(batches)
    batch = T.TranslationCollator(0, 1)([ds[0]])  # the sampler's one item is a whole batch
    assert batch["input_ids"].shape[0] == len(batches[0])


def test_gnmt_length_penalty_is_its_formula():
    for n in (1, 5, 17):
        for alpha in (0.0, 0.6, 1.0):
            assert gnmt_length_penalty(n, alpha) == pytest.approx(((5 + n) ** alpha) / (6 ** alpha))
    assert gnmt_length_penalty(torch.tensor([1.0, 7.0]), 0.6).tolist() == pytest.approx([1.0, 2.0 ** 0.6])


@pytest.mark.parametrize("form", ("hf", "gnmt"))
def test_beam_search_scores_finished_hypotheses_with_the_chosen_penalty(form):
    torch.manual_seed(0)
    config = DietSeq2SeqConfig.from_preset("transformer-tiny", vocab_size=24, position="sinusoidal", pad_token_id=0,
                                           bos_token_id=1, eos_token_id=2)
    model = DietForConditionalGeneration(config).eval()
    src = torch.randint(3, 24, (6, 5))

    def end_at(input_ids, scores):  # each source's hypotheses may end (</s> certain) at its own steps
        source = torch.arange(scores.shape[0]) // 4
        scores[:, 2] = torch.where((source + input_ids.shape[1]) % 4 == 0, torch.zeros(()), scores[:, 2])
        return scores

    from transformers import LogitsProcessorList
    out = model.generate(src, num_beams=4, length_penalty=0.6, max_new_tokens=10, output_scores=True,
                         return_dict_in_generate=True, length_penalty_form=form, early_stopping=True,
                         logits_processor=LogitsProcessorList([end_at]))
    raw = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices, normalize_logits=False).sum(1)
    ended = out.sequences[:, 1:] == 2
    assert ended.any(1).all()
    length = ended.int().argmax(1) + 1  # generated tokens up to the first </s>, which counts
    assert len(set(length.tolist())) > 1
    divisor = gnmt_length_penalty(length.double(), 0.6) if form == "gnmt" else length.double() ** 0.6
    assert out.sequences_scores.double().tolist() == pytest.approx((raw.double() / divisor).tolist(), abs=1e-5)
    with pytest.raises(ConfigError, match="length_penalty_form='t2t'"):
        model.generate(src, num_beams=2, max_new_tokens=3, length_penalty_form="t2t")


def test_gnmt_beam_search_lets_any_of_the_2k_candidates_finish_as_tensor2tensor_does():
    """tensor2tensor's grow_finished takes finished hypotheses from all 2k candidates of a step; transformers only
    from the top k. A candidate ranked k+1 that ends the sentence is a finished hypothesis in the former."""
    model = DietForConditionalGeneration(DietSeq2SeqConfig.from_preset("transformer-tiny", vocab_size=24))
    k, length = 2, 4
    step = dict(sequences=torch.zeros(1, k, 8, dtype=torch.long), topk_running_sequences=torch.ones(1, 2 * k, 8,
                dtype=torch.long), beam_scores=torch.full((1, k), -1.0e9), topk_log_probs=torch.tensor([[-1.0, -2.0,
                -3.0, -4.0]]), beam_indices=torch.zeros(1, k, 8, dtype=torch.long),
                topk_running_beam_indices=torch.zeros(1, 2 * k, 8, dtype=torch.long),
                is_early_stop_heuristic_unsatisfied=torch.ones(1, 1, dtype=torch.bool),
                is_sent_finished=torch.zeros(1, k, dtype=torch.bool),
                next_token_hits_stopping_criteria=torch.tensor([[False, False, True, False]]),  # the 3rd ends
                top_num_beam_mask=torch.tensor([True, True, False, False]), num_beams=k, cur_len=length,
                decoder_prompt_len=1, length_penalty=0.6, early_stopping=True)
    for form, finished in (("hf", False), ("gnmt", True)):
        model._length_penalty_form = form
        _, scores, _, done = model._update_finished_beams(**step)
        assert bool(done.any()) is finished
        if finished:
            assert scores.max().item() == pytest.approx(-3.0 / gnmt_length_penalty(length, 0.6))


def recipe_args(**given):
    keys = ("preset", "vocab_size", "max_length", "batch_size", "batch_tokens", "grad_accum", "learning_rate",
            "warmup_steps", "label_smoothing", "epochs", "max_steps")
    return SimpleNamespace(**{**{k: None for k in keys}, **given})


def test_the_paper_recipe_fills_what_the_command_line_leaves():
    args = recipe_args(recipe="paper")
    T.apply_recipe(args)
    assert (args.preset, args.max_steps, args.batch_tokens, args.batch_size, args.grad_accum) == (
        "transformer-base", 250_000, 4096, None, 8)
    assert T.decoding_of("paper") == dict(beams=10, length_penalty=0.6, length_penalty_form="gnmt")
    mine = recipe_args(recipe="paper", batch_size=32, max_steps=100)
    T.apply_recipe(mine)  # the command line wins: sentence batches
    assert (mine.batch_size, mine.batch_tokens, mine.max_steps) == (32, None, 100)
    cpu = recipe_args(recipe="cpu")
    T.apply_recipe(cpu)
    assert (cpu.preset, cpu.batch_size, cpu.batch_tokens, cpu.vocab_size) == (
        "transformer-small", 64, None, 8000)
    with pytest.raises(ConfigError, match="not both"):
        T.apply_recipe(recipe_args(recipe="cpu", batch_size=8, batch_tokens=500))
    with pytest.raises(ConfigError, match="less than --max-length"):
        T.apply_recipe(recipe_args(recipe="cpu", batch_tokens=50, max_length=64))


def pairs(folder, name, n, seed):
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(16)]
    src = [" ".join(rng.choices(words, k=rng.randint(2, 6))) for _ in range(n)]
    (folder / f"{name}.xx").write_text("\n".join(src) + "\n")
    (folder / f"{name}.yy").write_text("\n".join(s.replace("w", "v") for s in src) + "\n")


def test_token_batch_training_and_decoding_from_the_recipe(tmp_path, capsys):
    for name, n, seed in (("train", 120, 0), ("val", 12, 1)):
        pairs(tmp_path, name, n, seed)
    out = tmp_path / "run"
    tiny = ("sinusoidal:hidden_size=32:num_hidden_layers=1:num_decoder_layers=1:num_attention_heads=2"
            ":intermediate_size=64")
    assert main(["translate", "train", "--data", str(tmp_path), "--source", "xx", "--target", "yy", "-o", str(out),
                 "--method", tiny, "--vocab-size", "60", "--batch-tokens", "64", "--max-length", "16",
                 "--max-steps", "4", "--eval-steps", "4", "--save-steps", "4", "--threads", "1"]) == 0
    settings = json.loads((out / "run_settings.json").read_text())
    assert settings["batch_tokens"] == 64 and "recipe" not in settings
    assert "in batches of at most 64 tokens" in capsys.readouterr().err
    summary = json.loads((out / "final" / "train_summary.json").read_text())
    assert summary["decoding"] == T.decoding_of("cpu") and summary["steps"] == 4
    assert T.trained_decoding(out / "final")["length_penalty_form"] == "hf"
    assert main(["translate", "eval", str(out), "--source", str(tmp_path / "val.xx"), "--reference",
                 str(tmp_path / "val.yy"), "--length-penalty-form", "gnmt", "--threads", "1"]) == 0
    report = json.loads((out / "final" / "translations.val.xx.json").read_text())
    assert report["length_penalty_form"] == "gnmt" and report["beams"] == 10
    assert report["signature"].startswith("nrefs:1|case:mixed")


def test_prepare_reads_text_and_sgml_and_refuses_what_does_not_align(tmp_path, capsys):
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "b.de").write_text("drei\n")
    (tmp_path / "b.en").write_text("three\n")
    sgm = ('<refset><doc docid="x"><p><seg id="1">Guten &amp; Tag</seg>\n<seg id="2">Zeile\nzwei</seg></p></doc>'
           '</refset>')
    (tmp_path / "t.de.sgm").write_text(sgm)
    (tmp_path / "t.en.sgm").write_text(sgm.replace("Guten &amp; Tag", "Good day").replace("Zeile\nzwei", "line two"))
    out = tmp_path / "prepared"
    assert main(["translate", "prepare", "-o", str(out), "--pair", "de-en", "--train", str(tmp_path / "a.de"),
                 str(tmp_path / "a.en"), "--train", str(tmp_path / "b.de"), str(tmp_path / "b.en"), "--test",
                 str(tmp_path / "t.de.sgm"), str(tmp_path / "t.en.sgm")]) == 0
    assert (out / "train.de").read_text() == "eins\nzwei\ndrei\n"  # corpora concatenated in order
    assert (out / "test.de").read_text() == "Guten & Tag\nZeile zwei\n"  # <seg>s, a newline inside replaced
    report = json.loads((out / "prepare.json").read_text())
    assert report["splits"]["test"]["newlines_replaced"] == 1 and "valid" not in report["splits"]
    (tmp_path / "c.en").write_text("one\n")
    assert main(["translate", "prepare", "-o", str(tmp_path / "bad"), "--pair", "de-en", "--train",
                 str(tmp_path / "a.de"), str(tmp_path / "c.en")]) == 2
    err = capsys.readouterr().err
    assert "a.de has 2 train sentences but" in err and not (tmp_path / "bad").exists()
    assert main(["translate", "prepare", "-o", str(tmp_path / "bad"), "--pair", "german", "--train",
                 str(tmp_path / "a.de"), str(tmp_path / "a.en")]) == 2
    assert "L1-L2" in capsys.readouterr().err


def test_prepare_defaults_to_multi30k_and_reads_wmt_rows_by_name(tmp_path, monkeypatch):
    data = tmp_path / "shared" / "multi30k"
    data.mkdir(parents=True)
    for split, n in (("train", 5), ("val", 2)):
        for lang in ("de", "en"):
            (data / f"{split}.{lang}").write_text("".join(f"{lang} {split} {i}\n" for i in range(n)))
    assert main(["translate", "prepare", "-o", str(tmp_path / "m"), "--data-dir", str(tmp_path / "shared")]) == 0
    assert (tmp_path / "m" / "valid.en").read_text() == "en val 0\nen val 1\n"
    assert main(["translate", "prepare", "-o", str(tmp_path / "p"), "--data-dir", str(tmp_path / "shared"),
                 "--pair", "xx-yy"]) == 2  # the built-in pair is de-en: another is refused, not ignored
    assert not (tmp_path / "p").exists()

    def stream(name, split, missing_ok=False):
        assert name == "wmt/wmt18:cs-en"
        if split == "test":
            return None if missing_ok else pytest.fail("test is optional")
        return iter([{"translation": {"cs": f"cs {split} {i}", "en": f"en {split} {i}"}} for i in range(3)])

    import dietpe.data.corpus
    monkeypatch.setattr(dietpe.data.corpus, "stream_hf_dataset", stream)
    assert main(["translate", "prepare", "-o", str(tmp_path / "w"), "--dataset", "wmt/wmt18", "--pair", "cs-en",
                 "--max-train-pairs", "2"]) == 0
    assert (tmp_path / "w" / "train.cs").read_text() == "cs train 0\ncs train 1\n"
    assert (tmp_path / "w" / "valid.en").read_text().count("\n") == 3 and not (tmp_path / "w" / "test.cs").exists()
    with pytest.raises(DataError, match="no such file"):
        wmt.read_segments(tmp_path / "none.sgm")


def test_the_paper_recipe_stores_the_logit_tables_as_used_as_the_paper_trains_them():
    """DIET trains R_{i-j} as eq. 3 writes it: the paper recipes store logit-unit tables at scale 1 (a spec's
    own logit_scale= still wins); the cpu recipe keeps dietpe's 10 (docs/parametrization.md)."""
    tok = SimpleNamespace(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    scales = {}
    for recipe, spec in (("paper", "diet-rel"), ("cpu", "diet-rel"), ("paper", "diet-rel:logit_scale=4")):
        args = recipe_args(recipe=recipe, dropout=None)
        T.apply_recipe(args)
        args.preset, args.max_length = "transformer-small", 64
        scales[recipe, spec] = T.build_config(args, T.parse_translation_method(spec), 100, tok).logit_scale
    assert scales == {("paper", "diet-rel"): 1.0, ("cpu", "diet-rel"): 10.0, ("paper", "diet-rel:logit_scale=4"): 4.0}
