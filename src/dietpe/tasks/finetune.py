"""`dietpe finetune`: fine-tuning protocol of the DIET paper (appendix A, Table 7; Tables 2 and 3).

GLUE tasks from their TSVs, XNLI and span QA (XQuAD, MLQA, TyDiQA-GoldP in SQuAD JSON); sentence pairs as two
segments. A grid of learning rates x N seeds; each run is evaluated after every epoch (or every
`--eval-steps`) and scored at its best evaluation ("the maximum over all checkpoints"); a learning rate's
score is the median over seeds, and the best learning rate is reported. Cross-lingual zero-shot: train on
English, evaluate every language given; the checkpoint is chosen on English where English is evaluated.

A finished run writes `result.json` atomically; a rerun skips finished runs. A run in progress is checkpointed
at each evaluation (kill-safe, `dietpe.tasks.checkpoints`) and resumed exactly: a killed grid loses at most one
evaluation interval, and ends bit-identical to an uninterrupted one. The grid's settings (model fingerprint,
task, hyper-parameters) are recorded in the output folder; a rerun with other settings is refused.
"""

from __future__ import annotations

import math
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from dietpe import validate as V
from dietpe.data import metrics as M
from dietpe.data.qa import SPECIAL as QA_SPECIAL
from dietpe.data.qa import best_answers, encode_eval, encode_train
from dietpe.data.corpus import is_hf_name
from dietpe.data.tasks import XNLI, TaskData, load_task
from dietpe.data.tokenizer import load_tokenizer
from dietpe.errors import ConfigError, DataError
from dietpe.tasks.checkpoints import (
    CompleteCheckpoints,
    check_run_settings,
    checkpoints,
    file_fingerprint,
    local_path,
    read_result,
    resumable_checkpoint,
    train_resumable,
    write_json_atomic,
)
from dietpe.tasks.recipes import check_model_length
from dietpe.tasks.runtime import (
    ListDataset,
    ProgressBar,
    batch_layout,
    is_main_process,
    replace_progress,
    set_threads,
    trainer_device_args,
    world_size,
)
from dietpe.tasks.seeding import SeededTrainer
from dietpe.tasks.settings import FinetuneSettings

RESULT = "result.json"
SUMMARY = "summary.json"


def split_options(args) -> None:
    """The split prefixes pick files of a task's directory: beside the files named, or a Hugging Face task (its
    splits are train and validation), they would be ignored, so they are refused. Unset, they are the defaults."""
    if is_hf_name(args.task):
        V.refuse_unused(args, {"train_file": "--train-file", "eval_files": "--eval-files",
                               "train_split": "--train-split", "eval_split": "--eval-split"},
                        "to a Hugging Face task: it is read from the hub's train and validation splits")
    if args.train_file:
        V.refuse_unused(args, {"train_split": "--train-split"}, "beside --train-file, which names the training file")
    if args.eval_files:
        V.refuse_unused(args, {"eval_split": "--eval-split"}, "beside --eval-files, which name the evaluated files")
    args.train_split, args.eval_split = args.train_split or "train", args.eval_split or "dev"


def refuse_unused_options(args, tasks: list[TaskData]) -> None:
    """Options that apply to a kind of task none of the tasks is."""
    if not any(t.spec.kind == "qa" for t in tasks):
        names = ", ".join(t.spec.name for t in tasks)
        V.refuse_unused(args, {"doc_stride": "--doc-stride"}, f"to {names}: it sets QA's context windows")


def check_tasks(tasks: dict[str, TaskData], s: FinetuneSettings) -> None:
    """What a study can refuse about its tasks before pre-training: a training set smaller than one batch, and
    a QA stride no window has room for (less than --ft-max-length leaves after the special tokens and a
    question of one token; the questions' own lengths wait for the tokenizer)."""
    for name, data in tasks.items():
        if data.spec.kind != "qa" and len(data.train) < s.batch_size:
            raise DataError(f"{data.source}: {len(data.train)} training examples of {name}, fewer than one "
                            f"fine-tuning batch of {s.batch_size} (--ft-batch-size)")
        room = s.max_length - QA_SPECIAL - 1
        if data.spec.kind == "qa" and s.doc_step is None and s.doc_stride >= room:
            raise ConfigError(f"--doc-stride {s.doc_stride} must be less than {room}, the most room for context "
                              f"that --ft-max-length {s.max_length} leaves after {QA_SPECIAL} special tokens and a "
                              f"question ({name}); lower --doc-stride or raise --ft-max-length")


