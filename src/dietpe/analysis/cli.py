"""`dietpe analyze CHECKPOINT --data FILE`: the pictures of DIET (Chen et al. 2021) Fig. 2, 4-8 and TUPE (Ke et al.
2021) Fig. 2 and 6 for a checkpoint written by `dietpe pretrain`, `dietpe finetune` or `dietpe translate train`.

A checkpoint is a `save_pretrained` directory, or a run directory: a `dietpe pretrain` run's `model/` or a
`dietpe translate train` run's `final/` is analysed, and the report goes into that folder's `analysis/` unless -o
says otherwise. The class is the one its config names in `architectures`, so a seq2seq checkpoint loads whole and
its encoder is analysed. Inputs default to the training length the run recorded (else max_position_embeddings);
a learned position table caps the length.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dietpe import validate as V
from dietpe.errors import DataError

#: where a run directory keeps its finished model: `dietpe pretrain`'s model/, `dietpe translate train`'s final/
RUN_MODEL_DIRS = ("model", "final")


def find_checkpoint(path: str | Path) -> Path:
    """The directory holding config.json: `path` itself, or its `model/` (a `dietpe pretrain` run) or `final/`
    (a `dietpe translate train` run); its config.json and weights are checked, so a damaged checkpoint is named
    before anything is loaded."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such checkpoint folder")
    for candidate in (path, *(path / d for d in RUN_MODEL_DIRS)):
        if (candidate / "config.json").is_file():
            return V.find_model_dir(candidate, "checkpoint")
    if _run_task(path) == "translate train":  # started but not finished: its checkpoints are there to analyse
        raise DataError(f"{path}: the translation run has no final/ model yet (training has not finished); pass "
                        f"one of its checkpoint-N/ folders")
    raise DataError(f"{path}: not a checkpoint (no config.json here, in model/ or in final/); pass a "
                    f"save_pretrained folder, a `dietpe pretrain` run folder or a `dietpe translate train` run folder")


def _read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _run_task(run: Path) -> str | None:
    return _read_record(run / "run_settings.json").get("task")


def training_length(checkpoint: Path) -> int | None:
    """The sequence length the run that wrote `checkpoint` trained on, where the run folder above it records it:
    `dietpe pretrain` (settings.max_length), `dietpe translate train` (max_length). None otherwise:
    max_position_embeddings may exceed the training length, so it is no substitute."""
    run = checkpoint.parent
    settings = _read_record(run / "run_settings.json")
    pretrain = _read_record(run / "pretrain_results.json").get("settings") or (
        settings.get("settings") if settings.get("task") == "pretrain" else None)
    candidates = [pretrain.get("max_length") if isinstance(pretrain, dict) else None,
                  settings.get("max_length") if settings.get("task") == "translate train" else None]
    return next((n for n in candidates if isinstance(n, int) and not isinstance(n, bool) and n > 0), None)


def model_class(checkpoint: Path):
    """The class named by the checkpoint's `architectures`, found among diet's models; AutoModel otherwise."""
    import dietpe.models as models

    try:
        import dietpe.models.seq2seq as seq2seq  # written alongside; absent in a build without translation
    except ImportError:
        seq2seq = None
    config = json.loads((checkpoint / "config.json").read_text())
    for name in config.get("architectures") or []:
        for module in (models, seq2seq):
            cls = getattr(module, name, None) if module is not None else None
            if cls is not None:
                return cls
    from transformers import AutoModel

    return AutoModel


def load_checkpoint(path: str | Path):
    """(model in eval mode, its checkpoint directory)."""
    import dietpe  # noqa: F401  registers the Auto classes

    from transformers.utils import logging as hf_logging

    checkpoint = find_checkpoint(path)
    hf_logging.disable_progress_bar()  # no "Loading weights" bar in the command's output
    model = V.load_whole(model_class(checkpoint), checkpoint)
    return model.eval(), checkpoint


