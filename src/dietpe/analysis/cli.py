"""`dietpe analyze CHECKPOINT --data FILE`: the pictures of DIET (Chen et al. 2021) Fig. 2, 4-8 and TUPE (Ke et al.
2021) Fig. 2 and 6 for a checkpoint written by `dietpe pretrain`, `dietpe finetune` or `dietpe translate train`.

A checkpoint is a `save_pretrained` directory (or a run directory holding one in `model/`); the class is the
one its config names in `architectures`, so a seq2seq checkpoint loads whole and its encoder is analysed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dietpe import validate as V
from dietpe.errors import DataError


def find_checkpoint(path: str | Path) -> Path:
    """The directory holding config.json: `path` itself, or `path/model` (a `dietpe pretrain` run directory);
    its config.json and weights are checked, so a damaged checkpoint is named before anything is loaded."""
    return V.find_model_dir(path, "checkpoint")


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
    model = model_class(checkpoint).from_pretrained(checkpoint)
    return model.eval(), checkpoint


def load_tokenizer_near(checkpoint: Path, explicit: str | None):
    """The tokenizer saved with the checkpoint (or in `tokenizer/` beside it), unless one is named."""
    from dietpe.data.tokenizer import load_tokenizer

    def load(path):
        try:
            return load_tokenizer(path)
        except DataError:  # not BERT's special tokens (a translation vocabulary): whatever HF makes of it
            from transformers import AutoTokenizer

            try:
                return AutoTokenizer.from_pretrained(str(path))
            except Exception:
                pass
            raise

    if explicit:
        return load(explicit)
    for candidate in (checkpoint, checkpoint / "tokenizer", checkpoint.parent / "tokenizer"):
        if (candidate / "tokenizer.json").is_file():
            return load(candidate)
    raise DataError(f"{checkpoint}: no tokenizer.json saved with the checkpoint; name one with --tokenizer")


def training_length(checkpoint: Path, config) -> int | None:
    """The block length the model was trained on: its `dietpe pretrain` run's settings, else the config's
    max_position_embeddings (which the run sets from --max-length)."""
    results = checkpoint.parent / "pretrain_results.json"
    try:
        length = json.loads(results.read_text()).get("settings", {}).get("max_length")
    except (OSError, ValueError):
        length = None
    return int(length) if length else getattr(config, "max_position_embeddings", None)


def run(args: argparse.Namespace) -> int:
    from dietpe.analysis.report import report
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
    trained = training_length(checkpoint, model.config)
    length = args.length or trained or 128
    if trained and length > trained:
        print(f"dietpe analyze: note: analysing {length}-token inputs, beyond the training length {trained}: "
              f"positions past {trained} were never trained (--length {length} was asked)", file=sys.stderr)
    elif args.length is None:  # say which length was chosen for the user
        print(f"dietpe analyze: {length}-token inputs" + (" (the training length)" if length == trained else ""),
              file=sys.stderr)
    index = report(model, tokenizer, out, data=args.data, title=args.title or model.config.position,
                   batch_size=args.batch_size, length=length, seed=args.seed, rtol=args.rtol)
    print(index)
    return 0