def settings(args) -> FinetuneSettings:
    """The fine-tuning recipe with the command line's overrides applied."""
    return FinetuneSettings.from_args(args)


# -- encoding ------------------------------------------------------------------------------------------------

def encode_pairs(examples, tokenizer, max_length: int, regression: bool) -> list[dict]:
    a = [e.text_a for e in examples]
    b = [e.text_b for e in examples] if examples and examples[0].text_b is not None else None
    enc = tokenizer(a, b, truncation=True, max_length=max_length)
    return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
             "attention_mask": enc["attention_mask"][i],
             "labels": float(e.label) if regression else int(e.label)} for i, e in enumerate(examples)]


class Scorer:
    """Encodes a task's evaluation sets and turns model predictions into the task's metrics."""

    def __init__(self, data: TaskData, tokenizer, s: FinetuneSettings, select_on: str | None):
        self.spec, self.data, self.tokenizer, self.s = data.spec, data, tokenizer, s
        self.sets: dict[str, tuple[ListDataset, object]] = {}
        for name, examples in data.scored(s.max_eval).items():
            if self.spec.kind == "qa":
                feats, meta = encode_eval(examples, tokenizer, s.max_length, s.doc_stride, s.doc_step)
                self.sets[name] = (ListDataset(feats), (examples, meta))
            else:
                feats = encode_pairs(examples, tokenizer, s.max_length, self.spec.kind == "regression")
                self.sets[name] = (ListDataset(feats), np.array([f["labels"] for f in feats]))
        self.metrics = s.metric_order(self.spec)  # the recipe's selecting metric first (QQP by accuracy)
        self.primary = self.metrics[0]
        self.select_on = select_on if select_on in self.sets else None

    def examples(self, name: str) -> int:
        """How many examples of the set `name` are scored (a QA example may span several windows)."""
        features, gold = self.sets[name]
        return len(gold[0]) if self.spec.kind == "qa" else len(features)

    def score(self, name: str, predictions) -> dict[str, float]:
        _, gold = self.sets[name]
        if self.spec.kind == "qa":
            examples, meta = gold
            start, end = predictions
            answers = best_answers(examples, meta, start, end)
            lang = name if self.spec.name == "MLQA" else None  # MLQA's official per-language normalisation
            return M.squad_scores(answers, {e.id: [a["text"] for a in e.answers] for e in examples}, lang)
        logits = predictions[0] if isinstance(predictions, tuple) else predictions
        pred = logits.reshape(-1) if self.spec.kind == "regression" else logits.argmax(-1)
        return M.task_metrics(self.spec.metrics, pred, gold)

    def selection_score(self, per_set: dict[str, dict[str, float]]) -> float:
        """What picks the best evaluation of a run: English if evaluated, else the mean over sets."""
        if self.select_on:
            return per_set[self.select_on][self.primary]
        return float(np.mean([m[self.primary] for m in per_set.values()]))


def make_trainer_class():
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState

    class EvalHistory(TrainerCallback, ExportableState):
        """The run's evaluations, saved in each checkpoint's trainer state and restored on resume."""

        def __init__(self, history: list | None = None):
            self.history = list(history or [])

        def state(self) -> dict:
            return {"args": {"history": self.history}, "attributes": {}}

    class TaskTrainer(SeededTrainer):
        """Trainer whose evaluation scores every evaluation set with the task's official metrics."""

        def __init__(self, *a, scorer: Scorer, callbacks=None, **kw):
            super().__init__(*a, callbacks=[*(callbacks or []), EvalHistory()], **kw)
            self.scorer = scorer

        @property
        def history(self) -> list[dict]:
            """The evaluations so far (the callback object is replaced when a checkpoint is resumed)."""
            return next(cb for cb in self.callback_handler.callbacks if isinstance(cb, EvalHistory)).history

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            per_set = {}
            for name, (dataset, _) in self.scorer.sets.items():
                out = self.predict(dataset, metric_key_prefix=metric_key_prefix)
                per_set[name] = self.scorer.score(name, out.predictions)
            score = self.scorer.selection_score(per_set)
            metrics = {f"{metric_key_prefix}_score": score}
            for name, values in per_set.items():
                for k, v in values.items():
                    metrics[f"{metric_key_prefix}_{name}_{k}"] = v
            self.history.append({"step": self.state.global_step, "epoch": self.state.epoch, "score": score,
                                 "metrics": per_set})
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    return TaskTrainer


