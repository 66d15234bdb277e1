"""`dietpe translate train` and `dietpe translate eval`: the papers' third experiment, Transformer translation from
scratch with the position method in every attention layer of encoder and decoder (Chen et al. 2021, §5.3;
Vaswani et al. 2017, §5: Adam β=(0.9, 0.98), ε=1e-9, inverse-square-root learning rate after a linear
warm-up, label smoothing 0.1; beam 10, length penalty 0.6 at test time; BLEU by SacreBLEU).

train: line-aligned files -> joint BPE vocabulary (saved as `tokenizer/`) -> DietForConditionalGeneration on the
    Hugging Face `Trainer`; batches of sentence pairs, or of tokens as tensor2tensor counts them (`--batch-tokens`,
    `TokenBatches`); `--recipe paper` is the paper's set-up (`dietpe.tasks.recipes.TRANSLATION_RECIPES`).
    Checkpoints are marked complete only once fully written, and a rerun of the same command resumes from the
    newest complete one (`dietpe.tasks.checkpoints.CompleteCheckpoints`); the finished model goes to `final/`
    (written to a temporary directory, then renamed). Validation loss (plain cross-entropy, no smoothing) every
    `--eval-steps`.
eval: batched beam search with `generate()` (beam width, length penalty and its form: the training recipe's
    unless given), detokenised output to a file, SacreBLEU with its signature;
    `--speed` decodes every batch with and without the cache, interleaved, checks the outputs match, and
    reports sentences per second for each.

Length penalty: Hugging Face's, score = log P(y) / |y|^α, or the papers' (GNMT, tensor2tensor), dividing by
((5 + |y|) / 6)^α (`--length-penalty-form gnmt`, `dietpe.models.beam`; the `paper` recipe's); both rank
hypotheses of equal length alike and favour longer ones for α > 0.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import TrainerCallback, TrainingArguments

from dietpe import validate as V
from dietpe.data.parallel import (
    encode_pairs,
    encode_sources,
    find_split,
    load_joint_tokenizer,
    read_parallel,
    train_joint_bpe,
)
from dietpe.data.tokenizer import save_tokenizer
from dietpe.errors import ConfigError, DataError
from dietpe.methods import Method, parse_method
from dietpe.models.seq2seq import DietForConditionalGeneration, DietSeq2SeqConfig, shift_right
from dietpe.positions.encoding import check_length
from dietpe.positions.registry import REGISTRY
from dietpe.tasks.checkpoints import (
    CompleteCheckpoints,
    check_run_settings,
    file_fingerprint,
    resumable_checkpoint,
    train_resumable,
    write_json_atomic,
)
from dietpe.tasks.runtime import (ListDataset, ProgressBar, replace_progress, resolve_device, set_threads,
                                  start_afresh, trainer_device_args, world_size)
from dietpe.tasks.seeding import SeededTrainer

# what changes the trained model: recorded in the run directory, and a rerun with other values is refused
RESULT_ARGS = ("preset", "vocab_size", "max_length", "bad_lines", "batch_size", "grad_accum",
               "learning_rate", "warmup_steps", "label_smoothing", "dropout", "max_grad_norm", "epochs", "max_steps",
               "eval_steps", "max_train_pairs", "max_valid_pairs", "seed")


# -- the recipe ----------------------------------------------------------------------------------------------

def apply_recipe(args) -> None:
    """Fill the options the command line left unset from `--recipe` (`TRANSLATION_RECIPES`). Batches are the
    recipe's (sentences or tokens) unless --batch-size or --batch-tokens says; both at once are refused."""
    from dietpe.tasks.recipes import TRANSLATION_RECIPES

    r = TRANSLATION_RECIPES[args.recipe]
    if args.batch_size is not None and args.batch_tokens is not None:
        raise ConfigError("give --batch-size (sentence pairs per step) or --batch-tokens (tokens per step), not both")
    if args.batch_size is None and args.batch_tokens is None:
        args.batch_size, args.batch_tokens = r.batch_size, r.batch_tokens
    for dest, value in (("preset", r.size), ("vocab_size", r.vocab_size), ("max_length", r.max_length),
                        ("grad_accum", r.grad_accum), ("learning_rate", r.learning_rate),
                        ("warmup_steps", r.warmup_steps), ("label_smoothing", r.label_smoothing),
                        ("epochs", r.epochs), ("max_steps", r.max_steps), ("max_grad_norm", r.max_grad_norm)):
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)
    if args.batch_tokens is not None and args.batch_tokens < args.max_length:
        raise ConfigError(f"--batch-tokens {args.batch_tokens} is less than --max-length {args.max_length}: a pair "
                          f"of the longest length would not fit in a batch")


