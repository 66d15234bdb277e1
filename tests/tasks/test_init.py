"""`dietpe pretrain --init` is continued pre-training: on a tiny BERT trained here (seconds, generated text), a
short run of a per-head method keeps what the checkpoint knew. With BERT's input table kept (the `--init`
default) the validation MLM loss stays near the checkpoint's; with it dropped it still beats the same run from
scratch; the `init` recipe is chosen when --init is given and the log says what keeping or dropping means."""

from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from dietpe import methods
from dietpe.cli import main as cli
from dietpe.data import synthetic
from dietpe.data.mlm import MlmCollator
from dietpe.tasks import pretrain as pt
from dietpe.tasks.recipes import PRETRAIN_RECIPES, SIZES
from dietpe.tasks.checkpoints import RUN_SETTINGS, read_json

MAX_LENGTH = 24
# continued pre-training with the `init` recipe's learning rate and warm-up, a few steps
RUN = dict(size="toy", vocab_size=200, max_length=MAX_LENGTH, steps=20, batch_size=16,
           lr=PRETRAIN_RECIPES["init"].learning_rate, warmup=PRETRAIN_RECIPES["init"].warmup, save_steps=20,
           weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A BERT of the `toy` size trained to a useful masked LM on the generated corpus, and its validation loss."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("init")
    data = synthetic.write_builtin(root / "data", seed=0, documents=300, train=8, dev=8)
    corpus = str(data["corpus"])
    tok, train_blocks, val_blocks = pt.prepare_data(corpus, None, None, 200, MAX_LENGTH, root, None,
                                                    lambda m: None, 64)
    sizes = SIZES["toy"][1]
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), max_position_embeddings=MAX_LENGTH,
                                       pad_token_id=tok.pad_token_id, **sizes))
    collator = MlmCollator(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps = 250
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 25) * (1 - s / steps))
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(len(train_blocks), (32,), generator=g).tolist()
        loss = model(**collator([{"input_ids": train_blocks[i]} for i in idx])).loss
        loss.backward()
        opt.step(), sched.step(), opt.zero_grad()
    path = root / "bert"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    val_set = pt.ListDataset(collator.premask(val_blocks, pt.VALIDATION_SEED))  # the masks pretrain scores
    return dict(corpus=corpus, path=path, loss=pt.mlm_loss(model.eval(), val_set, collator))


def run(bert, out: Path, spec: str, init: bool) -> float:
    method = methods.parse_method(spec)
    if init:
        method = pt.init_method(method)
    res = pt.run_pretrain(pt.PretrainJob(bert["corpus"], method, out, pt.PretrainSettings(**RUN),
                                         tokenizer=str(bert["path"]), quiet=True, report_to="none", max_validation=64,
                                         init=str(bert["path"]) if init else None))
    return res["val_loss"]


def test_a_short_run_keeps_what_the_checkpoint_knew(bert, tmp_path):
    assert bert["loss"] < 3.6  # the checkpoint knows the corpus (an untrained model: ln 200 ≈ 5.3)
    kept = run(bert, tmp_path / "kept", "diet-abs", init=True)
    dropped = run(bert, tmp_path / "dropped", "diet-abs:input_positions=false", init=True)
    scratch = run(bert, tmp_path / "scratch", "diet-abs", init=False)
    assert kept < bert["loss"] + 0.15, (kept, bert["loss"])  # table kept: near the checkpoint
    assert dropped < scratch - 0.5, (dropped, scratch)  # dropped: the content weights still carry knowledge
    assert kept < dropped, (kept, dropped, scratch, bert["loss"])


def test_init_chooses_the_init_recipe_and_says_what_keeping_means(bert, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["pretrain", bert["corpus"], "--init", str(bert["path"]), "--method", "diet-rel", "--steps", "2",
                "--batch-size", "8", "--max-length", str(MAX_LENGTH), "--threads", "1", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    dropped_line = next(line for line in err.splitlines() if "dropped:" in line)
    assert "diet-rel:input_positions=True" in err and "position_embeddings" not in dropped_line
    assert "BERT's input position table kept beside 'diet-rel'" in err
    settings, recipe = read_json(out / RUN_SETTINGS)["settings"], PRETRAIN_RECIPES["init"]
    assert (settings["lr"], settings["warmup"]) == (recipe.learning_rate, recipe.warmup)
    dropped = tmp_path / "dropped"
    assert cli(["pretrain", bert["corpus"], "--init", str(bert["path"]), "--method",
                "diet-rel:input_positions=false", "--steps", "2", "--batch-size", "8", "--max-length",
                str(MAX_LENGTH), "--threads", "1", "-o", str(dropped)]) == 0
    err = capsys.readouterr().err
    assert "dropped: bert.embeddings.position_embeddings.weight" in err
    assert "must learn position from its fresh terms" in err
