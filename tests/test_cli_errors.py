"""Every bad input of the catalogue (tests/bad_inputs.py) ends with exit code 2 and one line
`dietpe CMD: error: ...` naming the value and the limit (file and line for data), no traceback, before any work,
and leaves every existing file as it was (and no new output folder behind)."""

import argparse
import errno
import os

import pytest

from dietpe import validate as V
from dietpe.cli import main
from dietpe.errors import ConfigError
from tests import bad_inputs as B


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    paths = B.make_fixtures(tmp_path_factory.mktemp("bad") / "fixtures")
    outs = tmp_path_factory.mktemp("outs")
    cwd = os.getcwd()
    os.chdir(outs)  # default output folders land here
    yield paths, outs
    os.chdir(cwd)


@pytest.mark.parametrize("case", B.CASES, ids=[c.id for c in B.CASES])
def test_bad_input_gets_one_clear_line_and_changes_nothing(case, fixtures):
    paths, outs = fixtures
    r = B.run_case(case, paths, outs)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.outcome == "clear", f"{r.outcome}: {r.detail}\n{r.stderr}"
    assert r.rc == 2 and "Traceback" not in r.stderr
    assert len(lines) == 1 and lines[0].startswith("dietpe"), r.stderr
    assert not r.changed, f"files changed: {r.changed}"


def test_the_catalogue_covers_every_command_with_more_than_150_cases():
    assert len(B.CASES) > 150
    assert {c.command for c in B.CASES} >= {"pretrain", "finetune", "compare", "translate train", "translate eval",
                                             "bench", "analyze"}


# -- the pieces behind the catalogue ------------------------------------------------------------------------


@pytest.mark.parametrize("parse, text, words", [
    (V.positive_int, "0", "positive"), (V.positive_int, "-3", ">= 1"), (V.positive_int, "x", "not an integer"),
    (V.non_negative_int, "-1", ">= 0"), (V.seed, str(2 ** 32), "2**32"), (V.positive_float, "0", "> 0"),
    (V.positive_float, "nan", "finite"), (V.positive_float, "inf", "finite"), (V.fraction, "1", "[0, 1)"),
    (V.fraction, "nan", "[0, 1)"), (V.finite_float, "-inf", "finite"), (V.names, ",", "names nothing"),
    (V.int_at_least(3, ": [CLS] x [SEP]"), "2", ">= 3: [CLS] x [SEP]"),
])
def test_argument_types_name_the_value_and_the_limit(parse, text, words):
    with pytest.raises(argparse.ArgumentTypeError, match=None) as e:
        parse(text)
    assert text in str(e.value) and words in str(e.value)


def test_argument_types_accept_the_limits_themselves():
    assert V.positive_int("1") == 1 and V.non_negative_int("0") == 0 and V.fraction("0") == 0.0
    assert V.seed("0") == 0 and V.seed(str(2 ** 32 - 1)) == 2 ** 32 - 1 and V.finite_float("-0.5") == -0.5


def test_zero_is_refused_by_settings_too_never_replaced_by_the_recipe():
    from dietpe.tasks import finetune as ft
    from dietpe.tasks import pretrain as pt

    args = argparse.Namespace(recipe="toy", size=None, vocab_size=None, max_length=None, steps=0, batch_size=None,
                              lr=None, warmup=None, save_steps=None)
    with pytest.raises(ConfigError, match="--steps=0"):
        pt.settings(args)
    args = argparse.Namespace(ft_recipe="toy", lrs=None, seeds=0, epochs=None, ft_batch_size=None,
                              ft_max_length=None, eval_steps=None, max_eval=None, doc_stride=8)
    with pytest.raises(ConfigError, match="--seeds=0"):
        ft.settings(args)


def test_a_read_only_output_folder_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    def refuse(folder):
        raise PermissionError(errno.EACCES, "Permission denied", str(folder))

    monkeypatch.setattr(V, "_probe_write", refuse)
    (tmp_path / "run" / "checkpoint-2").mkdir(parents=True)  # an unfinished checkpoint it must not claim to remove
    assert main(["pretrain", str(tmp_path / "nope.txt"), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write in" in err and "Permission denied" in err
    assert "removing" not in err and (tmp_path / "run" / "checkpoint-2").is_dir()


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "no space left on device [ENOSPC]"),
                                         (errno.EROFS, "read-only file system [EROFS]")])