def run_record(args) -> dict:
    """The options that change the trained model; the recipe, token batches and compiling only when used, so
    runs made before they existed still resume."""
    record = {k: getattr(args, k) for k in RESULT_ARGS}
    if args.batch_tokens is not None:
        record["batch_tokens"] = args.batch_tokens
    if args.recipe != "cpu":
        record["recipe"] = args.recipe
    from dietpe.tasks.recipes import TRANSLATION_RECIPES

    if TRANSLATION_RECIPES[args.recipe].logit_scale is not None:  # the stored tables' scale: weights follow it
        record["logit_scale"] = TRANSLATION_RECIPES[args.recipe].logit_scale
    if getattr(args, "compile", None):  # a compiled run's bits may differ from an eager one's
        record["compile"] = args.compile
    if args.grad_accum > 1 or world_size() > 1:  # the step's token mean, not a mean of its parts' means
        record["loss"] = "tokens of the step"
    return record


def _until(row: Tensor, eos: int) -> list[int]:
    """The generated ids up to the first `eos` (kept), without the padding after it."""
    ids = row.tolist()
    return ids[:ids.index(eos, 1) + 1] if eos in ids[1:] else ids


def eval_batch_size(args) -> int:
    """Validation's sentences per batch: --batch-size, or as many of the longest pairs as --batch-tokens holds."""
    return args.batch_size or max(1, args.batch_tokens // args.max_length)


# -- shared helpers ------------------------------------------------------------------------------------------

# config fields the run sets from its tokenizer; any other DietSeq2SeqConfig field may be set in --method
TRANSLATION_RUN_FIELDS = {"vocab_size": "the tokenizer (--vocab-size)", "pad_token_id": "the tokenizer",
                          "bos_token_id": "the tokenizer", "eos_token_id": "the tokenizer"}


def parse_translation_method(spec: str) -> Method:
    """A method spec for the encoder-decoder: `t5`, `shaw:shaw_max_distance=16:num_decoder_layers=4` (config
    fields of DietSeq2SeqConfig, the preset's sizes included); no segments in translation."""
    return parse_method(spec, DietSeq2SeqConfig, segment="none", run_fields=TRANSLATION_RUN_FIELDS)


def save_dir_atomic(target: Path, write) -> None:
    """Call `write(tmp_dir)`, then rename tmp_dir to `target`: a reader finds the whole directory or none."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


# -- training ------------------------------------------------------------------------------------------------

class TranslationCollator:
    """Pads a batch: source (pad id, attention mask), labels (-100), decoder inputs = labels shifted right."""

    def __init__(self, pad_id: int, start_id: int):
        self.pad_id, self.start_id = pad_id, start_id

    def __call__(self, features: list) -> dict:
        if features and isinstance(features[0], list):  # one item of `TokenBatches`: a whole batch
            features = [f for batch in features for f in batch]
        b = len(features)
        s = max(len(f["input_ids"]) for f in features)
        t = max(len(f["labels"]) for f in features)
        input_ids = torch.full((b, s), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((b, s), dtype=torch.long)
        labels = torch.full((b, t), -100, dtype=torch.long)
        for i, f in enumerate(features):
            input_ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
            attention_mask[i, :len(f["input_ids"])] = 1
            labels[i, :len(f["labels"])] = torch.tensor(f["labels"])
        batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                     decoder_input_ids=shift_right(labels, self.start_id, self.pad_id))
        if bool(attention_mask.all()):  # nothing padded, seen on the host: no mask lets SDPA take flash on a GPU
            del batch["attention_mask"]
        return batch


def token_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped into batches of at most `max_tokens` tokens, counted as tensor2tensor counts them: a
    batch's longest length times its size, padding included. Items sorted by length (ties by index) and cut
    greedily, so a batch holds pairs of similar length; an item longer than `max_tokens` is a batch alone."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:  # sorted: the newest item is the longest of its batch
        if current and lengths[i] * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class TokenBatches(torch.utils.data.Dataset):
    """Training pairs as batches of about `max_tokens` tokens (`token_batches`, a pair's length the longer of
    its source and target, as tensor2tensor's): each item is one batch, so `SeededSampler` shuffles whole
    batches, a pure function of (seed, epoch)."""

    def __init__(self, pairs: list[dict], max_tokens: int):
        lengths = [max(len(p["input_ids"]), len(p["labels"])) for p in pairs]
        self.batches = [[pairs[i] for i in b] for b in token_batches(lengths, max_tokens)]

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]


class TranslationTrainer(SeededTrainer):
    """Label-smoothed cross-entropy per target token while training; plain cross-entropy when evaluating, so
    the validation loss is a log-perplexity. A training step's loss is the mean over its target tokens, across
    accumulated micro-batches and processes (tensor2tensor's sum over shards divided by their token count):
    Trainer counts them (`num_items_in_batch`) for a model that takes loss keywords."""

    def __init__(self, *args, label_smoothing: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.label_smoothing = label_smoothing
        self.model_accepts_loss_kwargs = True  # the loss below reads num_items_in_batch; the model never sees it

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits
        eps = self.label_smoothing if model.training else 0.0
        total = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                            ignore_index=-100, label_smoothing=eps, reduction="sum")
        count = num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum()
        loss = total / count
        if num_items_in_batch is not None and self.args.average_tokens_across_devices:
            loss = loss * self.accelerator.num_processes  # DDP averages gradients; the count is every process's
        return (loss, outputs) if return_outputs else loss


class PrintEvaluations(TrainerCallback):
    """One plain line per validation, readable in a log file (the progress bar redraws in place)."""

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics and state.is_world_process_zero:
            loss = metrics["eval_loss"]
            print(f"step {state.global_step}/{state.max_steps}: validation loss {loss:.4f} "
                  f"(perplexity {math.exp(min(loss, 50)):.2f})", file=sys.stderr, flush=True)


def _train_files(args) -> tuple[Path, Path, Path, Path]:
    if args.data:
        V.refuse_unused(args, {k: f"--{k.replace('_', '-')}" for k in ("train_source", "train_target",
                                                                       "valid_source", "valid_target")},
                        "with --data: the files are found in its folder")
        if not (args.source and args.target):
            raise ConfigError("--data needs --source and --target language codes (e.g. --source de --target en)")
        return (find_split(args.data, "train", args.source), find_split(args.data, "train", args.target),
                find_split(args.data, "valid", args.source), find_split(args.data, "valid", args.target))
    files = (args.train_source, args.train_target, args.valid_source, args.valid_target)
    if not all(files):
        raise ConfigError("give --data DIR --source L1 --target L2, or all four of --train-source, "
                          "--train-target, --valid-source, --valid-target")
    return tuple(Path(f) for f in files)


def build_config(args, method: Method, vocab_size: int, tokenizer) -> DietSeq2SeqConfig:
    """The model's config: the preset's sizes, the method's fields (parsed once, by `train_main`), the
    tokenizer's ids."""
    from dietpe.tasks.recipes import TRANSLATION_RECIPES

    overrides = method.config_fields()
    scale = TRANSLATION_RECIPES[args.recipe].logit_scale
    if scale is not None:  # the recipe's parametrization; a spec's own logit_scale= still wins
        overrides.setdefault("logit_scale", scale)
    if args.dropout is not None:
        overrides.setdefault("hidden_dropout_prob", args.dropout)
        overrides.setdefault("attention_probs_dropout_prob", args.dropout)
    # a learned table must cover the longest sequence training admits
    overrides.setdefault("max_position_embeddings", max(args.max_length, 256))
    check_length(method.position, args.max_length, overrides["max_position_embeddings"], "--max-length ",
                 "raise max_position_embeddings in --method or lower --max-length", ConfigError)
    return DietSeq2SeqConfig.from_preset(
        args.preset, vocab_size=vocab_size, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **overrides)


def read_training_data(args, out: Path, files: dict[str, Path]):
    """The tokenizer (trained once, reused on resume) and the encoded pairs. Data is never truncated: bad pairs
    are skipped and counted (`data_report.json`), or refused with --bad-lines error."""
    t0 = time.time()
    src, tgt = read_parallel(files["train_source"], files["train_target"])
    vsrc, vtgt = read_parallel(files["valid_source"], files["valid_target"])
    if args.max_train_pairs:
        src, tgt = src[:args.max_train_pairs], tgt[:args.max_train_pairs]
    if args.max_valid_pairs:
        vsrc, vtgt = vsrc[:args.max_valid_pairs], vtgt[:args.max_valid_pairs]
    tok_dir = out / "tokenizer"
    resumed = (tok_dir / "tokenizer.json").is_file()
    if resumed:  # the vocabulary must stay the one the model learned
        tokenizer = load_joint_tokenizer(tok_dir)
    else:
        tokenizer = train_joint_bpe((line for line in src + tgt if line), args.vocab_size)
    train, train_report = encode_pairs(tokenizer, src, tgt, args.max_length, args.max_length, args.bad_lines,
                                       (str(files["train_source"]), str(files["train_target"])))
    valid, valid_report = encode_pairs(tokenizer, vsrc, vtgt, args.max_length, args.max_length, args.bad_lines,
                                       (str(files["valid_source"]), str(files["valid_target"])))
    for name, report in (("train", train_report), ("valid", valid_report)):
        print(f"dietpe translate: {report.summary(name)}", file=sys.stderr)
    if not train or not valid:
        raise DataError(f"no usable pairs left in {'training' if not train else 'validation'} data")
    if not resumed:  # saved once the pairs are accepted: a refused file leaves no run behind to block its fix
        save_dir_atomic(tok_dir, tokenizer.save_pretrained)
    write_json_atomic(out / "data_report.json", dict(train=train_report.to_dict(), valid=valid_report.to_dict(),
                                                     vocab_size=len(tokenizer), seconds=round(time.time() - t0, 1)))
    return tokenizer, train, valid


def training_arguments(args, out: Path, max_steps: int, device_args: dict) -> TrainingArguments:
    """Vaswani et al.'s optimizer and schedule; transformers 5 writes safetensors only: no pickle checkpoints
    to opt out of."""
    return TrainingArguments(
        output_dir=str(out), max_steps=max_steps,
        per_device_train_batch_size=1 if args.batch_tokens else args.batch_size,  # TokenBatches: a batch an item
        per_device_eval_batch_size=eval_batch_size(args), gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.learning_rate, lr_scheduler_type="inverse_sqrt", warmup_steps=args.warmup_steps,
        adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-9, weight_decay=0.0, max_grad_norm=args.max_grad_norm,
        eval_strategy="steps", eval_steps=args.eval_steps, save_strategy="steps", save_steps=args.save_steps,
        save_total_limit=args.save_total_limit, logging_steps=args.logging_steps, seed=args.seed,
        train_sampling_strategy="random" if args.batch_tokens else "group_by_length",
        remove_unused_columns=False, prediction_loss_only=True,
        report_to="none", dataloader_num_workers=0, **device_args)


def run_train_loss(log_history: list[dict]) -> float | None:
    """The logged training loss over the whole run, each logged mean weighted by the steps it covers. Read from
    the trainer state a checkpoint restores, so a resumed run records what an uninterrupted one does where the
    logging interval divides the saving one (`Trainer`'s own `training_loss` averages only the steps of its
    last session)."""
    total = covered = last = 0
    for row in log_history:
        if "loss" in row:
            total, covered, last = total + row["loss"] * (row["step"] - last), covered + row["step"] - last, row["step"]
    return total / covered if covered else None


def write_final(out: Path, args, trainer, tokenizer, config, eval_loss: float, started: float) -> None:
    """The finished model in `final/` (safetensors, tokenizer, a summary), whole or absent."""
    def write(tmp: Path) -> None:
        trainer.save_model(str(tmp))
        (tmp / "training_args.bin").unlink(missing_ok=True)  # a pickle; the run's arguments are in run_settings.json
        # a learned table's length bounds the tokenizer's; other methods leave it unbounded
        save_tokenizer(tokenizer, tmp,
                       config.max_position_embeddings if REGISTRY[config.position].learned_table else None)
        write_json_atomic(tmp / "train_summary.json", dict(
            position=config.position, method=args.method, preset=args.preset, steps=trainer.state.global_step,
            train_loss=run_train_loss(trainer.state.log_history), eval_loss=eval_loss,
            seconds_this_session=round(time.time() - started, 1), decoding=decoding_of(args.recipe),
            parameters=sum(p.numel() for p in trainer.model.parameters()),
            curves=[{k: row[k] for k in ("step", "loss", "eval_loss") if k in row}
                    for row in trainer.state.log_history]))

    save_dir_atomic(out / "final", write)
    print(f"dietpe translate: model written to {out / 'final'}", file=sys.stderr)


def run_train(args, method: Method) -> int:
    """Train (or resume) one translation model; `method`: the parsed --method."""
    set_threads(args.threads)
    device_args = trainer_device_args(args.device, args.precision, args.deterministic, getattr(args, "compile", None))
    out = Path(args.output_dir)
    files = dict(zip(("train_source", "train_target", "valid_source", "valid_target"), _train_files(args)))
    if getattr(args, "overwrite", False):
        start_afresh(out, device_args["use_cpu"])
    run = dict(task="translate train", **{k: str(Path(f).resolve()) for k, f in files.items()},
               **{f"{k}_sha256": file_fingerprint(f) for k, f in files.items()},
               method=method.name, **run_record(args))
    # recorded before the tokenizer is trained, so a tokenizer left by a failed run is reused only by the same run
    check_run_settings(out, run, "--overwrite", products=("final", "tokenizer", "run.json", "data_report.json"))
    if (out / "final" / "config.json").is_file():
        print(f"dietpe translate: {out}/final exists: training finished already", file=sys.stderr)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, train, valid = read_training_data(args, out, files)

    config = build_config(args, method, len(tokenizer), tokenizer)
    torch.manual_seed(args.seed)
    model = DietForConditionalGeneration(config)
    train_set = TokenBatches(train, args.batch_tokens) if args.batch_tokens else ListDataset(train)
    per_step = args.grad_accum * (1 if args.batch_tokens else args.batch_size)
    steps_per_epoch = math.ceil(len(train_set) / per_step)
    max_steps = args.max_steps or steps_per_epoch * args.epochs
    n_params = sum(p.numel() for p in model.parameters())
    batches = (f"batches of at most {args.batch_tokens} tokens ({len(train_set)} of them)" if args.batch_tokens
               else f"batches of {args.batch_size} pairs")
    print(f"dietpe translate: {args.preset} method={args.method}, {n_params / 1e6:.1f}M parameters, "
          f"{len(train)} pairs in {batches}, {max_steps} steps ({max_steps / steps_per_epoch:.2f} epochs)",
          file=sys.stderr)
    trainer = TranslationTrainer(
        model=model, args=training_arguments(args, out, max_steps, device_args), train_dataset=train_set,
        eval_dataset=ListDataset(valid),
        data_collator=TranslationCollator(config.pad_token_id, config.decoder_start_token_id),
        processing_class=tokenizer, callbacks=[CompleteCheckpoints(), PrintEvaluations()],
        label_smoothing=args.label_smoothing)
    replace_progress(trainer, ProgressBar(f"translate {args.method}"))
    resume = resumable_checkpoint(out)
    if resume is not None:
        print(f"dietpe translate: resuming from {resume}", file=sys.stderr)
    started = time.time()
    train_resumable(trainer, resume)
    last = trainer.state.log_history[-2:] if trainer.state.log_history else []
    done = [row for row in last if "eval_loss" in row and row.get("step") == trainer.state.global_step]
    metrics = done[-1] if done else trainer.evaluate()  # the last step was validated already, or now
    print(f"dietpe translate: validation loss {metrics['eval_loss']:.4f}", file=sys.stderr)
    write_final(out, args, trainer, tokenizer, config, metrics["eval_loss"], started)
    return 0


# -- evaluation ----------------------------------------------------------------------------------------------

def find_model_dir(path: str | Path) -> Path:
    """A model directory itself, or a training run: its `final/`, else its newest complete checkpoint."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    if (path / "final" / "config.json").is_file():
        return path / "final"
    if path.is_dir():
        ckpt = resumable_checkpoint(path, remove_incomplete=False)
        if ckpt is not None:
            return ckpt
    raise DataError(f"{path}: no translation model here (expected config.json, final/ or a complete checkpoint-N/)")


def load_model(path: str | Path):
    model_dir = find_model_dir(path)
    tokenizer = load_joint_tokenizer(model_dir if (model_dir / "tokenizer.json").is_file()
                                     else model_dir.parent / "tokenizer")
    model = V.load_whole(DietForConditionalGeneration, model_dir).eval()
    if len(tokenizer) != model.config.vocab_size:
        raise DataError(f"{model_dir}: tokenizer has {len(tokenizer)} tokens but the model {model.config.vocab_size}")
    return model, tokenizer, model_dir


LP_FORMULAS = {"hf": "log P / |Y|^alpha (transformers)", "gnmt": "log P / ((5 + |Y|) / 6)^alpha (GNMT, tensor2tensor)"}


def decoding_of(recipe: str) -> dict:
    from dietpe.tasks.recipes import TRANSLATION_RECIPES
    r = TRANSLATION_RECIPES[recipe]
    return dict(beams=r.beams, length_penalty=r.length_penalty, length_penalty_form=r.length_penalty_form)


def trained_decoding(model_dir: Path) -> dict:
    """The decoding of the recipe the model was trained with (`final/train_summary.json`, else the run's
    settings), else the `cpu` recipe's."""
    import json
    for path in (model_dir / "train_summary.json", model_dir.parent / "run_settings.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data.get("decoding"), dict):
            return data["decoding"]
        if path.name == "run_settings.json":
            return decoding_of(data.get("recipe", "cpu"))
    return decoding_of("cpu")


def pad_batch(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    s = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), s), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), s), dtype=torch.long)
    for i, x in enumerate(seqs):
        ids[i, :len(x)] = torch.tensor(x)
        mask[i, :len(x)] = 1
    return ids, mask