def load_tokenizer_near(checkpoint: Path, explicit: str | None):
    """The tokenizer saved with the checkpoint (or in `tokenizer/` beside it), unless one is named."""
    from dietpe.data.tokenizer import load_tokenizer

    def load(path):
        try:
            return load_tokenizer(path)
        except DataError:  # not BERT's special tokens: a `dietpe translate` vocabulary, else whatever HF makes of it
            from transformers import AutoTokenizer

            from dietpe.data.parallel import load_joint_tokenizer

            for other in (load_joint_tokenizer, lambda p: AutoTokenizer.from_pretrained(str(p))):
                try:
                    return other(path)
                except Exception:
                    pass
            raise

    if explicit:
        return load(explicit)
    for candidate in (checkpoint, checkpoint / "tokenizer", checkpoint.parent / "tokenizer"):
        if (candidate / "tokenizer.json").is_file():
            return load(candidate)
    raise DataError(f"{checkpoint}: no tokenizer.json saved with the checkpoint; name one with --tokenizer")


def choose_length(asked: int | None, trained: int | None, config, table: int | None) -> tuple[int, str, list[str]]:
    """(length to sample, why that length, notes for stderr): --length, else the recorded training length, else
    max_position_embeddings; never more than `table`, the rows of a learned position table."""
    positions = getattr(config, "max_position_embeddings", None)
    if asked is not None:
        length, why = asked, f"--length {asked}"
    elif trained:
        length, why = trained, "the training length"
    elif positions:
        length, why = positions, "the model's position limit, max_position_embeddings: no training length recorded"
    else:
        length, why = 128, "the default: no training length or max_position_embeddings recorded"
    notes = []
    if table is not None and length > table:
        notes.append(f"note: {length} tokens ({why}) capped to {table}: the model's position table has {table} rows")
        length, why = table, f"capped to the position table's {table} rows"
    return length, why, notes


def describe_batch(shape: tuple[int, int], batch_size: int, length: int, why: str, trained: int | None,
                   positions: int | None) -> list[str]:
    """stderr lines saying what was analysed, (B, L) = `shape`, against what was asked and trained."""
    b, n = shape
    line = f"analysing {b} sequence{'s' if b != 1 else ''} of {n} tokens"
    if b < batch_size or n < length:
        line += f", not {batch_size} of {length} ({why}): the text is too short for more"
    else:
        line += f" ({why})"
    lines = [line]
    if trained and n > trained:
        lines.append(f"note: {n} tokens is beyond the training length {trained}: positions past {trained} were "
                     f"never trained")
    elif not trained and positions and n > positions:
        lines.append(f"note: {n} tokens is beyond the model's max_position_embeddings {positions}")
    return lines


def run(args: argparse.Namespace) -> int:
    from dietpe.analysis.logits import encoder_of
    from dietpe.analysis.report import report, sample_batch
    from dietpe.tasks.runtime import resolve_device

    device = resolve_device(args.device)
    if not Path(args.data).is_file():
        raise DataError(f"{args.data}: no such data file")
    checkpoint = find_checkpoint(args.checkpoint)
    out = V.check_output_dir(args.out if args.out else checkpoint / "analysis", "-o")
    tokenizer = load_tokenizer_near(checkpoint, args.tokenizer)
    from dietpe.data.corpus import read_file
    if not any(read_file(args.data)):  # invalid UTF-8 or no text: named before the model is loaded
        raise DataError(f"{args.data}: no text to sample a batch from")
    model, checkpoint = load_checkpoint(checkpoint)
    model = model.to(device)
    if checkpoint.resolve() != Path(args.checkpoint).resolve():  # a run folder: say which model it stands for
        print(f"dietpe analyze: {args.checkpoint} is a run folder: analysing its model in {checkpoint}",
              file=sys.stderr)
    trained = training_length(checkpoint)
    config = encoder_of(model).config
    length, why, notes = choose_length(args.length, trained, config, encoder_of(model).positions.max_length)
    batch = sample_batch(tokenizer, args.data, args.batch_size, length, args.seed)
    said = describe_batch(tuple(batch["input_ids"].shape), args.batch_size, length, why, trained,
                          getattr(config, "max_position_embeddings", None))
    as_asked = args.length == length and tuple(batch["input_ids"].shape) == (args.batch_size, length)
    notes += said[1:] if as_asked else said  # the batch --length asked for, whole: nothing to tell
    for line in notes:
        print(f"dietpe analyze: {line}", file=sys.stderr)
    index = report(model, batch, out, data=args.data, title=args.title or model.config.position, rtol=args.rtol)
    print(index)
    return 0
