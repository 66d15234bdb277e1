"""pretrain -> finetune -> compare on tiny generated data: results, kill-safe resume, the grid protocol."""

import dataclasses
import json
import math

import pytest
import torch

from dietpe import methods
from dietpe.cli import main as cli
from dietpe.data import synthetic
from dietpe.data.tasks import load_task
from dietpe.errors import ConfigError, DataError
from dietpe.tasks import checkpoints as ckpt
from dietpe.tasks import finetune as ft
from dietpe.tasks import pretrain as pt
from tests.conftest import TEST_DEVICE

TINY = dict(size="toy", vocab_size=300, max_length=24, steps=6, batch_size=8, lr=2e-3, warmup=0.1, save_steps=2,
            weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0)
FT = dict(lrs=(1e-3, 5e-4), seeds=2, epochs=1, batch_size=16, max_length=24, warmup=0.1, weight_decay=0.01,
          max_grad_norm=1.0, eval_steps=None, max_eval=None, doc_stride=8)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    torch.set_num_threads(1)
    return synthetic.write_builtin(tmp_path_factory.mktemp("data"), seed=0, documents=60, train=48, dev=24)


@pytest.fixture(scope="module")
def pretrained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("pt")
    res = pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), methods.parse_method("diet-rel"), out,
                                         pt.PretrainSettings(**TINY), quiet=True, report_to="none", device=TEST_DEVICE))
    return out, res


def test_pretrain_reports_validation_loss_and_saves_a_safetensors_model(pretrained, data):
    out, res = pretrained
    assert res["steps"] == 6
    assert 0 < res["val_loss"] < 10 and res["perplexity"] == pytest.approx(torch.tensor(res["val_loss"]).exp().item())
    assert (out / "model" / "model.safetensors").is_file() and (out / "model" / "tokenizer.json").is_file()
    assert res["curves"]["train_loss"] and res["curves"]["eval_loss"]
    marked = [step for step, _, complete in ckpt.checkpoints(out) if complete]
    assert marked == [4, 6]  # save_total_limit=2 keeps the newest two, both marked complete
    again = pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), methods.parse_method("diet-rel"), out,
                                           pt.PretrainSettings(**TINY), quiet=True, report_to="none"))
    assert again == json.loads((out / pt.RESULTS).read_text())  # finished: reused, not retrained


def test_pretraining_scores_the_masked_tokens_alone_with_the_loss_of_every_tokens_logits(pretrained):
    from dietpe import DietForMaskedLM
    from dietpe.data.mlm import MlmCollator
    from dietpe.data.tokenizer import load_tokenizer

    out, _ = pretrained
    sparse = DietForMaskedLM.from_pretrained(out / "model").eval()
    assert sparse.config.sparse_prediction  # how it was trained, saved with it
    dense = DietForMaskedLM.from_pretrained(out / "model", sparse_prediction=False).eval()
    tok = load_tokenizer(out / "model")
    collator = MlmCollator(tok)
    g = torch.Generator().manual_seed(0)
    blocks = [[tok.cls_token_id, *torch.randint(5, len(tok), (20,), generator=g).tolist(), tok.sep_token_id]
              for _ in range(6)]
    val_set = pt.ListDataset(collator.premask(blocks, pt.VALIDATION_SEED))
    batch = collator([val_set[i] for i in range(6)])
    with torch.no_grad():
        outs = [m(**batch) for m in (sparse, dense)]
    assert outs[0].logits.shape == (int((batch["labels"] != -100).sum()), len(tok)) and outs[1].logits.dim() == 3
    assert outs[0].loss.item() == pytest.approx(outs[1].loss.item(), rel=1e-6)
    assert pt.mlm_loss(sparse, val_set, collator) == pytest.approx(pt.mlm_loss(dense, val_set, collator), rel=1e-6)


class _Killed(Exception):
    pass


class KillAfterStep4(ckpt.CompleteCheckpoints):
    def on_save(self, args, state, control, **kw):
        super().on_save(args, state, control, **kw)
        if state.global_step == 4:
            raise _Killed


