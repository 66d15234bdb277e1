"""The `paper` and `tupe` recipes, field by field, against DIET's Table 7 (appendix A) and TUPE's Table 2
(appendix B); docs/recipes.md gives the sentence behind each field and the choices where a paper is silent."""

import argparse
import json

import pytest

from dietpe.data.tasks import GLUE
from dietpe.methods import parse_method
from dietpe.tasks.pretrain import check_before_work
from dietpe.tasks.settings import FinetuneSettings, PretrainSettings


def pre(recipe, **kw):
    base = dict(recipe=recipe, size=None, vocab_size=None, max_length=None, steps=None, batch_size=None, lr=None,
                warmup=None, save_steps=None, max_positions=None, keep_steps=None, optimizer=None)
    return PretrainSettings.from_args(argparse.Namespace(**{**base, **kw}))


def ft(recipe, **kw):
    base = dict(ft_recipe=recipe, lrs=None, seeds=None, epochs=None, ft_batch_size=None, ft_max_length=None,
                eval_steps=None, max_eval=None, doc_stride=None)
    return FinetuneSettings.from_args(argparse.Namespace(**{**base, **kw}))


def test_diet_pretraining_is_table_7():
    s = pre("paper")
    # MaxSteps 500K, Learning Rate 0.0018, Warmup Proportion 0.025, Sequence Length 128, Batch Size 4096,
    # Checkpoint Interval 20k; BERT-base (L=12, H=768, A=12); a 30,000-token WordPiece vocabulary
    assert (s.steps, s.lr, s.warmup, s.max_length, s.batch_size, s.save_steps) == \
        (500_000, 0.0018, 0.025, 128, 4096, 20_000)
    assert (s.size, s.vocab_size) == ("bert-base", 30000)
    # the parametrization the paper trains (tables in logit units, one learning rate), 512-row tables (Table 6)
    assert (s.logit_scale, s.positions, s.logit_lr_scale) == (1.0, 512, 1.0)
    assert s.optimizer == "lamb"  # paper silent: LAMB's batch-4096 recipe (docs/recipes.md)


def test_diet_finetuning_is_table_7():
    s = ft("paper")
    assert s.lrs == (1e-5, 2e-5, 3e-5, 4e-5) and s.seeds == 5  # "median ... among five runs"
    assert (s.warmup, s.max_length, s.batch_size, s.eval_steps) == (0.1, 128, 32, 3500)
    # "5 or 10 epochs": 5 for MNLI, QQP, QNLI, 10 for the others (TUPE's footnote)
    assert [s.epochs_for(t) for t in ("MNLI", "QQP", "QNLI", "SST-2", "CoLA", "STS-B")] == [5, 5, 5, 10, 10, 10]
    assert s.metric_order(GLUE["qqp"])[0] == "accuracy"  # Table 2 reports QQP's accuracy
    assert s.metric_order(GLUE["sts-b"])[0] == "pearson" and s.metric_order(GLUE["cola"]) == ("mcc",)
    assert ft("paper", epochs=3).epochs_for("MNLI") == 3  # --epochs: every task


def test_diet_multilingual_recipes_are_table_7s_other_column():
    s = pre("paper-multilingual")
    # MaxSteps 125K, Learning Rate 0.0018, Warmup 0.025, Sequence Length 512, Batch Size 4096; 120k pieces
    assert (s.steps, s.lr, s.warmup, s.max_length, s.batch_size, s.vocab_size) == \
        (125_000, 0.0018, 0.025, 512, 4096, 120_000)
    # the optimizer settings Table 7 gives both columns: the English recipe's choices where the paper is silent
    assert (s.optimizer, s.logit_scale) == (pre("paper").optimizer, pre("paper").logit_scale) == ("lamb", 1.0)
    f = ft("paper-multilingual")
    # lr {1,2,3,4}e-5, warm-up 0.1, batch 32, 3 epochs, length 512, Checkpoint Interval 3.5k, 5 trials
    assert (f.lrs, f.warmup, f.batch_size, f.max_length, f.eval_steps, f.seeds) == \
        ((1e-5, 2e-5, 3e-5, 4e-5), 0.1, 32, 512, 3500, 5)
    assert f.epochs_for("XNLI") == 3 and f.adam_epsilon == ft("paper").adam_epsilon == 1e-6
    # QA windows as BERT's run_squad and XTREME cut them: starts 128 tokens apart (their `doc_stride`), which
    # --doc-stride (an overlap) replaces
    assert f.doc_step == 128 and ft("paper-multilingual", doc_stride=64).doc_step is None
    assert "doc_step" not in ft("paper").record()  # as runs before the field recorded


