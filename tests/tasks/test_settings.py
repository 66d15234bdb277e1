"""The typed run settings: built once from recipe + command line, checked when built, saved with the keys run
folders have always recorded (so runs made before these types still resume)."""

import argparse
import dataclasses
import json

import pytest

from dietpe.errors import ConfigError
from dietpe.tasks.recipes import FINETUNE_RECIPES, PRETRAIN_RECIPES
from dietpe.tasks.settings import FinetuneSettings, PretrainJob, PretrainSettings

PRETRAIN_KEYS = ["size", "vocab_size", "max_length", "steps", "batch_size", "lr", "warmup", "save_steps",
                 "weight_decay", "adam_epsilon", "max_grad_norm"]
FINETUNE_KEYS = ["lrs", "seeds", "epochs", "batch_size", "max_length", "warmup", "weight_decay", "max_grad_norm",
                 "eval_steps", "max_eval", "doc_stride"]


def pretrain_args(**kw):
    base = dict(recipe="toy", size=None, vocab_size=None, max_length=None, steps=None, batch_size=None, lr=None,
                warmup=None, save_steps=None)
    return argparse.Namespace(**{**base, **kw})


def finetune_args(**kw):
    base = dict(ft_recipe="toy", lrs=None, seeds=None, epochs=None, ft_batch_size=None, ft_max_length=None,
                eval_steps=None, max_eval=None, doc_stride=None)
    return argparse.Namespace(**{**base, **kw})


def test_pretrain_settings_take_the_recipe_unless_the_command_line_says_otherwise():
    r = PRETRAIN_RECIPES["toy"]
    s = PretrainSettings.from_args(pretrain_args(steps=7, lr=3e-3))
    assert (s.steps, s.lr, s.save_steps) == (7, 3e-3, min(r.save_steps, 7))
    assert (s.size, s.vocab_size, s.max_length, s.batch_size, s.warmup) == \
        (r.size, r.vocab_size, r.max_length, r.batch_size, r.warmup)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.steps = 8


def test_saved_pretrain_settings_keep_the_keys_of_earlier_runs():
    s = PretrainSettings.from_args(pretrain_args())
    assert list(s.record()) == PRETRAIN_KEYS  # logit_lr_scale at 1: not recorded, as before the option
    scaled = dataclasses.replace(s, logit_lr_scale=10.0).record()
    assert list(scaled) == PRETRAIN_KEYS + ["logit_lr_scale"] and scaled["logit_lr_scale"] == 10.0
    # a saved record builds the same settings back
    assert PretrainSettings(**json.loads(json.dumps(scaled))) == dataclasses.replace(s, logit_lr_scale=10.0)


def test_saved_finetune_settings_keep_the_keys_of_earlier_runs():
    r = FINETUNE_RECIPES["toy"]
    s = FinetuneSettings.from_args(finetune_args(lrs="1e-3,2e-4", doc_stride=16))
    assert list(s.record()) == FINETUNE_KEYS
    assert s.lrs == (1e-3, 2e-4) and s.doc_stride == 16 and s.seeds == r.seeds and s.epochs == r.epochs
    assert FinetuneSettings(**json.loads(json.dumps(s.record()))) == s  # lists read back as the tuple


@pytest.mark.parametrize("change, message", [
    (dict(steps=0), "--steps=0 must be a positive integer"),
    (dict(vocab_size=-1), "--vocab-size=-1"),
    (dict(warmup=1.0), r"--warmup=1.0 must be a fraction in \[0, 1\)"),
    (dict(lr=float("nan")), "--lr=nan must be positive and finite"),
    (dict(logit_lr_scale=0.0), "--logit-lr-scale=0.0 must be positive and finite"),
])
def test_pretrain_settings_refuse_bad_values_naming_the_option(change, message):
    s = PretrainSettings.from_args(pretrain_args())
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(s, **change)


@pytest.mark.parametrize("change, message", [
    (dict(ft_batch_size=0), "--ft-batch-size=0 must be a positive integer"),
    (dict(epochs=float("inf")), "--epochs=inf must be positive"),
    (dict(doc_stride=-1), "--doc-stride=-1 must be >= 0"),
    (dict(lrs="1e-3,x"), "not a comma-separated list of numbers"),
    (dict(lrs="1e-3,0"), "0 is not a positive learning rate"),
])
def test_finetune_settings_refuse_bad_values_naming_the_option(change, message):
    with pytest.raises(ConfigError, match=message):
        FinetuneSettings.from_args(finetune_args(**change))


def test_a_job_holds_its_output_folder_as_a_path(tmp_path):
    from dietpe.methods import parse_method

    job = PretrainJob("corpus.txt", parse_method("diet-rel"), str(tmp_path / "run"),
                      PretrainSettings.from_args(pretrain_args()))
    assert job.output_dir == tmp_path / "run" and job.config is None


def test_an_evaluation_shows_its_progress_and_closes_its_bar(capsys):
    from types import SimpleNamespace

    from dietpe.tasks.runtime import ProgressBar

    bar = ProgressBar("finetune cola")
    args, state = SimpleNamespace(disable_tqdm=False), SimpleNamespace(is_world_process_zero=True)
    batches = [0] * 5
    for _ in batches:
        bar.on_prediction_step(args, state, None, eval_dataloader=batches)
    assert bar.eval_bar.n == 5 and bar.eval_bar.total == 5
    bar.on_predict(args, state, None)
    assert bar.eval_bar is None and "finetune cola evaluating" in capsys.readouterr().err
    bar.on_prediction_step(SimpleNamespace(disable_tqdm=True), state, None, eval_dataloader=batches)
    assert bar.eval_bar is None  # quiet runs show none