def test_a_kill_after_a_checkpoint_resumes_there_and_a_half_written_one_is_never_loaded(data, tmp_path, monkeypatch,
                                                                                        capsys, caplog):
    monkeypatch.setattr(pt, "CompleteCheckpoints", KillAfterStep4)
    method = methods.parse_method("absolute")
    with pytest.raises(_Killed):
        pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), method, tmp_path, pt.PretrainSettings(**TINY),
                                       report_to="none"))
    assert [(s, c) for s, _, c in ckpt.checkpoints(tmp_path)] == [(2, True), (4, True)]
    # a kill in the middle of writing checkpoint-6: a folder with partial files and no marker
    half = tmp_path / "checkpoint-6"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"\0" * 10)
    monkeypatch.setattr(pt, "CompleteCheckpoints", ckpt.CompleteCheckpoints)
    res = pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), method, tmp_path, pt.PretrainSettings(**TINY),
                                         report_to="none"))
    err = capsys.readouterr().err
    assert "removing incomplete checkpoint" in err and "resuming from" in err and "checkpoint-4" in err
    # the tied decoder is the word embeddings, not a weight the checkpoint lacks
    assert "missing keys" not in err + caplog.text
    assert res["steps"] == 6
    state = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    steps_logged = [r["step"] for r in state["log_history"] if "loss" in r]
    assert steps_logged == sorted(steps_logged) and state["global_step"] == 6