def test_the_translation_paper_recipe_clips_no_gradient_as_tensor2tensor():
    from dietpe.cli import build_parser
    from dietpe.tasks.translate import apply_recipe

    def parsed(*extra):
        args = build_parser().parse_args(["translate", "train", "--data", "d", "--source", "de", "--target", "en",
                                          "-o", "o", *extra])
        apply_recipe(args)
        return args

    # transformer_base's clip_grad_norm = 0 ("i.e. no gradient clipping"); the CPU recipe keeps 1.0
    assert parsed("--recipe", "paper").max_grad_norm == 0.0
    assert parsed().max_grad_norm == 1.0 and parsed("--recipe", "paper", "--max-grad-norm", "2").max_grad_norm == 2.0


def test_tupe_pretraining_is_its_table_2():
    s = pre("tupe")
    assert (s.steps, s.batch_size, s.max_length, s.lr, s.warmup) == (1_000_000, 256, 512, 1e-4, 0.01)
    assert (s.adam_epsilon, s.max_grad_norm, s.weight_decay, s.optimizer) == (1e-6, 1.0, 0.01, "adamw")
    assert (s.vocab_size, s.positions, s.logit_scale) == (32768, 512, 1.0)
    assert s.keep_steps == (100_000, 300_000, 600_000)  # "intermediate checkpoints ({100k, 300k, 600k} steps)"
    assert pre("tupe", steps=1000).keep_steps == (100, 300, 600)  # the same fractions of a shorter run


def test_tupe_finetuning_is_its_table_2():
    s = ft("tupe")
    assert (s.lrs, s.batch_size, s.warmup, s.max_length, s.seeds) == ((2e-5, 3e-5, 4e-5, 5e-5), 32, 0.06, 512, 5)
    assert [s.epochs_for(t) for t in ("MNLI", "QQP", "QNLI", "CoLA", "RTE")] == [5, 5, 5, 10, 10]
    assert s.adam_epsilon == 1e-6 and s.metric_order(GLUE["mrpc"])[0] == "accuracy"


@pytest.mark.parametrize("spec, field, value", [
    ("diet-rel", "logit_scale", 1.0), ("diet-rel", "max_position_embeddings", 512),
    ("t5", "t5_range", 128),  # T5's own range (TUPE's t = 128), not half the training length
    ("diet-abs:logit_scale=10", "logit_scale", 10.0),  # a spec's own field wins over the recipe's
])
def test_the_paper_recipe_builds_the_papers_models(spec, field, value):
    from dietpe.positions.t5 import t5_range

    config = check_before_work(parse_method(spec), pre("paper"), 64, memory_check=False)
    assert (t5_range(config) if field == "t5_range" else getattr(config, field)) == value


def test_other_recipes_keep_dietpes_defaults():
    s = pre("cpu")
    assert (s.logit_scale, s.max_positions, s.optimizer, s.keep_steps) == (None, None, "adamw", ())
    assert check_before_work(parse_method("diet-rel"), s, 64, memory_check=False).logit_scale == 10.0
    assert list(s.record()) == list(pre("toy").record())  # nothing new recorded: older runs resume


