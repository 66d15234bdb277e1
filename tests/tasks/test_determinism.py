"""A run is a pure function of its command line and seed (on CPU, with a fixed thread count), and a resumed run
ends bit-identical to an uninterrupted one: pretrain, finetune, translate train. Output folders record their
settings and refuse a rerun with other ones."""

import json
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file

from dietpe import methods
from dietpe.cli import main as cli
from dietpe.data import synthetic
from dietpe.data.tasks import load_task
from dietpe.errors import ConfigError
from dietpe.tasks import checkpoints as ckpt
from dietpe.tasks import finetune as ft
from dietpe.tasks import pretrain as pt
from dietpe.tasks.runtime import trainer_device_args

TINY = dict(size="toy", vocab_size=300, max_length=24, steps=6, batch_size=8, lr=2e-3, warmup=0.1, save_steps=2,
            weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0)
FT = dict(lrs=(1e-3,), seeds=1, epochs=3, batch_size=8, max_length=24, warmup=0.1, weight_decay=0.01,
          max_grad_norm=1.0, eval_steps=4, max_eval=None, doc_stride=8)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    torch.set_num_threads(1)
    return synthetic.write_builtin(tmp_path_factory.mktemp("data"), seed=0, documents=60, train=48, dev=24)


def pretrain(data, out, s=TINY, method="diet-rel", **kw):
    return pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), methods.parse_method(method), out,
                                          pt.PretrainSettings(**s), quiet=True, report_to="none", **kw))


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    return out, pretrain(data, out)