def test_a_checkpoint_damaged_after_its_save_is_refused_naming_the_file(data, tmp_path, monkeypatch):
    monkeypatch.setattr(pt, "CompleteCheckpoints", KillAfterStep4)
    job = pt.PretrainJob(str(data["corpus"]), methods.parse_method("absolute"), tmp_path,
                         pt.PretrainSettings(**TINY), report_to="none")
    with pytest.raises(_Killed):
        pt.run_pretrain(job)
    monkeypatch.setattr(pt, "CompleteCheckpoints", ckpt.CompleteCheckpoints)
    folder = tmp_path / "checkpoint-4"
    files = sorted(p.name for p in folder.iterdir() if p.suffix in (".json", ".safetensors", ".pt", ".pth"))
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(files)
    for name in files:
        whole = (folder / name).read_bytes()
        (folder / name).write_bytes(whole[: len(whole) // 2])  # a copy cut short
        with pytest.raises(DataError, match=rf"{name}: damaged checkpoint file .*delete .*checkpoint-4.*checkpoint-2"):
            ckpt.check_checkpoint(folder)
        (folder / name).write_bytes(whole)
    ckpt.check_checkpoint(folder)  # restored: accepted
    (folder / "optimizer.pt").write_bytes(b"\0" * 100)
    with pytest.raises(DataError, match="optimizer.pt: damaged checkpoint file"):
        pt.run_pretrain(job)


def test_finetune_grid_takes_each_runs_best_and_the_median_over_seeds(pretrained, data, tmp_path):
    out, res = pretrained
    task = load_task(str(data["pair-order"]))
    summary = ft.run_finetune(res["model_dir"], task, tmp_path, ft.FinetuneSettings(**FT), quiet=True, report_to="none")
    assert len(summary["runs"]) == 4 and summary["task"] == "pair-order"
    for lr, entry in summary["per_lr"].items():
        bests = sorted(r["best"]["score"] for r in summary["runs"] if str(r["lr"]) == lr)
        assert entry["score"] == pytest.approx(sum(bests) / 2)  # median of two seeds
    assert summary["score"] == max(e["score"] for e in summary["per_lr"].values())
    assert 0 <= summary["averaged"]["accuracy"] <= 100
    first = tmp_path / "lr0.001-seed0" / ft.RESULT
    stamp = first.stat().st_mtime_ns
    ft.run_finetune(res["model_dir"], task, tmp_path, ft.FinetuneSettings(**FT), quiet=True, report_to="none")
    assert first.stat().st_mtime_ns == stamp  # finished runs are not redone
    task.train[0] = dataclasses.replace(task.train[0], label=1 - task.train[0].label)  # other data, same sizes
    with pytest.raises(ConfigError, match="data_sha256"):
        ft.run_finetune(res["model_dir"], task, tmp_path, ft.FinetuneSettings(**FT), quiet=True, report_to="none")


def test_finetune_keeps_each_runs_model_unless_told_not_to(pretrained, data, tmp_path):
    from dietpe import DietForSequenceClassification

    _, res = pretrained
    common = [res["model_dir"], str(data["order"]), "--ft-recipe", "toy", "--lrs", "1e-3", "--seeds", "1",
              "--epochs", "1", "--max-train", "32", "--max-eval", "16", "--threads", "1"]
    assert cli(["finetune", *common, "-o", str(tmp_path / "keep")]) == 0
    run = tmp_path / "keep" / "lr0.001-seed0"
    assert (run / "model" / "model.safetensors").is_file() and not list(run.glob("checkpoint-*"))
    model = DietForSequenceClassification.from_pretrained(run / "model")
    assert model.config.num_labels >= 2
    assert cli(["finetune", *common, "-o", str(tmp_path / "none"), "--no-save-model"]) == 0
    assert not (tmp_path / "none" / "lr0.001-seed0" / "model").exists()


def test_summary_median_and_best_learning_rate():
    spec = synthetic.TASKS["order"]

    def run(lr, score):
        return {"lr": lr, "seed": 0, "best": {"score": score, "metrics": {"dev": {"accuracy": score}}}}

    s = ft.summarise([run(1e-3, 60), run(1e-3, 90), run(1e-3, 70), run(2e-3, 80), run(2e-3, 10), run(2e-3, 81)],
                     spec, None)
    assert s["per_lr"]["0.001"]["score"] == 70 and s["per_lr"]["0.002"]["score"] == 80
    assert s["best_lr"] == 2e-3 and s["averaged"]["accuracy"] == 80


def test_a_diverged_run_counts_as_the_worst_seed_wherever_it_lies():
    spec = synthetic.TASKS["order"]
    nan = float("nan")

    def run(lr, score):
        return {"lr": lr, "seed": 0, "best": {"score": score, "metrics": {"dev": {"accuracy": score}}}}

    for order in ([nan, 80.0, 81.0], [80.0, nan, 81.0], [80.0, 81.0, nan]):
        s = ft.summarise([run(1e-3, x) for x in order] + [run(3e-3, 70.0)] * 3, spec, None)
        assert s["per_lr"]["0.001"]["score"] == 80.0 and s["per_lr"]["0.001"]["diverged"] == 1
        assert s["best_lr"] == 1e-3
    # mostly diverged: its median is NaN, and it does not win, wherever it comes
    for lrs in ((1e-3, 3e-3), (3e-3, 1e-3)):
        runs = [run(lrs[0], nan)] * 2 + [run(lrs[0], 90.0)] + [run(lrs[1], 70.0)] * 3
        assert ft.summarise(runs, spec, None)["best_lr"] == lrs[1]
    assert math.isnan(ft._median([nan, 1.0])) and ft._median([nan, 1.0, 2.0, 3.0]) == 1.5


def test_regression_task_trains_with_pearson_spearman(pretrained, tmp_path):
    out, res = pretrained
    d = tmp_path / "STS-B"
    d.mkdir()
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    rows = "".join(f"{i}\tg\tf\t2012\t{i}\tn\tn\tthe cat sees the fig\tthe {w} eats\t{i % 6}\n"
                   for i, w in enumerate(["dog", "fox", "owl", "cat"] * 5))
    (d / "train.tsv").write_text(head + rows)
    (d / "dev.tsv").write_text(head + rows)
    s = dict(FT, lrs=(1e-3,), seeds=1)
    summary = ft.run_finetune(res["model_dir"], load_task(str(d)), tmp_path / "out", ft.FinetuneSettings(**s),
                              quiet=True, report_to="none")
    assert set(summary["averaged"]) == {"pearson", "spearman"}


def test_qa_finetune_reports_squad_f1_and_em(pretrained, tmp_path):
    out, res = pretrained
    d = tmp_path / "xquad"
    d.mkdir()
    ctx = "the red fox sees the fig near the old owl"
    qas = [{"id": f"q{i}", "question": "what does the fox see ?",
            "answers": [{"text": "the fig", "answer_start": ctx.index("the fig")}]} for i in range(20)]
    doc = json.dumps({"data": [{"paragraphs": [{"context": ctx, "qas": qas}]}]})
    for name in ("train-v1.1.json", "xquad.en.json", "xquad.de.json"):
        (d / name).write_text(doc)
    s = dict(FT, lrs=(1e-3,), seeds=1)
    summary = ft.run_finetune(res["model_dir"], load_task(str(d)), tmp_path / "out", ft.FinetuneSettings(**s),
                              quiet=True, report_to="none")
    assert set(summary["per_set"]) == {"en", "de"} and summary["select_on"] == "en"
    assert set(summary["averaged"]) == {"f1", "exact_match"}


def test_a_length_beyond_a_learned_table_is_refused_before_training(data, tmp_path):
    res = pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), methods.parse_method("absolute"), tmp_path / "abs",
                          pt.PretrainSettings(**dict(TINY, steps=1, save_steps=1)), quiet=True, report_to="none"))
    task = load_task(str(data["order"]))
    with pytest.raises(ConfigError, match="max_length=64 exceeds max_position_embeddings=24.*"
                                          "use --ft-max-length 24 or less"):
        ft.run_finetune(res["model_dir"], task, tmp_path / "ft", ft.FinetuneSettings(**dict(FT, max_length=64)),
                        quiet=True)
    assert not (tmp_path / "ft").exists()