def model_class(kind: str):
    from dietpe import DietForQuestionAnswering, DietForSequenceClassification
    return DietForQuestionAnswering if kind == "qa" else DietForSequenceClassification


def quiet_load(cls, model_dir: Path, **kwargs):
    """`from_pretrained` (safetensors only) without the load report: the MLM head is meant to be dropped and
    the pooler and classifier are meant to be new."""
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return V.load_whole(cls, model_dir, new=("classifier.", "qa_outputs.", "diet.pooler."), **kwargs)
    finally:
        hf_logging.set_verbosity(level)


def run_one(model_dir: Path, data: TaskData, train_set: ListDataset, scorer: Scorer, tokenizer, lr: float,
            seed: int, s: FinetuneSettings, out: Path, quiet: bool, description: str, report_to: str = "tensorboard",
            device_args: dict | None = None, save_model: bool = False) -> dict:
    """One fine-tuning run; returns its history and best evaluation. `save_model`: keep the model at the end
    of the run in `out/model` (safetensors, loadable with `from_pretrained`, with its tokenizer)."""
    from transformers import DataCollatorWithPadding, TrainingArguments, set_seed

    spec = data.spec
    per_device, accumulation = batch_layout(s.batch_size, s.batch_size)
    steps_per_epoch = max(1, len(train_set) // s.batch_size)
    args = TrainingArguments(
        output_dir=str(out), num_train_epochs=s.epochs_for(spec.name), learning_rate=lr, warmup_steps=s.warmup,
        lr_scheduler_type="linear", weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm,
        adam_epsilon=s.adam_epsilon,
        per_device_train_batch_size=per_device, per_device_eval_batch_size=128,
        gradient_accumulation_steps=accumulation,
        eval_strategy="steps" if s.eval_steps else "epoch", eval_steps=s.eval_steps,
        save_strategy="steps" if s.eval_steps else "epoch", save_steps=s.eval_steps, save_total_limit=2,
        restore_callback_states_from_checkpoint=True,
        logging_steps=max(1, steps_per_epoch // 5), seed=seed, data_seed=seed,
        report_to=[report_to] if report_to != "none" else [], **(device_args or trainer_device_args(None)),
        disable_tqdm=quiet, remove_unused_columns=False, log_level="warning", ddp_find_unused_parameters=False)
    set_seed(seed)  # the new head's initialisation and dropout differ per seed
    kwargs = {} if spec.kind == "qa" else dict(
        num_labels=spec.num_labels,
        problem_type="regression" if spec.kind == "regression" else "single_label_classification")
    model = quiet_load(model_class(spec.kind), model_dir, **kwargs)
    first_eval = next(iter(scorer.sets.values()))[0]  # Trainer insists on one; evaluate() scores them all
    trainer = make_trainer_class()(model=model, args=args, train_dataset=train_set, eval_dataset=first_eval,
                                   data_collator=DataCollatorWithPadding(tokenizer), scorer=scorer,
                                   callbacks=[CompleteCheckpoints()])
    replace_progress(trainer, ProgressBar(description, score_key="eval_score"))
    resume = resumable_checkpoint(out, remove_incomplete=is_main_process())
    trainer.accelerator.wait_for_everyone()
    start = time.time()
    train_resumable(trainer, resume)
    if not trainer.history or trainer.history[-1]["step"] != trainer.state.global_step:
        trainer.evaluate()  # the last step is a checkpoint too (fewer steps than an interval, or between two)
    best = max(trainer.history, key=lambda h: _ranked(h["score"]))
    if save_model and is_main_process():
        final, tmp = out / "model", out / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        trainer.model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # whole or absent: a run is finished only when its result.json follows
    return dict(lr=lr, seed=seed, best=best, history=trainer.history, seconds=time.time() - start,
                train_loss=[(r["step"], r["loss"]) for r in trainer.state.log_history if "loss" in r])


def _ranked(score: float) -> float:
    """A score as a choice ranks it: NaN (a diverged run) below every number."""
    return -math.inf if math.isnan(score) else score


def _median(values) -> float:
    """The median with NaN (a diverged run) ranked below every number, as the worst seed: dropping it would
    flatter a learning rate that diverges. NaN when the middle is NaN."""
    xs = sorted(values, key=_ranked)
    mid = len(xs) // 2
    if len(xs) % 2:
        return xs[mid]
    return math.nan if math.isnan(xs[mid - 1]) else statistics.mean(xs[mid - 1:mid + 1])


def summarise(runs: list[dict], spec, select_on: str | None, metrics: tuple[str, ...] | None = None) -> dict:
    """Median over seeds per learning rate (each metric of each evaluation set; a diverged run, NaN, counts as
    the worst seed); the best learning rate. `metrics`: the task's metrics, the selecting one first (default:
    the task's order)."""
    metrics = tuple(metrics or spec.metrics)
    by_lr: dict[float, list[dict]] = {}
    for r in runs:
        by_lr.setdefault(r["lr"], []).append(r)
    per_lr = {}
    for lr, rs in sorted(by_lr.items()):
        sets = rs[0]["best"]["metrics"].keys()
        per_lr[lr] = {
            "score": _median(r["best"]["score"] for r in rs),
            "seeds": len(rs),
            "diverged": sum(math.isnan(r["best"]["score"]) for r in rs),
            "metrics": {name: {k: _median(r["best"]["metrics"][name][k] for r in rs)
                               for k in rs[0]["best"]["metrics"][name]} for name in sets},
        }
    best_lr = max(per_lr, key=lambda lr: _ranked(per_lr[lr]["score"]))
    best = per_lr[best_lr]
    sets = list(best["metrics"])
    # The table's numbers: each metric averaged over the evaluation sets (languages, MNLI m/mm).
    averaged = {k: float(np.mean([best["metrics"][n][k] for n in sets])) for k in metrics}
    return dict(task=spec.name, kind=spec.kind, metrics=list(metrics), primary=metrics[0],
                select_on=select_on, best_lr=best_lr, score=best["score"], averaged=averaged,
                per_set=best["metrics"], per_lr={str(k): v for k, v in per_lr.items()})


def run_finetune(model_dir: str | Path, data: TaskData, output_dir: str | Path, s: FinetuneSettings, *,
                 train_language: str = "en", quiet: bool = False, label: str = "", report_to: str = "tensorboard",
                 device_args: dict | None = None, save_model: bool = False) -> dict:
    """The lr x seed grid on one task; returns (and writes) its summary. `device_args`: `trainer_device_args`.
    `save_model`: keep each run's fine-tuned model in `LR-SEED/model` (what `dietpe finetune` does unless
    --no-save-model)."""
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    log = (lambda m: None) if quiet or not is_main_process() else (
        lambda m: print(f"[finetune] {m}", file=sys.stderr))
    if not (model_dir / "config.json").is_file():
        raise DataError(f"{model_dir}: not a pre-trained model directory (no config.json); pass dietpe pretrain's "
                        f"<output>/model")
    from dietpe import DietConfig
    config = DietConfig.from_pretrained(model_dir)
    check_model_length(config, s.max_length, str(model_dir))
    tokenizer = load_tokenizer(model_dir)
    spec = data.spec
    run = dict(task="finetune", model=local_path(str(model_dir)),
               model_sha256=file_fingerprint(model_dir / "model.safetensors"),
               tokenizer_sha256=file_fingerprint(model_dir / "tokenizer.json"), data=local_path(data.source),
               task_name=spec.name, train_examples=len(data.train), data_sha256=data.fingerprint(),
               eval_sets={name: len(examples) for name, examples in data.evals.items()},
               train_language=train_language, settings=s.record(), processes=world_size())
    compiled = (device_args or {}).get("torch_compile_mode") or (device_args or {}).get("torch_compile_backend")
    if compiled:  # a compiled run's bits may differ from an eager one's: resumed only with the same choice
        run["compile"] = compiled
    check_run_settings(output_dir, run, "another -o (or delete the folder)", products=(SUMMARY, "lr*-seed*"))
    if spec.kind == "qa":
        train_set = ListDataset(encode_train(data.train, tokenizer, s.max_length, s.doc_stride, s.doc_step))
    else:
        train_set = ListDataset(encode_pairs(data.train, tokenizer, s.max_length, spec.kind == "regression"))
    if len(train_set) < s.batch_size:
        raise DataError(f"{data.source}: {len(train_set)} training examples, fewer than one batch of "
                        f"{s.batch_size}")
    scorer = Scorer(data, tokenizer, s, train_language)
    windows = "" if spec.kind != "qa" else f" in {len(train_set):,} windows"
    log(f"{spec.name}: {len(data.train):,} training examples{windows}; evaluating on "
        + ", ".join(f"{n} ({scorer.examples(n):,})" for n in scorer.sets)
        + f"; {len(s.lrs)} learning rate(s) x {s.seeds} seed(s)")
    runs = []
    for lr in s.lrs:
        for seed in range(s.seeds):
            out = output_dir / f"lr{lr:g}-seed{seed}"
            if (out / RESULT).is_file():
                runs.append(read_result(out / RESULT, ("lr", "seed", "best", "seconds")))
                continue
            result = run_one(model_dir, data, train_set, scorer, tokenizer, lr, seed, s, out, quiet,
                             f"{label}{spec.name} lr={lr:g} seed={seed}", report_to, device_args, save_model)
            if is_main_process():
                write_json_atomic(out / RESULT, result)
                for _, folder, _ in checkpoints(out):  # finished: its checkpoints are no longer needed
                    shutil.rmtree(folder, ignore_errors=True)
            runs.append(result)
    summary = summarise(runs, spec, scorer.select_on, scorer.metrics)
    summary["runs"] = [{k: r[k] for k in ("lr", "seed", "best", "seconds")} for r in runs]
    if is_main_process():
        write_json_atomic(output_dir / SUMMARY, summary)
    metric_text = " / ".join(f"{k} {summary['averaged'][k]:.2f}" for k in scorer.metrics)
    log(f"{spec.name}: {metric_text} (median of {s.seeds} seed(s) at lr {summary['best_lr']:g})")
    return summary


def main(args) -> int:
    set_threads(args.threads)
    s = settings(args)
    device_args = trainer_device_args(args.device, args.precision, args.deterministic, args.compile)
    out = V.check_output_dir(args.output_dir, "-o")
    split_options(args)
    batch_layout(s.batch_size, s.batch_size)  # a batch the processes cannot share, refused before any work
    model_dir = V.find_model_dir(args.model)  # MODEL or a `dietpe pretrain` run folder holding MODEL/model
    data = load_task(args.task, args.task_type, args.train_file, args.eval_files, args.train_split,
                     args.eval_split, args.train_language or "en", args.max_train)
    refuse_unused_options(args, [data])
    if not (data.spec.kind == "qa" or data.spec is XNLI):
        V.refuse_unused(args, {"train_language": "--train-language"},
                        f"to {data.spec.name}: it names the language XNLI and QA fine-tune on")
    args.train_language = args.train_language or "en"
    with V.created_only_on_success(out):
        summary = run_finetune(model_dir, data, out, s, train_language=args.train_language, device_args=device_args,
                               save_model=args.save_model)
    if is_main_process():
        print(f"{summary['task']}\tbest lr {summary['best_lr']:g}")
        for name, values in summary["per_set"].items():
            print(f"  {name}\t" + "\t".join(f"{k}={v:.2f}" for k, v in values.items()))
    return 0