@pytest.fixture(scope="module")
def steps_per_epoch(data, tmp_path_factory):
    _, blocks, _ = pt.prepare_data(str(data["corpus"]), None, None, TINY["vocab_size"], TINY["max_length"],
                                   tmp_path_factory.mktemp("prep"), None, lambda m: None)
    return -(-len(blocks) // TINY["batch_size"])


def assert_same_weights(a, b):
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def rewind(src, dst, keep_step, finals):
    """A copy of the finished run `src` as if killed after checkpoint `keep_step`: later checkpoints and the
    final outputs are gone."""
    shutil.copytree(src, dst)
    for step, folder, _ in ckpt.checkpoints(dst):
        if step > keep_step:
            shutil.rmtree(folder)
    for name in finals:
        path = dst / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert [s for s, _, _ in ckpt.checkpoints(dst)][-1] == keep_step


# -- pretrain ------------------------------------------------------------------------------------------------

def test_pretrain_twice_gives_a_byte_identical_tokenizer_and_bit_identical_weights(data, finished, tmp_path):
    first, res = finished
    again = pretrain(data, tmp_path)
    for name in ("tokenizer/tokenizer.json", "model/tokenizer.json"):
        assert (first / name).read_bytes() == (tmp_path / name).read_bytes()
    assert_same_weights(first / "model", tmp_path / "model")
    assert again["val_loss"] == res["val_loss"] and again["curves"] == res["curves"]


@pytest.mark.parametrize("case", ["accumulation, resumed mid-epoch across an epoch boundary",
                                  "resumed exactly at an epoch boundary"])
def test_pretrain_resumed_after_a_kill_ends_bit_identical(data, steps_per_epoch, tmp_path, case):
    if case.startswith("accumulation"):
        s, keep, device_batch = dict(TINY, steps=steps_per_epoch + 4, save_steps=steps_per_epoch - 4), \
            steps_per_epoch - 4, 4
    else:
        s, keep, device_batch = dict(TINY, steps=steps_per_epoch + 2, save_steps=steps_per_epoch), \
            steps_per_epoch, 64
    full = pretrain(data, tmp_path / "full", s, device_batch_size=device_batch)
    assert [step for step, _, _ in ckpt.checkpoints(tmp_path / "full")] == [keep, s["steps"]]
    rewind(tmp_path / "full", tmp_path / "killed", keep, ("model", pt.RESULTS))
    kept = tmp_path / "killed" / f"checkpoint-{keep}" / "model.safetensors"
    stamp = kept.stat().st_mtime_ns
    resumed = pretrain(data, tmp_path / "killed", s, device_batch_size=device_batch)
    assert kept.stat().st_mtime_ns == stamp  # resumed there, not trained again from the start
    assert_same_weights(tmp_path / "full" / "model", tmp_path / "killed" / "model")
    assert resumed["steps"] == s["steps"] and resumed["val_loss"] == full["val_loss"]
    assert resumed["curves"]["eval_loss"] == full["curves"]["eval_loss"]
    # killed after the last checkpoint, before the final model: no extra step (it used to report steps + 1)
    rewind(tmp_path / "full", tmp_path / "at-end", s["steps"], ("model", pt.RESULTS))
    at_end = pretrain(data, tmp_path / "at-end", s, device_batch_size=device_batch)
    assert at_end["steps"] == s["steps"] and at_end["val_loss"] == full["val_loss"]
    assert_same_weights(tmp_path / "full" / "model", tmp_path / "at-end" / "model")


def test_other_settings_are_refused_naming_each_difference(data, finished, tmp_path, capsys):
    out, res = finished
    with pytest.raises(ConfigError, match=r"settings\.vocab_size: 300 -> 200.*--overwrite"):
        pretrain(data, out, dict(TINY, vocab_size=200))
    with pytest.raises(ConfigError, match=r"method: 'diet-rel' -> 'absolute'"):
        pretrain(data, out, method="absolute")
    assert pretrain(data, out) == json.loads((out / pt.RESULTS).read_text())  # same settings: reused
    code = cli(["pretrain", str(data["corpus"]), "-o", str(out), "--method", "diet-rel", "--recipe", "toy",
                "--steps", "6", "--threads", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "other settings" in err and "--overwrite" in err
    # a tokenizer left by a failed run is reused only by the same settings
    left = tmp_path / "failed"
    left.mkdir()
    shutil.copytree(out / "tokenizer", left / "tokenizer")
    shutil.copy(out / ckpt.RUN_SETTINGS, left / ckpt.RUN_SETTINGS)
    with pytest.raises(ConfigError, match="settings.vocab_size: 300 -> 200"):
        pretrain(data, left, dict(TINY, vocab_size=200))
    (left / ckpt.RUN_SETTINGS).unlink()
    with pytest.raises(ConfigError, match="without run_settings.json"):
        pretrain(data, left, dict(TINY, vocab_size=200))
    fresh = pretrain(data, left, dict(TINY, vocab_size=200, steps=1, save_steps=1), overwrite=True)
    assert fresh["steps"] == 1 and json.loads((left / ckpt.RUN_SETTINGS).read_text())["settings"]["vocab_size"] == 200
    # settings alone (a run that failed before writing anything) protect nothing: a corrected command goes on
    early = tmp_path / "failed-early"
    early.mkdir()
    shutil.copy(out / ckpt.RUN_SETTINGS, early / ckpt.RUN_SETTINGS)
    assert pretrain(data, early, dict(TINY, vocab_size=200, steps=1, save_steps=1))["steps"] == 1


def test_a_compiled_run_is_compiled_gives_eager_bits_resumes_and_records_the_choice(data, finished, tmp_path,
                                                                                    monkeypatch):
    compiled = []
    real = torch.compile

    def spy(model, **kw):
        compiled.append((type(model).__name__, kw.get("backend")))
        return real(model, **kw)

    monkeypatch.setattr(torch, "compile", spy)
    out, _ = finished
    full = pretrain(data, tmp_path / "full", compile="aot_eager")
    assert ("DietForMaskedLM", "aot_eager") in compiled  # the Trainer's accelerator compiled the model
    # aot_eager makes no code: the same bits as the eager run, so the compiled path changes nothing else
    assert_same_weights(out / "model", tmp_path / "full" / "model")
    assert json.loads((tmp_path / "full" / ckpt.RUN_SETTINGS).read_text())["compile"] == "aot_eager"
    rewind(tmp_path / "full", tmp_path / "killed", TINY["steps"] - TINY["save_steps"], ("model", pt.RESULTS))
    resumed = pretrain(data, tmp_path / "killed", compile="aot_eager")
    assert_same_weights(tmp_path / "full" / "model", tmp_path / "killed" / "model")
    assert resumed["val_loss"] == full["val_loss"]
    with pytest.raises(ConfigError, match=r"compile: 'aot_eager' -> None"):
        pretrain(data, tmp_path / "full")


def test_the_saved_tokenizer_carries_the_length_limit_of_a_learned_table(data, finished, tmp_path):
    from transformers import AutoTokenizer
    res = pretrain(data, tmp_path, dict(TINY, steps=1, save_steps=1), method="absolute")
    assert AutoTokenizer.from_pretrained(res["model_dir"]).model_max_length == TINY["max_length"]
    assert AutoTokenizer.from_pretrained(finished[1]["model_dir"]).model_max_length > 10**9  # no limit: relative


# -- finetune ------------------------------------------------------------------------------------------------

class _Killed(Exception):
    pass


def test_finetune_twice_and_after_a_kill_ends_bit_identical(data, finished, tmp_path, monkeypatch):
    final: dict[str, dict] = {}
    started: dict[str, int] = {}

    def watch(name, kill_at=None):
        class Watch(ckpt.CompleteCheckpoints):
            def on_save(self, args, state, control, **kw):
                super().on_save(args, state, control, **kw)
                if state.global_step == kill_at:
                    raise _Killed

            def on_train_begin(self, args, state, control, **kw):
                started[name] = state.global_step

            def on_train_end(self, args, state, control, model=None, **kw):
                final[name] = {k: v.clone() for k, v in model.state_dict().items()}

        monkeypatch.setattr(ft, "CompleteCheckpoints", Watch)

    task = load_task(str(data["order"]))
    model_dir = finished[1]["model_dir"]
    results = {}
    for name, kill_at in (("a", None), ("b", None), ("killed", 8)):
        watch(name, kill_at)
        if kill_at:
            with pytest.raises(_Killed):
                ft.run_finetune(model_dir, task, tmp_path / name, ft.FinetuneSettings(**FT), quiet=True,
                                report_to="none")
            watch(name)  # rerun: resumes from checkpoint-8, mid-epoch (6 steps an epoch)
        ft.run_finetune(model_dir, task, tmp_path / name, ft.FinetuneSettings(**FT), quiet=True, report_to="none")
        run = tmp_path / name / "lr0.001-seed0"
        results[name] = json.loads((run / ft.RESULT).read_text())
        results[name].pop("seconds")
        assert not ckpt.checkpoints(run)  # a finished run's checkpoints are removed
    assert results["a"]["history"][-1]["step"] == 18 and started == {"a": 0, "b": 0, "killed": 8}
    assert results["a"] == results["b"] == results["killed"]
    for name in ("b", "killed"):
        assert final[name].keys() == final["a"].keys()
        assert all(torch.equal(final[name][k], final["a"][k]) for k in final["a"]), name
    with pytest.raises(ConfigError, match=r"settings\.epochs: 3 -> 2"):
        ft.run_finetune(model_dir, task, tmp_path / "a", ft.FinetuneSettings(**dict(FT, epochs=2)), quiet=True,
                        report_to="none")
    # compiled by the Trainer (aot_eager makes no code: eager's bits), and the choice recorded
    compiled, real = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(kw.get("backend")) or real(m, **kw))
    watch("compiled")
    args = trainer_device_args(None, compile="aot_eager")
    ft.run_finetune(model_dir, task, tmp_path / "compiled", ft.FinetuneSettings(**FT), quiet=True, report_to="none",
                    device_args=args)
    got = json.loads((tmp_path / "compiled" / "lr0.001-seed0" / ft.RESULT).read_text())
    got.pop("seconds")
    assert compiled == ["aot_eager"] and got == results["a"]
    assert all(torch.equal(final["compiled"][k], final["a"][k]) for k in final["a"])
    with pytest.raises(ConfigError, match=r"compile: 'aot_eager' -> None"):
        ft.run_finetune(model_dir, task, tmp_path / "compiled", ft.FinetuneSettings(**FT), quiet=True,
                        report_to="none")


# -- translate train -----------------------------------------------------------------------------------------

WORDS = {f"w{i}": f"v{i}" for i in range(24)}
SEQ2SEQ = "absolute:hidden_size=32:num_hidden_layers=1:num_decoder_layers=1:num_attention_heads=2:intermediate_size=64"


def test_translate_train_twice_and_resumed_is_bit_identical(tmp_path, capsys, monkeypatch):
    rng = random.Random(0)
    for name, n in (("train", 96), ("val", 16)):
        src = [" ".join(rng.choices(list(WORDS), k=rng.randint(3, 7))) for _ in range(n)]
        (tmp_path / f"{name}.xx").write_text("\n".join(src) + "\n")
        (tmp_path / f"{name}.yy").write_text("\n".join(" ".join(WORDS[w] for w in s.split()) for s in src) + "\n")

    def train(out, *extra):
        # 96 pairs in steps of 2 x 16: 3 steps an epoch; dropout on (the preset's 0.1)
        return cli(["translate", "train", "--data", str(tmp_path), "--source", "xx", "--target", "yy",
                    "--output-dir", str(out), "--vocab-size", "60", "--batch-size", "16", "--grad-accum", "2",
                    "--lr", "3e-3", "--warmup-steps", "5", "--threads", "1", "--method", SEQ2SEQ,
                    "--max-steps", "20", "--save-steps", "7", "--eval-steps", "7", *extra])

    a, b = tmp_path / "a", tmp_path / "b"
    assert train(a) == 0 and train(b) == 0
    assert (a / "final" / "tokenizer.json").read_bytes() == (b / "final" / "tokenizer.json").read_bytes()
    assert_same_weights(a / "final", b / "final")
    assert json.loads((a / "final" / "tokenizer_config.json").read_text())["model_max_length"] == 256
    for keep in (14, 20):  # mid-epoch (14 = 4 x 3 + 2), and the last step (no extra step)
        killed = tmp_path / f"killed-{keep}"
        rewind(b, killed, keep, ("final",))
        capsys.readouterr()
        assert train(killed) == 0 and f"resuming from {killed / f'checkpoint-{keep}'}" in capsys.readouterr().err
        assert_same_weights(a / "final", killed / "final")
        assert json.loads((killed / "final" / "train_summary.json").read_text())["steps"] == 20
    assert train(b, "--vocab-size", "70") == 2
    err = capsys.readouterr().err
    assert "vocab_size: 60 -> 70" in err and "--overwrite" in err
    # compiled by the Trainer without making code (aot_eager): eager's bits, and the choice recorded
    compiled, backends, real = tmp_path / "compiled", [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: backends.append(kw.get("backend")) or real(m, **kw))
    assert train(compiled, "--compile", "aot_eager") == 0 and backends == ["aot_eager"]
    assert_same_weights(a / "final", compiled / "final")
    assert train(compiled) == 2 and "compile: 'aot_eager' -> None" in capsys.readouterr().err