@pytest.mark.parametrize("kw, message", [
    (dict(max_positions=64, max_length=128), "--max-positions=64 is below --max-length=128"),
    (dict(keep_steps=(5,), steps=4), "--keep-steps 5 is not a step of this run"),
])
def test_bad_recipe_overrides_are_named(kw, message):
    from dietpe.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        pre("toy", **kw)


def compare_args(*argv):
    from dietpe.cli import build_parser

    return build_parser("compare").parse_args(["compare", *argv])


def test_the_gpu_hour_preset_sets_the_study_unless_told(tmp_path):
    from dietpe.tasks import compare

    args = compare_args("--plan", "gpu-hour", "--corpus", "c", "--tasks", "t", "--seeds", "3",
                        "--ignore-memory-check")
    methods, seeds, s_pre, s_ft, _ = compare.study_settings(args, builtin=False)
    assert [m.name for m in methods] == ["absolute", "diet-abs", "diet-rel", "tupe-r"] and seeds == [0, 1, 2]
    assert (s_pre.size, s_pre.steps, s_pre.batch_size, s_pre.max_length) == ("bert-small", 3000, 256, 128)
    assert len(s_ft.lrs) == 2 and s_ft.seeds == 3 and args.max_validation == 1000
    default = compare.study_settings(compare_args("--plan", "gpu-hour", "--corpus", "c", "--tasks", "t",
                                                  "--seeds", "5", "--ignore-memory-check"), False)[3]
    assert default.seeds == 5 and default.lrs == (1e-4, 3e-4)  # --seeds 5 wins over the plan's 3


@pytest.mark.parametrize("argv, message", [
    (("--plan", "gpu-hour"), "give --corpus"),
    (("--plan", "gpu-hour", "--corpus", "c", "--tasks", "t", "--budget", "2"), "--budget 2 would scale it"),
])
def test_the_preset_is_refused_where_it_cannot_apply(argv, message):
    from dietpe.errors import ConfigError
    from dietpe.tasks import compare

    args = compare_args(*argv)
    with pytest.raises(ConfigError, match=message):
        compare.study_settings(args, builtin=compare.check_data_options(args))


def test_the_study_time_estimate_multiplies_the_plan():
    from dietpe.bench import study_time

    args = argparse.Namespace(plan="gpu-hour", ft_train=[320], ft_eval=[64])
    counts = study_time.plan(args)
    assert counts["runs_per_model"] == 6 and counts["ft_steps"] == [20] and counts["pretrain_steps"] == 3000
    est = study_time.estimate(counts, {"a": 0.02}, {"a": (0.01, 0.003)}, load=0.5, save=1.0, batch=256)
    evals = counts["pretrain_evals"] * 1000 / 256 / 3
    assert est["pretraining"] == pytest.approx(3 * 0.02 * (3000 + evals))
    assert est["per_finetuning_run"]["a"] == pytest.approx(20 * 0.01 + 2 * (2 * 0.003 + 1.0) + 0.5)
    assert est["finetuning"] == pytest.approx(3 * 6 * est["per_finetuning_run"]["a"])


def test_the_study_time_tool_measures_and_estimates(tmp_path, capsys):
    from dietpe.bench import study_time

    out = tmp_path / "t.json"
    assert study_time.main(["--device", "cpu", "--precision", "fp32", "--size", "bert-tiny", "--pretrain-batch", "2",
                            "--steps", "1", "--warmup", "0", "--ft-length", "8", "--json", str(out)]) == 0
    first = json.loads(out.read_text())
    assert set(first["measured"]["pre"]) == {"absolute", "diet-abs", "diet-rel", "tupe-r"}
    assert study_time.main(["--measured", str(out), "--gpu-tflops", "350", "--json", str(out)]) == 0
    again = json.loads(out.read_text())
    ratio = again["gpu"]["ratio"]
    assert again["gpu"]["pre"]["absolute"] == pytest.approx(first["measured"]["pre"]["absolute"] / ratio + 0.008)
    assert "min (one process" in capsys.readouterr().out
