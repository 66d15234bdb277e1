"""`dietpe pretrain --init` from a BERT checkpoint (the log says what was loaded), `dietpe lm` (a causal LM per
method, the length table with n/a beyond a learned table) and `dietpe lengths` on a masked-LM run."""

import json
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from dietpe import DietForCausalLM
from dietpe.cli import main as cli
from dietpe.data import synthetic
from dietpe.data.corpus import read_corpus
from dietpe.data.tokenizer import train_wordpiece
from dietpe.errors import ConfigError
from dietpe.tasks import lm


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    torch.set_num_threads(1)
    return synthetic.write_builtin(tmp_path_factory.mktemp("data"), seed=0, documents=60, train=8, dev=8)


def test_pretrain_init_from_bert_logs_what_was_loaded(data, tmp_path, capsys):
    docs, _ = read_corpus(str(data["corpus"]), "train")
    tok = train_wordpiece((s for d in docs for s in d), vocab_size=200)
    bert = tmp_path / "bert"
    BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(bert)
    tok.save_pretrained(bert)
    out = tmp_path / "run"
    assert cli(["pretrain", str(data["corpus"]), "--init", str(bert), "--method",
                "diet-rel:segment=input:input_positions=false", "--recipe", "toy", "--steps", "2", "--batch-size",
                "8", "--max-length", "24", "--save-steps", "2", "--threads", "1", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--init DietForMaskedLM(position='diet-rel') from" in err
    assert "1 initialised, 1 dropped" in err and "initialised: diet.positions.method.r" in err
    assert "dropped: bert.embeddings.position_embeddings.weight" in err
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["hidden_size"] == 32 and config["position"] == "diet-rel"  # BERT's sizes, the new method
    # BERT's input positions kept beside DIET-REL (the --init default; here said explicitly): nothing is dropped
    kept = tmp_path / "kept"
    assert cli(["pretrain", str(data["corpus"]), "--init", str(bert), "--method",
                "diet-rel:segment=input:input_positions=true", "--recipe", "toy", "--steps", "2", "--batch-size", "8",
                "--max-length", "24", "--save-steps", "2", "--threads", "1", "-o", str(kept)]) == 0
    err = capsys.readouterr().err
    assert "1 initialised, 0 dropped" in err and "initialised: diet.positions.method.r" in err
    assert json.loads((kept / "model" / "config.json").read_text())["input_positions"] is True


def test_lm_trains_each_method_and_writes_the_length_table(data, tmp_path, capsys):
    out = tmp_path / "lm"
    assert cli(["lm", str(data["corpus"]), "--methods", "alibi,absolute", "--steps", "3", "--max-length", "8",
                "--vocab-size", "100", "--batch-size", "4", "--lengths", "1,2", "-o", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads((out / "lengths.json").read_text())}
    assert rows["alibi"]["ppl"]["2"] > 1 and rows["absolute"]["ppl"]["2"] is None
    table = (out / "lengths.md").read_text()
    assert "| absolute | causal |" in table and "n/a (beyond the table)" in table
    assert (out / "lengths.png").stat().st_size > 0 and (out / "lengths.csv").is_file()
    # `dietpe lengths` reads the saved runs again
    assert cli(["lengths", str(out / "alibi"), "--data", str(data["corpus"]), "--lengths", "1,2",
                "-o", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "lengths.json").read_text())[0]
    assert f"[lengths] {out / 'alibi'}: 1L " in capsys.readouterr().err  # its own command's name, not lm's
    assert again["ppl"]["2"] == pytest.approx(rows["alibi"]["ppl"]["2"], rel=1e-5)
    # --data may be a file, as its help says: that file is the held-out text
    valid = next(p for p in Path(data["corpus"]).iterdir() if "valid" in p.name)
    assert cli(["lengths", str(out / "alibi"), "--data", str(valid), "--lengths", "1", "-o", str(tmp_path / "f")]) == 0
    assert json.loads((tmp_path / "f" / "lengths.json").read_text())[0]["ppl"]["1"] > 1


def test_lm_compiled_trains_with_eager_bits(data, tmp_path, monkeypatch):
    backends, real = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: backends.append(kw.get("backend")) or real(m, **kw))
    base = ["lm", str(data["corpus"]), "--methods", "alibi", "--steps", "3", "--max-length", "8", "--vocab-size",
            "100", "--batch-size", "4", "--lengths", "1,2"]
    assert cli([*base, "-o", str(tmp_path / "eager")]) == 0 and not backends
    assert cli([*base, "-o", str(tmp_path / "compiled"), "--compile", "aot_eager"]) == 0
    assert backends == ["aot_eager"]  # the training steps' forward, compiled without making code
    eager, compiled = (json.loads((tmp_path / d / "alibi" / lm.RESULT).read_text()) for d in ("eager", "compiled"))
    assert compiled["compile"] == "aot_eager" and eager["compile"] is None
    assert compiled["final_train_loss"] == eager["final_train_loss"] and compiled["ppl"] == eager["ppl"]


def test_every_length_scores_the_same_text(data, monkeypatch):
    """--eval-tokens not a multiple of the longest window: each length scores the same first tokens (whole
    windows of 8L), not its own longest prefix."""
    docs, _ = read_corpus(str(data["corpus"]), "train")
    tok = train_wordpiece((s for d in docs for s in d), vocab_size=100)
    stream = lm.token_stream(docs, tok)
    assert len(stream) >= 1000
    scored = {}

    def record(model, stream, length, tokens, batch_size=8):
        scored[length] = tokens // length * length
        return 1.0

    from dietpe.tasks import perplexity

    monkeypatch.setattr(perplexity, "causal_loss", record)
    monkeypatch.setattr(perplexity, "position_config", lambda model: type("C", (), {"causal": True})())
    perplexity.length_perplexities(None, tok, stream, 16, (1, 2, 4, 8), tokens=1000)
    assert scored == {16: 896, 32: 896, 64: 896, 128: 896}


def test_masked_lm_perplexity_at_lengths_uses_fixed_masks(data):
    from dietpe import DietConfig, DietForMaskedLM

    docs, _ = read_corpus(str(data["corpus"]), "train")
    tok = train_wordpiece((s for d in docs for s in d), vocab_size=100)
    stream = lm.token_stream(docs, tok)
    model = DietForMaskedLM(DietConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32, position="alibi")).eval()
    a = lm.length_perplexities(model, tok, stream, 8, (1, 2), tokens=256)
    assert a == lm.length_perplexities(model, tok, stream, 8, (1, 2), tokens=256)  # same masks every time
    table = DietForMaskedLM(DietConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32, max_position_embeddings=8))
    assert lm.length_perplexities(table.eval(), tok, stream, 8, (1, 2), tokens=256)[2] is None
    # BERT's input table kept beside a per-head method (`dietpe pretrain --init`'s default) ends there too
    kept = DietForMaskedLM(DietConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, position="diet-rel",
                                      input_positions=True, num_attention_heads=2, intermediate_size=32,
                                      max_position_embeddings=8))
    scores = lm.length_perplexities(kept.eval(), tok, stream, 8, (1, 2), tokens=256)
    assert scores[1] is not None and scores[2] is None
    causal = DietForCausalLM(lm.causal_config("diet-rel:input_positions=true", "toy", len(tok), 8, 0)).eval()
    scores = lm.length_perplexities(causal, tok, stream, 8, (1, 2), tokens=256)
    assert scores[1] is not None and scores[2] is None


