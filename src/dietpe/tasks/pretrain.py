"""`dietpe pretrain`: masked-LM pre-training as in the DIET paper (appendix A): BERT's MLM without the
next-sentence task, full sentences packed to the maximum length (RoBERTa), AdamW (LAMB in the `paper` recipe,
whose Table 7 values are LAMB's batch-4K setting) with linear warm-up and decay, gradient clipping; Table 7's
hyper-parameters as the `paper` recipe.

Runs on the Hugging Face `Trainer`, so `torchrun --nproc_per_node N` or `accelerate launch` distribute it
(gloo on CPU). Checkpoints are marked complete after they are written and a rerun resumes from the newest
complete one (see `dietpe.tasks.seeding`). Reports validation MLM loss (mean over masked tokens) and perplexity
on a validation set masked once with a fixed seed, so every method is scored on the same positions.
"""

from __future__ import annotations

import copy
import hashlib
import math
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from dietpe import validate as V
from dietpe.config import DietConfig
from dietpe.data import shards
from dietpe.data.sources import chunks as iter_chunks
from dietpe.data.sources import resolve as resolve_source
from dietpe.data.mlm import MlmCollator
from dietpe.data.tokenizer import load_tokenizer, save_tokenizer
from dietpe.errors import ConfigError, DataError
from dietpe.methods import Method, parse_method
from dietpe.positions.registry import REGISTRY
from dietpe.tasks.checkpoints import (
    CompleteCheckpoints,
    check_run_settings,
    file_fingerprint,
    local_path,
    read_json,
    read_result,
    resumable_checkpoint,
    train_resumable,
    write_json_atomic,
)
from dietpe.tasks.recipes import PRETRAIN_RECIPES, build_config
from dietpe.tasks.runtime import (
    ListDataset,
    ProgressBar,
    batch_layout,
    check_memory,
    is_main_process,
    log_history_curves,
    replace_progress,
    set_threads,
    start_afresh,
    trainer_device_args,
    world_size,
)
from dietpe.tasks.optim import LogitLrTrainer
from dietpe.tasks.seeding import EpochExamples
from dietpe.tasks.settings import PretrainJob, PretrainSettings

RESULTS = "pretrain_results.json"
VALIDATION_SEED = 1234  # the masking of the validation set, shared by all methods


def init_method(method: Method) -> Method:
    """The method `--init` trains: a per-head method keeps BERT's input position table beside it unless the spec
    says input_positions=false (what dropping it costs: docs/causal.md, "Continued pre-training")."""
    if not REGISTRY[method.position].per_head or "input_positions" in dict(method.extra):
        return method
    return replace(method, extra=method.extra + (("input_positions", True),))


def init_positions_note(method: Method) -> str:
    """What keeping or dropping BERT's positions means, for the log."""
    info = REGISTRY[method.position]
    if info.learned_table and not info.per_head:  # a learned input table, as BERT's
        return "BERT's input position table is the method itself: kept"
    if not info.per_head:
        return (f"BERT's input position table dropped for {method.position!r} (an input method of its own): the "
                f"checkpoint's layers were trained with BERT's positions and must adapt to the new ones")
    if dict(method.extra).get("input_positions"):
        return (f"BERT's input position table kept beside {method.position!r} (input_positions=true): the model "
                f"keeps what the checkpoint knew and the new terms learn beside it; it remains limited to BERT's "
                f"max_position_embeddings. input_positions=false drops the table")
    return (f"BERT's input position table dropped (input_positions=false): the checkpoint's layers lose the "
            f"positions they were trained with and {method.position!r} must learn position from its fresh terms "
            f"(masked accuracy falls at first; docs/causal.md)")


def settings(args) -> PretrainSettings:
    """The recipe with the command line's overrides applied."""
    return PretrainSettings.from_args(args)


