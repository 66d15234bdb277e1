"""`dietpe lengths`: perplexity of trained models at multiples of their training length, for saved runs: any
`dietpe lm` run (causal) or `dietpe pretrain` run (masked LM) of the same tokenizer.

    dietpe lengths RUN [RUN ...] --data valid.txt -o lengths

The evaluation and its table are `dietpe.tasks.perplexity`'s, the same as `dietpe lm`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dietpe import validate as V
from dietpe.errors import ConfigError, DataError
from dietpe.tasks.checkpoints import read_result
from dietpe.tasks.lm import RESULT
from dietpe.tasks.perplexity import (SCORING_BATCH, check_windows, length_perplexities, log, position_config,
                                     read_stream, write_report)
from dietpe.tasks.runtime import check_memory, resolve_device


def _run_info(path: Path, train_length: int | None) -> tuple[Path, str, int]:
    """(model folder, method name, training length) of a `dietpe lm` or `dietpe pretrain` run folder. The
    length a run records wins: --train-length is for runs that record none, and one that differs is refused."""
    model_dir = path / "model" if (path / "model" / "config.json").is_file() else path
    if not (model_dir / "config.json").is_file():
        raise DataError(f"{path}: no model (config.json) found")
    V.check_model_files(model_dir)  # safetensors weights, whole: nothing is unpickled
    for name, keys in ((RESULT, ("method", "train_length")), ("pretrain_results.json", ("method", "settings"))):
        for folder in (path, model_dir.parent):
            if (folder / name).is_file():
                r = read_result(folder / name, keys)
                method, length = r["method"], r["train_length"] if name == RESULT else r["settings"]["max_length"]
                if train_length is not None and train_length != length:
                    raise ConfigError(f"{path}: the run records training length {length}, but --train-length is "
                                      f"{train_length}; --train-length is only for runs that record none")
                return model_dir, method, length
    if train_length is None:
        raise ConfigError(f"{path}: the run does not record its training length; give --train-length")
    config = json.loads((model_dir / "config.json").read_text())
    return model_dir, config.get("position", path.name), train_length


def untrained_rows(path: Path, method: str, config, length: int) -> str | None:
    """A note where the model's learned position table (the method's, or BERT's input table kept beside it)
    has rows beyond the training length that no step of the run reached, so the perplexities beyond 1L read
    rows as initialised; None where the table ends at that length, has no rows beyond, or the run started from
    a checkpoint (`--init`) whose training reached them."""
    from dietpe.positions.registry import REGISTRY
    from dietpe.tasks.checkpoints import RUN_SETTINGS

    position = getattr(config, "position", None)
    learned = (position in REGISTRY and REGISTRY[position].learned_table) or getattr(config, "input_positions", False)
    rows = getattr(config, "max_position_embeddings", 0)
    if not learned or rows <= length:
        return None
    record = next((p / RUN_SETTINGS for p in (path, path.parent) if (p / RUN_SETTINGS).is_file()), None)
    if record is not None and json.loads(record.read_text()).get("init"):
        return None
    return (f"{method} ({path}): its learned position table has {rows:,} rows, and training at L = {length} "
            f"reached the first {length}: its figures beyond 1L read rows as initialised, not trained")


def main(args) -> int:
    from transformers import AutoConfig

    from dietpe.data.tokenizer import load_tokenizer
    from dietpe.models.causal import DietForCausalLM
    from dietpe.extras import need
    from dietpe.models.modeling import DietForMaskedLM

    need("matplotlib")  # the report's plot: refused before any evaluation
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    out = V.check_output_dir(args.output_dir, "-o")
    infos = [(run, *_run_info(Path(run), args.train_length)) for run in args.runs]  # every run checked first
    configs = [AutoConfig.from_pretrained(model_dir) for _, model_dir, _, _ in infos]
    for (_, _, _, length), config in zip(infos, configs):
        # an attached method (`dietpe` field: `dietpe lm --arch llama`) is in a causal LM
        causal = bool(getattr(config, "dietpe", None) or getattr(config, "causal", False))
        check_windows(length, args.lengths, causal, tokens=args.eval_tokens)
        if not args.ignore_memory_check and not getattr(config, "dietpe", None):  # diet's own model
            longest = max(args.lengths) * length
            check_memory(config, SCORING_BATCH, longest, args.device, f"{config.position} scored at {longest:,} "
                         f"tokens", fix="lower --lengths", scoring=True)
    rows, lengths, notes = [], set(), []
    for (run, model_dir, method, length), config in zip(infos, configs):
        if getattr(config, "dietpe", None):  # a Hugging Face model with a method attached (`--arch llama`)
            from transformers import AutoModelForCausalLM

            import dietpe.integrations  # noqa: F401  re-attaches on load (the `dietpe` command skips it at start)

            model = V.load_whole(AutoModelForCausalLM, model_dir).eval().to(device)
            causal = bool(position_config(model).causal)
        else:
            causal = bool(getattr(config, "causal", False))
            model = V.load_whole(DietForCausalLM if causal else DietForMaskedLM, model_dir).eval().to(device)
        tokenizer = load_tokenizer(model_dir)
        # --data names held-out text: a file is that text itself; a folder gives its validation split
        stream = read_stream(args.data, tokenizer, "train" if Path(args.data).is_file() else "validation")
        ppl = length_perplexities(model, tokenizer, stream, length, args.lengths, args.eval_tokens)
        rows.append(dict(method=method, kind="causal" if causal else "masked", train_length=length, ppl=ppl))
        lengths.add(length)
        note = untrained_rows(Path(run), method, config, length)
        if note:
            notes.append(note)
            log(note, "lengths")
        log(f"{run}: " + ", ".join(f"{m}L {'n/a' if v is None else f'{v:.2f}'}" for m, v in ppl.items()),
            "lengths")
    title = f"trained at L = {', '.join(map(str, sorted(lengths)))}"
    print(write_report(rows, args.lengths, out, title, "lengths", notes))
    return 0
