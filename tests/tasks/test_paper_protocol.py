"""The papers' fine-tuning protocol and convergence study on tiny generated data: the last step is a
checkpoint too, QQP is selected by accuracy, and a kept middle step is a model `dietpe finetune` takes (TUPE
Fig. 5: fine-tuning TUPE-A^mid is one command)."""

import csv
import dataclasses
import json

import pytest
import torch

from dietpe import methods
from dietpe.cli import main as cli
from dietpe.data import synthetic
from dietpe.data.tasks import load_task
from dietpe.tasks import finetune as ft
from dietpe.tasks import pretrain as pt
from tests.tasks.test_pipeline import FT, TINY


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    torch.set_num_threads(1)
    return synthetic.write_builtin(tmp_path_factory.mktemp("data"), seed=0, documents=60, train=48, dev=24)


@pytest.fixture(scope="module")
def kept(data, tmp_path_factory):
    """A 6-step run keeping step 3 (not a checkpoint step of --save-steps 2)."""
    out = tmp_path_factory.mktemp("pt")
    s = pt.PretrainSettings(**TINY, keep_steps=(3,))
    res = pt.run_pretrain(pt.PretrainJob(str(data["corpus"]), methods.parse_method("tupe-a"), out, s, quiet=True,
                                         report_to="none"))
    return out, res


def test_a_kept_step_is_a_model_folder(kept):
    out, res = kept
    mid = pt.kept_model_dir(out, 3)
    assert {p.name for p in mid.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert json.loads((out / "run_settings.json").read_text())["settings"]["keep_steps"] == [3]
    from safetensors.torch import load_file

    a, b = load_file(mid / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)  # step 3, not the last


def test_finetuning_a_middle_checkpoint_is_one_command(kept, data, tmp_path):
    out, _ = kept
    rc = cli(["finetune", str(pt.kept_model_dir(out, 3)), str(data["order"]), "-o", str(tmp_path / "mid"),
              "--ft-recipe", "toy", "--seeds", "1", "--epochs", "1", "--ft-max-length", "24", "--no-save-model",
              "--threads", "1"])
    assert rc == 0 and json.loads((tmp_path / "mid" / "summary.json").read_text())["runs"]


def test_the_last_step_is_evaluated_when_it_falls_between_two_intervals(kept, data, tmp_path):
    out, res = kept
    task = load_task(str(data["order"]))  # 48 examples, batch 16: 3 steps per epoch
    s = ft.FinetuneSettings(**dict(FT, lrs=(1e-3,), seeds=1, epochs=1, eval_steps=2))
    summary = ft.run_finetune(res["model_dir"], task, tmp_path / "ft", s, quiet=True, report_to="none")
    history = json.loads((tmp_path / "ft" / "lr0.001-seed0" / "result.json").read_text())["history"]
    assert [h["step"] for h in history] == [2, 3]  # "the maximum ... over all checkpoints": the last one too
    assert summary["score"] == max(h["score"] for h in history)


def write_qqp(src, folder):
    """The built-in pair task in QQP's GLUE layout (question1, question2, is_duplicate)."""
    folder.mkdir()
    for split in ("train", "dev"):
        rows = list(csv.DictReader(open(src / f"{split}.tsv"), delimiter="\t"))
        a, b = [k for k in rows[0] if k.startswith("sentence")][:2]
        labels = sorted({r["label"] for r in rows})
        with open(folder / f"{split}.tsv", "w", newline="") as f:
            w = csv.writer(f, delimiter="\t")
            w.writerow(["id", "qid1", "qid2", "question1", "question2", "is_duplicate"])
            for i, r in enumerate(rows):
                w.writerow([i, 2 * i, 2 * i + 1, r[a], r[b], int(r["label"] == labels[0])])
    return folder


def test_the_paper_recipe_selects_and_reports_qqp_by_accuracy(kept, data, tmp_path):
    _, res = kept
    task = load_task(str(write_qqp(data["pair-order"], tmp_path / "QQP")), "qqp")
    s = dataclasses.replace(ft.FinetuneSettings(**dict(FT, lrs=(1e-3,), seeds=1, epochs=2)),
                            metrics=(("QQP", "accuracy"),))
    summary = ft.run_finetune(res["model_dir"], task, tmp_path / "ft", s, quiet=True, report_to="none")
    assert summary["primary"] == "accuracy" and summary["metrics"] == ["accuracy", "f1"]
    history = summary["runs"][0]["best"]
    assert history["score"] == history["metrics"]["dev"]["accuracy"]
    default = ft.run_finetune(res["model_dir"], task, tmp_path / "ft-default",
                              ft.FinetuneSettings(**dict(FT, lrs=(1e-3,), seeds=1, epochs=2)), quiet=True,
                              report_to="none")
    assert default["primary"] == "f1"  # GLUE's own order, dietpe's default