def prepare_data(corpus: str, validation: str | None, tokenizer_path: str | None, vocab_size: int,
                 max_length: int, output_dir: Path, max_documents: int | None, log=print,
                 max_validation: int | None = None, *, cache_dir: str | None = None,
                 packing: str = "full-sentences", tokenizer_sample: int | None = None,
                 processes: int | None = None, tokenizer_type: str = "wordpiece", special_tokens: str | None = None):
    """The corpus prepared once into memory-mapped shards (`dietpe.data.shards`, reused from the cache):
    (tokenizer, train blocks, validation blocks); a tokenizer of `tokenizer_type` is trained unless given."""
    saved = output_dir / "tokenizer"
    if tokenizer_path:
        tokenizer = load_tokenizer(tokenizer_path)
    elif (saved / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(saved)  # resuming: the vocabulary must not change
    else:
        tokenizer = None
    prepared = shards.prepare(corpus, validation=validation, tokenizer=tokenizer, vocab_size=vocab_size,
                              max_length=max_length, packing=packing, max_documents=max_documents,
                              tokenizer_sample=tokenizer_sample, cache_dir=cache_dir, processes=processes, log=log,
                              tokenizer_type=tokenizer_type, special_tokens=special_tokens)
    if tokenizer is None and is_main_process():
        output_dir.mkdir(parents=True, exist_ok=True)
        tmp = output_dir / "tokenizer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        prepared.tokenizer.save_pretrained(tmp)
        shutil.rmtree(saved, ignore_errors=True)
        tmp.rename(saved)
    if max_validation:
        prepared.validation.limit = max_validation
    m = prepared.manifest
    log(f"corpus: {m['key']['data']['train']['origin']}, {m['train']['blocks']:,} training blocks "
        f"({m['train']['tokens']:,} tokens) and {len(prepared.validation):,} validation blocks of at most "
        f"{max_length} tokens ({packing}); vocabulary {len(prepared.tokenizer):,}; shards in {prepared.folder}")
    return prepared


@torch.no_grad()
def mlm_loss(model, dataset: ListDataset, collator: MlmCollator, batch_size: int = 64) -> float:
    """Mean cross-entropy over all masked tokens of a pre-masked dataset."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device  # the collator's batch is on the CPU, the trained model may not be
    total, count = 0.0, 0
    for i in range(0, len(dataset), batch_size):
        batch = collator([dataset[j] for j in range(i, min(i + batch_size, len(dataset)))])
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        labels = batch["labels"]
        logits = model(**batch).logits
        keep = labels != -100
        if logits.dim() == 3:  # every token's (sparse_prediction gives the labelled tokens' alone)
            logits = logits[keep]
        total += torch.nn.functional.cross_entropy(logits.float(), labels[keep], reduction="sum").item()
        count += int(keep.sum())
    model.train(was_training)
    if count == 0:
        raise DataError("the validation set has no masked tokens; it is too small")
    return total / count


def run_record(job: PretrainJob, per_device: int, accumulation: int, prepared) -> dict:
    """What the run depends on, recorded in its folder before anything else (`check_run_settings`)."""
    tokenizer = job.tokenizer
    tokenizer_file = Path(tokenizer) / "tokenizer.json" if tokenizer and Path(tokenizer).is_dir() else tokenizer
    run = dict(task="pretrain", method=job.method.name, config=job.method.config_fields(),
               settings=job.settings.record(), seed=job.seed, corpus=local_path(job.corpus),
               validation=local_path(job.validation), tokenizer=local_path(tokenizer),
               tokenizer_sha256=file_fingerprint(tokenizer_file) if tokenizer else None,
               max_documents=job.max_documents, max_validation=job.max_validation, device_batch_size=per_device,
               accumulation=accumulation, processes=world_size())
    if job.init:  # recorded only when given, so runs made before --init existed still resume
        run["init"] = local_path(job.init)
    # what the corpus and validation text are (their SHA-256 and the documents taken), not only where: a
    # changed file under the same name is another run
    train, (validation, _, _) = shards.sources(job.corpus, job.validation)
    run["data"] = shards.content(dict(train=train, validation=validation))
    if job.precision != "fp32":  # likewise
        run["precision"] = job.precision
    if job.compile:  # likewise: a compiled run's bits may differ from an eager one's
        run["compile"] = job.compile
    if job.packing != "full-sentences":  # likewise
        run["packing"] = job.packing
    if job.tokenizer_sample:
        run["tokenizer_sample"] = job.tokenizer_sample
    if job.tokenizer_type != "wordpiece":  # likewise
        run["tokenizer_type"] = job.tokenizer_type
    if job.special_tokens:
        run["special_tokens"] = job.special_tokens
    if prepared is not None:  # compare's shared data: the vocabulary itself identifies it
        run["vocabulary_sha256"] = hashlib.sha256(prepared[0].backend_tokenizer.to_str().encode()).hexdigest()[:16]
    return run


def logging_steps(steps: int, save_steps: int) -> int:
    """About 20 training-loss points a run (at most every 50 steps), at a divisor of the checkpoint interval: a
    run resumed from a checkpoint then logs the same windows of steps, so the same curve, as one not killed."""
    most = max(1, min(50, steps // 20))
    return max(n for n in range(1, most + 1) if save_steps % n == 0)


def training_arguments(job: PretrainJob, per_device: int, accumulation: int):
    from transformers import TrainingArguments

    s = job.settings
    return TrainingArguments(
        output_dir=str(job.output_dir), max_steps=s.steps, learning_rate=s.lr, warmup_steps=s.warmup,
        lr_scheduler_type="linear", weight_decay=s.weight_decay, adam_epsilon=s.adam_epsilon,
        max_grad_norm=s.max_grad_norm, per_device_train_batch_size=per_device,
        per_device_eval_batch_size=64, gradient_accumulation_steps=accumulation,
        logging_steps=logging_steps(s.steps, s.save_steps), eval_strategy="steps", eval_steps=s.save_steps,
        save_strategy="steps", save_steps=s.save_steps, save_total_limit=2, seed=job.seed, data_seed=job.seed,
        report_to=[job.report_to] if job.report_to != "none" else [],
        **trainer_device_args(job.device, job.precision, job.deterministic, job.compile),
        dataloader_drop_last=False, disable_tqdm=job.quiet, remove_unused_columns=False,
        ddp_find_unused_parameters=False, log_level="warning", save_only_model=False)


def build_model(job: PretrainJob, tok, log):
    """The model to train: a fresh one at the settings' size, or `--init`'s BERT with fresh position terms."""
    from dietpe import DietForMaskedLM

    method = job.method
    if not job.init:
        if job.config is None:
            s = job.settings
            config = build_config(method, s.size, len(tok), s.max_length, tok.pad_token_id, s.positions,
                                  logit_scale=s.logit_scale)
        else:  # validated before the work began: only the tokenizer's sizes are new
            config = copy.deepcopy(job.config)
            config.vocab_size, config.pad_token_id = len(tok), tok.pad_token_id
        config.sparse_prediction = True  # the head on the masked tokens alone: the same loss, no (B, L, V) logits
        return config, DietForMaskedLM(config)
    # BERT's sizes and content weights; the method's position parameters fresh (dietpe.models.bert)
    from dietpe.models.bert import from_bert, init_config

    config = init_config(job.init, job.settings.max_length, **method.config_fields())
    config.sparse_prediction = True
    if len(tok) > config.vocab_size:
        raise ConfigError(f"the tokenizer has {len(tok):,} tokens, the BERT checkpoint {job.init} "
                          f"{config.vocab_size:,}; use the checkpoint's tokenizer (--tokenizer)")
    model, report = from_bert(job.init, DietForMaskedLM, config=config)
    log(f"--init {report.summary()}")
    log(f"--init: {init_positions_note(method)}")
    return config, model


def save_model_folder(model, tok, config, final: Path) -> None:
    """A model folder (safetensors, config, tokenizer) that `from_pretrained` and `dietpe finetune` take, written
    whole or not at all."""
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    # a learned input table's length bounds the tokenizer's; other methods leave it unbounded
    save_tokenizer(tok, tmp, config.max_position_embeddings if REGISTRY[config.position].learned_table else None)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def kept_model_dir(output_dir: Path, step: int) -> Path:
    """Where the model of a kept step (--keep-steps) lies: OUTPUT/steps/step-N."""
    return Path(output_dir) / "steps" / f"step-{step}"


def keep_steps_callback(keep: tuple[int, ...], tok, config):
    """Saves a checkpoint at every kept step and writes its model folder (`kept_model_dir`) before
    `CompleteCheckpoints` marks the checkpoint complete: a kill in between leaves an incomplete checkpoint,
    which the resume deletes and trains again, so the folder is written again too."""
    from transformers import TrainerCallback

    class KeepSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in keep:
                control.should_save = True
            return control

        def on_save(self, args, state, control, model=None, **kwargs):
            if state.global_step in keep and state.is_world_process_zero:
                save_model_folder(model, tok, config, kept_model_dir(Path(args.output_dir), state.global_step))
            return control

    return KeepSteps()


def save_model(job: PretrainJob, trainer, tok, config, val_loss: float, seconds: float, log) -> dict:
    """The final model (safetensors, with its tokenizer) and the results, each written whole or not at all."""
    method, output_dir = job.method, job.output_dir
    final = output_dir / "model"
    save_model_folder(trainer.model, tok, config, final)
    results = dict(method=method.name, position=method.position, segment=method.segment,
                   sharing=method.sharing, val_loss=val_loss, perplexity=math.exp(min(val_loss, 50)),
                   steps=trainer.state.global_step, seconds=seconds, processes=trainer.args.world_size,
                   parameters=sum(p.numel() for p in trainer.model.parameters()),
                   settings=job.settings.record(), corpus=job.corpus, model_dir=str(final),
                   curves=log_history_curves(trainer.state.log_history))
    write_json_atomic(output_dir / RESULTS, results)
    log(f"{method.name}: validation MLM loss {val_loss:.4f}, perplexity {results['perplexity']:.2f} "
        f"({trainer.state.global_step} steps, {seconds:.0f}s); model in {final}")
    return results


def run_pretrain(job: PretrainJob, prepared=None) -> dict:
    """Pre-train one model; resumes from a complete checkpoint and returns the results (also in RESULTS).

    `prepared`: (tokenizer, train blocks, validation blocks) already made, shared by compared methods.
    The run is a pure function of its settings and seed (see `dietpe.tasks.seeding`); they are recorded in the
    output folder before anything else, and a rerun with other settings is refused."""
    from transformers import set_seed

    s, method, output_dir = job.settings, job.method, job.output_dir
    log = (lambda *a: None) if job.quiet or not is_main_process() else (
        lambda m: print(f"[pretrain] {m}", file=sys.stderr))
    if job.overwrite:
        start_afresh(output_dir, trainer_device_args(job.device)["use_cpu"])
    per_device, accumulation = batch_layout(s.batch_size, job.device_batch_size)
    check_run_settings(output_dir, run_record(job, per_device, accumulation, prepared), "--overwrite",
                       products=("model", "tokenizer", RESULTS, "steps"), added=("data",))
    done = output_dir / RESULTS
    if done.is_file() and (output_dir / "model" / "config.json").is_file():
        log(f"{output_dir}: finished earlier, reusing it (--overwrite to redo)")
        return read_result(done, ("method", "val_loss", "model_dir"))
    output_dir.mkdir(parents=True, exist_ok=True)
    args = training_arguments(job, per_device, accumulation)
    if prepared is None:
        with args.main_process_first(desc="data preparation", local=False):
            prepared = prepare_data(job.corpus, job.validation, job.tokenizer, s.vocab_size, s.max_length,
                                    output_dir, job.max_documents, log, job.max_validation,
                                    cache_dir=job.cache_dir, packing=job.packing,
                                    tokenizer_sample=job.tokenizer_sample, tokenizer_type=job.tokenizer_type,
                                    special_tokens=job.special_tokens)
    tok, train_blocks, val_blocks = prepared
    collator = MlmCollator(tok)
    val_set = ListDataset(collator.premask(val_blocks.examples(), VALIDATION_SEED))
    # read from the memory-mapped shards; masks: f(seed, epoch, index)
    train_set = EpochExamples(train_blocks.examples(), job.seed)

    set_seed(job.seed)  # identical initialisation of the parameters all methods share
    config, model = build_model(job, tok, log)
    log(f"{method.name}: {sum(p.numel() for p in model.parameters()):,} parameters, {s.steps:,} steps of "
        f"batch {s.batch_size} ({per_device} x {accumulation} accumulation x {args.world_size} process(es))")
    kept = [keep_steps_callback(s.keep_steps, tok, config)] if s.keep_steps else []
    trainer = LogitLrTrainer(model=model, args=args, train_dataset=train_set, eval_dataset=val_set,
                             data_collator=collator, callbacks=[*kept, CompleteCheckpoints()],
                             logit_lr_scale=s.logit_lr_scale, optimizer=s.optimizer)
    replace_progress(trainer, ProgressBar(job.description or f"pretrain {method.name}"))
    resume = None if job.overwrite else resumable_checkpoint(output_dir, remove_incomplete=is_main_process())
    trainer.accelerator.wait_for_everyone()
    if resume:
        log(f"resuming from {resume}")
    start = time.time()
    train_resumable(trainer, resume)
    seconds = time.time() - start
    results = None
    if trainer.is_world_process_zero():
        results = save_model(job, trainer, tok, config, mlm_loss(trainer.model, val_set, collator), seconds, log)
    trainer.accelerator.wait_for_everyone()
    return results if results is not None else read_json(done)


def check_before_work(method: Method, s: PretrainSettings, device_batch_size: int, device: str | None = None,
                      memory_check: bool = True) -> DietConfig:
    """What can be refused without reading data: the model's shape at this size, the batch layout, and a
    model and batch far beyond the memory available. Returns the model's config (`PretrainJob.config`)."""
    config = build_config(method, s.size, s.vocab_size, s.max_length, 0, s.positions, logit_scale=s.logit_scale)
    per_device, _ = batch_layout(s.batch_size, device_batch_size)
    if memory_check:
        check_memory(config, per_device, s.max_length, device,
                     f"{method.name} at size {s.size} (vocabulary {s.vocab_size})")
    return config


def refuse_unused_options(args) -> None:
    """Options of `pretrain` and `compare` that the rest of the command line makes moot."""
    if getattr(args, "init", None):
        V.refuse_unused(args, {"size": "--size"}, "with --init: the model's sizes are the checkpoint's")
    if args.tokenizer or getattr(args, "init", None):
        V.refuse_unused(args, {"tokenizer_sample": "--tokenizer-sample", "tokenizer_type": "--tokenizer-type",
                               "special_tokens": "--special-tokens", "vocab_size": "--vocab-size"},
                        f"with {'--tokenizer' if args.tokenizer else '--init'}: no tokenizer is trained")


def tokenizer_type(args) -> str:
    """--tokenizer-type, else the recipe's (WordPiece, or Unigram for `paper-multilingual`)."""
    from dietpe.tasks.settings import recipe_name
    return getattr(args, "tokenizer_type", None) or PRETRAIN_RECIPES[recipe_name(args)].tokenizer_type


def corpus_of(args) -> str:
    """The corpus the command line names: one corpus, or with --languages a multilingual mixture."""
    from dietpe.data.multilingual import corpus_source
    return corpus_source(args.corpus, getattr(args, "languages", None), getattr(args, "language_alpha", None))


def main(args) -> int:
    set_threads(args.threads)
    refuse_unused_options(args)
    method = parse_method(args.method)
    if args.init:
        method = init_method(method)
    s = settings(args)
    config = check_before_work(method, s, args.device_batch_size, args.device, not args.ignore_memory_check)
    trainer_device_args(args.device, args.precision)  # refuse --device cuda without CUDA before any work
    out = V.check_output_dir(args.output_dir, "-o")
    if args.cache_dir:
        V.check_output_dir(args.cache_dir, "--cache-dir")
    if args.tokenizer:
        load_tokenizer(args.tokenizer)
    corpus = corpus_of(args)
    if args.overwrite and out.exists():  # --overwrite deletes the old run: read the new data first (streamed)
        for source in filter(None, (corpus, args.validation)):
            kind, where, _ = resolve_source(source, "train")
            if kind not in ("hf", "mix"):
                for _ in iter_chunks(kind, where):
                    pass
    with V.created_only_on_success(out):
        run_pretrain(PretrainJob(
            corpus, method, out, s, validation=args.validation, tokenizer=args.tokenizer or args.init,
            seed=args.seed, device_batch_size=args.device_batch_size, max_documents=args.max_documents,
            max_validation=args.max_validation, overwrite=args.overwrite, init=args.init, device=args.device,
            precision=args.precision, deterministic=args.deterministic, compile=args.compile,
            cache_dir=args.cache_dir,
            packing=args.packing, tokenizer_sample=args.tokenizer_sample, config=None if args.init else config,
            tokenizer_type=tokenizer_type(args), special_tokens=getattr(args, "special_tokens", None)))
    return 0