def test_method_specs():
    m = methods.parse_method("diet-rel:segment=input:sharing=layer")
    assert (m.position, m.segment, m.sharing) == ("diet-rel", "input", "layer")
    assert methods.parse_method(m.name) == m
    assert methods.parse_method("diet-abs").segment == "per-head" and methods.parse_method("t5").segment == "input"
    assert [x.name for x in methods.parse_methods("registry")][:2] == ["absolute", "sinusoidal"]
    with pytest.raises(ConfigError, match="position='rope'"):
        methods.parse_method("rope")
    with pytest.raises(ConfigError, match="key=value"):
        methods.parse_method("diet-rel:layer")
    with pytest.raises(ConfigError, match="unknown field"):
        methods.parse_method("diet-rel:colour=blue")
    # the word none is the mode 'none', not Python's None
    assert methods.parse_method("alibi:segment=none").segment == "none"
    assert methods.parse_method("diet-rel:sharing=none:segment=none").sharing == "none"


def test_cli_errors_are_one_line_before_training(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert cli(["pretrain", str(empty), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "empty" in err and str(empty) in err
    bad = tmp_path / "SST-2"
    bad.mkdir()
    (bad / "train.tsv").write_text("sentence\tlabel\nfine\t1\nodd\t3\n")
    (bad / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n")
    assert cli(["finetune", str(tmp_path / "nomodel"), str(bad)]) == 2  # the model is checked before the data
    assert f"{tmp_path / 'nomodel'}: no such pre-trained model folder" in capsys.readouterr().err
    from dietpe.data.tasks import load_task
    from dietpe.errors import DataError

    with pytest.raises(DataError, match="train.tsv:3: label '3'"):  # the catalogue runs it with a model
        load_task(str(bad))
    assert cli(["compare", "--methods", "diet-rel:sharing=sideways"]) == 2
    assert "sharing='sideways'" in capsys.readouterr().err


def test_compare_writes_the_report_with_claims_and_reruns_to_the_same_numbers(tmp_path):
    out = tmp_path / "cmp"
    command = ["compare", "-o", str(out), "--methods", "absolute,diet-rel", "--steps", "3", "--save-steps", "3",
               "--epochs", "1", "--seeds", "1", "--lrs", "1e-3", "--builtin-size", "48", "--max-documents", "60",
               "--pretrain-seeds", "2", "--threads", "1", "--jobs", "1"]
    assert cli(command) == 0
    report = (out / "report.md").read_text()
    assert report.index("## Claims") < report.index("## Results")
    env = report[report.index("## Environment"):report.index("## Results")]
    import torch
    for item in (f"| torch | {torch.__version__} |", "| processes (runs at a time) | 1 |", "| threads per process | 1 |",
                 "| pre-training seeds | 0, 1 |", "| command | `dietpe "):
        assert item in env, item
    assert "`diet-rel − absolute`" in report and "rows not run: diet-abs" in report
    assert "| absolute | input | input | none |" in report and "| diet-rel | per-head | per-head | none |" in report
    for task in ("order", "pair-order", "topic", "distance", "start"):
        assert f"finetune_{task}.png" in report
    results = json.loads((out / "results.json").read_text())
    assert [m["method"] for m in results["methods"]] == ["absolute", "diet-rel"]
    assert all(sorted(m["seeds"]) == ["0", "1"] for m in results["methods"])
    assert (out / "pretrain_loss.png").stat().st_size > 1000 and (out / "claims_forest.png").is_file()
    rows = (out / "runs.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 5  # header + methods x pre-training seeds x tasks (1 lr, 1 seed, 1 metric)
    # a rerun reuses every finished run and writes the same numbers
    seeds, claims = (out / "seeds.csv").read_text(), report[report.index("## Claims"):report.index("## Results")]
    (out / "report.md").unlink()
    assert cli(command) == 0
    again = (out / "report.md").read_text()
    assert (out / "seeds.csv").read_text() == seeds
    assert again[again.index("## Claims"):again.index("## Results")] == claims


def test_gradient_accumulation_keeps_the_loss_a_mean(data, tmp_path):
    """Batch 8 as 2 x 4: the logged loss is still a per-token mean (about ln V at the start), not 2x it."""
    s = dict(TINY, steps=2, save_steps=2)
    res = pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), methods.parse_method("t5"), tmp_path,
                                         pt.PretrainSettings(**s), device_batch_size=4, quiet=True, report_to="none"))
    first = res["curves"]["train_loss"][0][1]
    vocab = len(__import__("dietpe.data.tokenizer", fromlist=["x"]).load_tokenizer(res["model_dir"]))
    assert abs(first - torch.tensor(float(vocab)).log().item()) < 1.0


def test_budget_scales_rows_fine_tuning_protocol_and_seeds():
    from dietpe.study.scheduler import budget_defaults
    from dietpe.tasks.recipes import FINETUNE_RECIPES

    one, two, three = (budget_defaults(n, builtin=True) for n in (1, 2, 3))
    assert (one["methods"], one["ft_recipe"], one["pretrain_seeds"]) == ("study", "study", 3)
    assert (two["methods"], two["ft_recipe"], two["pretrain_seeds"]) == ("study+papers", "study-full", 3)
    assert three["pretrain_seeds"] == 5
    full = FINETUNE_RECIPES["study-full"]
    assert full.seeds == 3 and len(full.learning_rates) >= 2  # the papers' protocol: grid x median of seeds
    assert FINETUNE_RECIPES["study"].epochs == full.epochs  # the default differs only in grid and seeds
    assert budget_defaults(2, builtin=False)["ft_recipe"] == "cpu"


@pytest.mark.parametrize("steps, save_steps, want", [(600, 100, 25), (1000, 200, 50), (6, 2, 1), (500, 125, 25),
                                                      (1000, 7, 7), (1000, 13, 13), (1000, 97, 1)])
def test_the_loss_is_logged_at_a_divisor_of_the_checkpoint_interval(steps, save_steps, want):
    """A resumed run logs the same windows of steps as one not killed: every checkpoint is a logging step."""
    assert pt.logging_steps(steps, save_steps) == want