def test_a_full_or_read_only_disk_while_writing_is_one_line_with_the_path_and_what_was_kept(
        tmp_path, monkeypatch, capsys, code, words):
    from dietpe.data import synthetic

    def full(path, text):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(synthetic, "write_text_atomic", full)
    out = tmp_path / "cmp"
    assert main(["compare", "-o", str(out), "--threads", "1", "--jobs", "1", "--builtin-size", "40"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dietpe compare: error: cannot write ")
    assert str(out / "data" / "corpus") in err and words in err and "kept" in err


def test_a_write_error_wrapped_by_a_library_is_found_and_other_errors_still_raise(monkeypatch, capsys):
    from dietpe.tasks import pretrain as pt

    def wrapped(args):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/run/checkpoint-4/model.safetensors")
        except OSError as e:
            raise RuntimeError("PytorchStreamWriter failed writing file") from e

    monkeypatch.setattr(pt, "main", wrapped)
    assert main(["pretrain", "corpus.txt"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint-4/model.safetensors" in err and "complete checkpoints" in err and err.count("\n") == 1

    def bug(args):
        raise RuntimeError("a bug, not the user's input")

    monkeypatch.setattr(pt, "main", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["pretrain", "corpus.txt"])


def test_output_checks_create_nothing(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    assert V.check_output_dir(target, "-o") == target
    assert not (tmp_path / "a").exists() and list(tmp_path.iterdir()) == []


def test_a_failed_command_removes_the_folder_it_made_but_never_one_that_existed(tmp_path):
    new, old = tmp_path / "new" / "run", tmp_path / "old"
    old.mkdir()
    for folder in (new, old):
        with pytest.raises(ConfigError):
            with V.created_only_on_success(folder):
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "run_settings.json").write_text("{}")
                raise ConfigError("bad corpus")
    assert not (tmp_path / "new").exists()
    assert (old / "run_settings.json").is_file()


# -- what the issue asks to accept ----------------------------------------------------------------------------


def test_finetune_takes_a_pretrain_run_folder_like_analyze(fixtures, monkeypatch):
    paths, outs = fixtures
    seen = {}
    from dietpe.tasks import finetune as ft

    def fake_run(model_dir, data, out, s, **kw):
        seen["model_dir"] = model_dir
        return {"task": data.spec.name, "best_lr": 1e-3, "per_set": {}}

    monkeypatch.setattr(ft, "run_finetune", fake_run)
    assert main(["finetune", paths["run"], paths["order"], "-o", str(outs / "ft-run"), "--ft-recipe", "toy"]) == 0
    assert str(seen["model_dir"]) == paths["model"]


def test_a_method_may_override_the_size_presets_fields(fixtures):
    from dietpe import methods
    from dietpe.tasks import recipes

    config = recipes.build_config(methods.parse_method("absolute:hidden_size=128"), "toy", 100, 24, 0)
    assert config.hidden_size == 128 and config.num_hidden_layers == 2  # the rest of `toy` stays
    paths, outs = fixtures
    with B.stubs():
        with pytest.raises(B.Reached):  # accepted: it gets as far as training
            main(B.shlex.split(B.PRE.format(**paths, out=str(outs / "hidden128"))) + ["--method",
                                                                                        "absolute:hidden_size=128"])


def test_an_output_file_whose_parent_is_missing_is_created_not_an_errno(tmp_path, capsys):
    # class: an output path whose parent is missing (accepted by check_output_file) must be written at the end,
    # never fail with "[Errno 2] No such file or directory" after the work
    json_out, md_out = tmp_path / "new" / "deeper" / "bench.json", tmp_path / "other" / "bench.md"
    assert main(["bench", "--shapes", "bert-tiny", "--lengths", "8", "--batch", "1", "--repeats", "1", "--warmup",
                 "0", "--threads", "1", "--no-memory", "--methods", "diet-rel", "--modes", "infer",
                 "--json", str(json_out), "--markdown", str(md_out)]) == 0
    assert json_out.is_file() and md_out.is_file() and "Errno" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["lm", "corpus.txt", "--methods", ""], ["lm", "corpus.txt", "--methods", " , "]])
def test_an_empty_list_is_refused_not_replaced_by_the_default(argv, capsys, tmp_path):
    assert main([*argv, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--methods" in err and "no method" in err


def test_the_memory_estimate_grows_with_batch_and_length_and_the_check_can_be_skipped(monkeypatch):
    from dietpe.errors import ConfigError
    from dietpe.methods import parse_method
    from dietpe.tasks import pretrain as pt
    from dietpe.tasks import runtime as R
    from dietpe.tasks.recipes import build_config

    config = build_config(parse_method("diet-rel"), "bert-tiny", 200, 64, 0)
    state, act = R.training_memory(config, 4, 64)
    assert state > 16 * 200 * 128  # at least the embeddings' parameters, 16 bytes each
    assert R.training_memory(config, 8, 64)[1] == pytest.approx(2 * act)
    assert R.training_memory(config, 4, 128)[1] > 2 * act  # attention grows with the square of the length
    monkeypatch.setattr(R, "available_memory", lambda device: 1024.0 ** 3)
    monkeypatch.setattr(pt, "check_memory", R.check_memory)
    s = pt.PretrainSettings(size="bert-base", vocab_size=30000, max_length=512, steps=1, batch_size=256, lr=1e-3,
                            warmup=0.0, save_steps=1)
    with pytest.raises(ConfigError, match=r"needs about \d+\.\d GiB .* this machine has 1\.0 GiB available"):
        pt.check_before_work(parse_method("absolute"), s, 256)
    pt.check_before_work(parse_method("absolute"), s, 256, memory_check=False)  # --ignore-memory-check