def test_lm_methods_default_to_every_method_a_causal_lm_takes():
    from dietpe.commands import ALL_CAUSAL
    from dietpe.positions.registry import names
    from dietpe.tasks.lm import method_specs

    assert method_specs(ALL_CAUSAL) == list(names(causal_ok=True)) and "fire" in method_specs(ALL_CAUSAL)
    assert method_specs("diet-rel:diet_rel_max_distance=none,all")[:2] == ["diet-rel:diet_rel_max_distance=none",
                                                                           "none"]
    assert method_specs("alibi, all").count("alibi") == 1
    with pytest.raises(ConfigError, match="names no method"):
        method_specs(" , ")


def test_lengths_as_the_dietpe_command_re_attaches_an_attached_llama_run(data, tmp_path, capsys):
    """The `dietpe` command imports the package without its Hugging Face hooks (a fast start): `lengths` must
    install them before loading an `--arch llama` run, or Llama loads plain and has no method."""
    import subprocess
    import sys

    out = tmp_path / "lm"
    assert cli(["lm", str(data["corpus"]), "--arch", "llama", "--methods", "alibi", "--steps", "2", "--max-length",
                "8", "--vocab-size", "100", "--batch-size", "4", "--lengths", "1,2", "-o", str(out)]) == 0
    trained = json.loads((out / "lengths.json").read_text())[0]["ppl"]
    command = ("import sys; sys.argv = ['dietpe'] + sys.argv[1:]; from dietpe.cli import main; "
               "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", command, "lengths", str(out / "llama-alibi"), "--data",
                           str(data["corpus"]), "--lengths", "1,2", "--threads", "1", "-o", str(tmp_path / "again")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    again = json.loads((tmp_path / "again" / "lengths.json").read_text())[0]["ppl"]
    assert again["2"] == pytest.approx(trained["2"], rel=1e-5)
    (out / "llama-alibi" / lm.RESULT).write_text("{")  # a result cut short is named, not a traceback
    assert cli(["lengths", str(out / "llama-alibi"), "--data", str(data["corpus"]), "--lengths", "1",
                "-o", str(tmp_path / "damaged")]) == 2
    assert f"{lm.RESULT}: unreadable result of a finished run" in capsys.readouterr().err


def test_lm_refuses_fp16_which_its_loop_cannot_scale(data, tmp_path, capsys):
    assert cli(["lm", str(data["corpus"]), "--methods", "alibi", "--steps", "2", "--max-length", "8",
                "--precision", "fp16", "-o", str(tmp_path / "lm")]) == 2
    assert "--precision fp16: dietpe lm's training loop scales no loss" in capsys.readouterr().err
    assert not (tmp_path / "lm").exists()


@pytest.mark.parametrize("extra, words", [
    (["--batch-size", "100000000"], ["needs about", "batch of 100000000 x 8 tokens", "lower --batch-size"]),
    (["--lengths", "1,1000000"], ["scored at 8,000,000 tokens", "lower --lengths"]),
])
def test_lm_refuses_a_step_or_a_scoring_far_beyond_memory_before_any_work(data, tmp_path, capsys, extra, words):
    base = ["lm", str(data["corpus"]), "--methods", "alibi", "--steps", "2", "--max-length", "8",
            "-o", str(tmp_path / "lm")]
    assert cli(base + extra) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words) and "GiB available" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "lm").exists()