def new_tokens_for(model, source_length: int, requested: int | None) -> int:
    """How many tokens to decode for a batch: requested, or 1.5·|source| + 10, within a learned table."""
    limit = model.max_decode_length
    if requested is not None:
        if limit is not None and requested > limit:
            raise ConfigError(f"--max-new-tokens {requested} exceeds max_position_embeddings={limit}, the decoder's "
                              f"learned position table (position={model.config.position!r})")
        return requested
    n = int(1.5 * source_length) + 10
    return min(n, limit) if limit is not None else n


def cap_batches(order: list[int], caps: list[int], batch_size: int) -> list[list[int]]:
    """Batches of at most `batch_size` of the length-sorted `order` in which every sentence has the same decoding
    limit (`caps`, by position in `order`): a sentence's translation then does not depend on the batch it is in."""
    batches: list[list[int]] = []
    for j, i in enumerate(order):
        if not batches or len(batches[-1]) == batch_size or caps[j] != caps[j - 1]:
            batches.append([])
        batches[-1].append(i)
    return batches


def translate(model, tokenizer, ids: list[list[int]], batch_size: int, beams: int, length_penalty: float,
              max_new_tokens: int | None = None, use_cache: bool = True, speed: bool = False, progress=True,
              length_penalty_form: str = "hf"):
    """Translate token-id sources in length-sorted batches; returns (hypotheses, timings).

    With `speed`, each batch is also decoded with the cache off, in alternating order, and timed."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    hyps: list[str] = [""] * len(ids)
    timing = {"cached_s": 0.0, "uncached_s": 0.0, "mismatched_sentences": 0}
    batches = cap_batches(order, [new_tokens_for(model, len(ids[i]), max_new_tokens) for i in order], batch_size)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(ids), desc="translate", unit="sent", file=sys.stderr, dynamic_ncols=True)
    for n, batch in enumerate(batches):
        src, mask = pad_batch([ids[i] for i in batch], tokenizer.pad_token_id)
        device = next(model.parameters()).device
        src, mask = src.to(device), mask.to(device)
        kwargs = dict(attention_mask=mask, num_beams=beams, length_penalty=length_penalty, do_sample=False,
                      length_penalty_form=length_penalty_form,
                      max_new_tokens=new_tokens_for(model, src.shape[1], max_new_tokens), early_stopping=True)
        modes = [use_cache] if not speed else ([True, False] if n % 2 == 0 else [False, True])
        outputs = {}
        for cached in modes:
            start = time.perf_counter()
            with torch.inference_mode():
                outputs[cached] = model.generate(src, use_cache=cached, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize()  # timings of the work, not of its launch
            timing["cached_s" if cached else "uncached_s"] += time.perf_counter() - start
        if speed:
            a, b = outputs[True], outputs[False]
            if not (a.shape == b.shape and torch.equal(a, b)):
                # a batch's rows are padded to its longest (beam search fills with </s>): each compared to its end
                eos = model.config.eos_token_id
                timing["mismatched_sentences"] += sum(_until(x, eos) != _until(y, eos) for x, y in zip(a, b))
        texts = tokenizer.batch_decode(outputs[modes[0]], skip_special_tokens=True)
        for i, text in zip(batch, texts):
            hyps[i] = text.strip()
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    return hyps, timing


def train_main(args) -> int:
    """`dietpe translate train`: everything that can be refused is refused before the output folder is touched."""
    from types import SimpleNamespace

    from dietpe.extras import need

    need("accelerate", "translate")  # Trainer's: refused before the data is read
    out = V.check_output_dir(args.output_dir, "--output-dir")
    apply_recipe(args)
    trainer_device_args(args.device, args.precision)  # a missing CUDA, fp16 on the CPU: refused first
    method = parse_translation_method(args.method)  # the spec validated once, then passed on
    build_config(args, method, args.vocab_size, SimpleNamespace(pad_token_id=0, bos_token_id=1, eos_token_id=2))
    train_src, train_tgt, valid_src, valid_tgt = _train_files(args)
    read_parallel(train_src, train_tgt)  # UTF-8, line counts: before --overwrite removes an earlier run
    read_parallel(valid_src, valid_tgt)
    with V.created_only_on_success(out):
        return run_train(args, method)


def eval_outputs(args, model_dir: Path) -> tuple[Path, Path]:
    """The translations' and the report's paths, refused where they would overwrite an input or each other."""
    output = Path(args.output) if args.output else model_dir / f"translations.{Path(args.source).name}"
    report = Path(args.report) if args.report else output.with_name(output.name + ".json")
    inputs = [("--source", args.source), ("--reference", getattr(args, "reference", None))]
    for option, path in (("--output", output), ("--report", report)):
        for name, given in inputs:
            if given and path.resolve() == Path(given).resolve():
                raise ConfigError(f"{option} {path} is the {name} file, which writing it would overwrite; name "
                                  f"another file")
    if output.resolve() == report.resolve():
        raise ConfigError(f"--output and --report are both {output}; name two files")
    return V.check_output_file(output, "--output"), V.check_output_file(report, "--report")


def run_eval(args) -> int:
    from dietpe.extras import need

    sacrebleu = need("sacrebleu")

    set_threads(args.threads)
    found = find_model_dir(args.model)
    V.check_model_files(found)
    decoding = trained_decoding(found)
    args.beams = decoding["beams"] if args.beams is None else args.beams
    args.length_penalty = decoding["length_penalty"] if args.length_penalty is None else args.length_penalty
    args.length_penalty_form = args.length_penalty_form or decoding["length_penalty_form"]
    if args.beams < 1:
        raise ConfigError(f"--beams {args.beams} must be at least 1")
    eval_outputs(args, found)  # before hours of decoding
    src_lines, ref_lines = read_parallel(args.source, args.reference)  # a bad file before the model loads
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # no "Loading weights" bar in the output
    device = resolve_device(args.device)
    model, tokenizer, model_dir = load_model(args.model)
    model.to(device)
    if args.max_new_tokens is not None:
        new_tokens_for(model, 1, args.max_new_tokens)  # beyond a learned position table: refused now
    if args.limit:
        src_lines = src_lines[:args.limit]
        ref_lines = ref_lines[:args.limit] if ref_lines is not None else None
    if ref_lines is not None:
        empty = [n for n, r in enumerate(ref_lines, start=1) if not r]
        if empty:
            raise DataError(f"{args.reference}:{empty[0]}: empty reference line ({len(empty)} in all)")
    ids = encode_sources(tokenizer, src_lines, model.encoder.positions.max_length, str(args.source))
    hyps, timing = translate(model, tokenizer, ids, args.batch_size, args.beams, args.length_penalty,
                             args.max_new_tokens, use_cache=not args.no_cache, speed=args.speed,
                             length_penalty_form=args.length_penalty_form)
    output = Path(args.output) if args.output else model_dir / f"translations.{Path(args.source).name}"
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    os.replace(tmp, output)
    report = dict(model=str(model_dir), source=str(args.source), reference=args.reference, output=str(output),
                  sentences=len(hyps), beams=args.beams, length_penalty=args.length_penalty,
                  length_penalty_form=args.length_penalty_form,
                  length_penalty_formula=LP_FORMULAS[args.length_penalty_form],
                  cache=not args.no_cache,
                  threads=torch.get_num_threads())
    n = len(hyps)
    if args.speed:
        report.update(cached_sentences_per_s=n / timing["cached_s"], uncached_sentences_per_s=n / timing["uncached_s"],
                      cache_speedup=timing["uncached_s"] / timing["cached_s"],
                      mismatched_sentences=timing["mismatched_sentences"])
        print(f"speed: {report['cached_sentences_per_s']:.2f} sent/s with cache, "
              f"{report['uncached_sentences_per_s']:.2f} without ({report['cache_speedup']:.2f}x); "
              f"{timing['mismatched_sentences']} sentences differ")
    else:
        seconds = timing["cached_s" if not args.no_cache else "uncached_s"]
        report["sentences_per_s"] = n / seconds
        print(f"speed: {n / seconds:.2f} sentences/s ({'with' if not args.no_cache else 'without'} cache)")
    if ref_lines is not None:
        bleu = sacrebleu.metrics.BLEU()
        score = bleu.corpus_score(hyps, [ref_lines])
        report.update(bleu=score.score, bleu_text=str(score), signature=str(bleu.get_signature()))
        print(f"{score} ({bleu.get_signature()})")
    print(f"translations written to {output}")
    report_path = Path(args.report) if args.report else output.with_name(output.name + ".json")
    write_json_atomic(report_path, report)
    return 0


# -- command line --------------------------------------------------------------------------------------------