def test_lengths_refuses_scoring_far_beyond_memory_before_any_work(data, tmp_path, capsys):
    out = tmp_path / "lm"
    assert cli(["lm", str(data["corpus"]), "--methods", "alibi", "--steps", "2", "--max-length", "8",
                "--vocab-size", "100", "--batch-size", "4", "--lengths", "1", "-o", str(out)]) == 0
    capsys.readouterr()
    assert cli(["lengths", str(out / "alibi"), "--data", str(data["corpus"]), "--lengths", "1,2000000",
                "-o", str(tmp_path / "far")]) == 2
    err = capsys.readouterr().err
    assert "alibi scored at 16,000,000 tokens needs about" in err and "lower --lengths" in err, err
    assert not (tmp_path / "far").exists()


def test_each_methods_model_compiles_from_nothing():
    """One process trains every method: without emptying dynamo's caches, the forward met its recompile limit
    (8) at the 9th method and ran uncompiled without a word. A limit of 1 shows it with two methods."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    stream = torch.randint(5, 60, (400,)).tolist()
    # config.patch, not monkeypatch: undoing a setattr on dynamo's config module leaves the name unreadable
    # (then FlexAttention, which reads it, fails in any later test of the process)
    with torch._dynamo.config.patch(recompile_limit=1):
        for spec in ("alibi", "t5"):
            lm.train_lm(lm.causal_config(spec, "toy", 60, 8, 0), stream, steps=2, batch_size=2, length=8, lr=1e-3,
                        seed=0, log=lambda *a: None, compile="eager")
    assert dynamo_utils.counters["frames"]["ok"] == 2  # one compiled forward per method
