"""Kill-safe checkpoints, exact resume and saved run settings for the Hugging Face `Trainer`; atomic files.

Kill safety: `Trainer` (transformers 5) writes `checkpoint-N/` in place, so a kill during a save leaves a
directory that `get_last_checkpoint` would pick up. `CompleteCheckpoints` writes a marker into the checkpoint
after every file (model, optimizer, scheduler, RNG states, trainer state) is written, and resuming uses only
the newest checkpoint with a marker; unmarked ones are deleted first, so they can never be loaded.
`train_resumable` does not run an extra step from a checkpoint at the last step, and `check_run_settings`
refuses to resume (or reuse) an output folder made with other settings. (What makes the resumed run end
bit-identical is in `dietpe.tasks.seeding`.)
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

from dietpe.data.text import write_text_atomic
from dietpe.errors import ConfigError, DataError, first_line
from dietpe.tasks.runtime import is_main_process

COMPLETE = "diet-complete.json"


_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def write_json_atomic(path: str | Path, obj) -> None:
    """Write JSON to a temporary file and rename it: a reader sees the old file or the new, never half."""
    write_text_atomic(path, json.dumps(obj, indent=2, default=float))


def read_json(path: str | Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_result(path: str | Path, keys: tuple[str, ...] = ()) -> dict:
    """A finished run's result file, whose presence marks the run done: a damaged one (or one missing a field the
    command reads) is refused naming the file, not met later as a traceback far from it."""
    path = Path(path)
    try:
        result = read_json(path)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        reason = first_line(e)
        raise DataError(f"{path}: unreadable result of a finished run ({reason}); delete it to redo that run") \
            from None
    missing = [k for k in keys if k not in result] if isinstance(result, dict) else ["a JSON object"]
    if missing:
        raise DataError(f"{path}: the result of a finished run lacks {', '.join(missing)}; delete it to redo "
                        f"that run")
    return result


class CompleteCheckpoints(TrainerCallback):
    """Marks a checkpoint complete once `Trainer` has written all of it (on_save runs after the save)."""

    def on_save(self, args, state, control, **kwargs):
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # every rank has written its RNG state
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                write_json_atomic(folder / COMPLETE, {"global_step": state.global_step})
        return control


def checkpoints(output_dir: str | Path) -> list[tuple[int, Path, bool]]:
    """(step, folder, complete) of every checkpoint folder, oldest first."""
    out = []
    root = Path(output_dir)
    if root.is_dir():
        for p in root.iterdir():
            m = _CHECKPOINT.match(p.name)
            if m and p.is_dir():
                complete = (p / COMPLETE).is_file() and (p / "trainer_state.json").is_file()
                out.append((int(m.group(1)), p, complete))
    return sorted(out)


def resumable_checkpoint(output_dir: str | Path, remove_incomplete: bool = True) -> Path | None:
    """The newest complete checkpoint; incomplete ones (a kill during a save) are deleted if asked."""
    found = checkpoints(output_dir)
    if remove_incomplete:
        for step, folder, complete in found:
            if not complete:
                print(f"dietpe: removing incomplete checkpoint {folder} (interrupted during a save)", file=sys.stderr)
                shutil.rmtree(folder, ignore_errors=True)
    done = [folder for _, folder, complete in found if complete]
    return done[-1] if done else None


def _damage(path: Path) -> str | None:
    """What is wrong with one file of a checkpoint, or None. Reads headers and checksums only: nothing is
    unpickled (torch's files are zip archives whose members carry a CRC)."""
    import zipfile

    try:
        if path.suffix == ".json":
            read_json(path)
        elif path.suffix == ".safetensors":
            from safetensors import safe_open
            with safe_open(str(path), framework="pt") as f:
                f.keys()
        elif path.suffix in (".pt", ".pth", ".bin"):
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            if bad is not None:
                return f"its member {bad} fails its checksum"
    except Exception as e:  # noqa: BLE001 - any failure to read is the damage to report
        return first_line(e)
    return None


def check_checkpoint(folder: Path) -> None:
    """Refuse a marked-complete checkpoint whose files were damaged afterwards (a full disk, a copy cut short),
    naming the file, before `Trainer` fails deep inside a loader."""
    for path in sorted(Path(folder).iterdir()):
        problem = _damage(path) if path.is_file() else None
        if problem is not None:
            older = [f.name for _, f, complete in checkpoints(Path(folder).parent) if complete and f != folder]
            after = f"; the run then resumes from {older[-1]}" if older else "; the run then starts afresh"
            raise DataError(f"{path}: damaged checkpoint file ({problem}); delete {folder} to go on without it"
                            f"{after}")


def train_resumable(trainer, resume: Path | None):
    """`trainer.train()`, resuming from `resume` if given. A checkpoint at (or past) the last step is loaded, not
    trained on: `Trainer` would run one more step before noticing (41 steps for `--steps 40`). Returns the
    `TrainOutput`, or None when nothing was left to train."""
    if resume is not None:
        check_checkpoint(Path(resume))
        saved = read_json(Path(resume) / "trainer_state.json")
        if saved.get("max_steps") and saved["global_step"] >= saved["max_steps"]:
            from transformers import TrainerState
            # the checkpoint's weights, trainer state and callbacks' states, as train() would restore them
            trainer._load_from_checkpoint(str(resume))
            trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
            trainer._load_callback_state()
            return None
    return trainer.train(resume_from_checkpoint=str(resume) if resume else None)


RUN_SETTINGS = "run_settings.json"


def _plain(value):
    """JSON's view of a value (tuples become lists), so saved and new settings compare equal."""
    return json.loads(json.dumps(value, default=str))


def _flatten(d: dict, prefix: str = "") -> dict:
    """{"settings": {"lr": 1}} -> {"settings.lr": 1}, so a difference is named by its field."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def file_fingerprint(path: str | Path) -> str:
    """sha256 of a file's bytes (first 16 hex digits), or '' if there is no such file."""
    path = Path(path)
    if not path.is_file():
        return ""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def local_path(text: str | None) -> str | None:
    """An absolute path for a local file or folder (the same run from another directory), else the text."""
    if text is None:
        return None
    path = Path(text)
    return str(path.resolve()) if path.exists() else text


def check_run_settings(output_dir: str | Path, settings: dict, fresh_hint: str = "--overwrite",
                       products: tuple[str, ...] = (), added: tuple[str, ...] = ()) -> None:
    """Record `settings` in `output_dir` (atomically) before a run writes anything else, or, if the folder holds
    results of an earlier run, refuse to go on with different settings: a ConfigError names each differing
    field, old -> new, and says how to start afresh.

    `products` are glob patterns of what a run leaves (checkpoints count too). Results without a settings file
    come from an unknown run and are refused; a settings file alone (a run that failed before producing
    anything) is simply replaced. `added`: fields recorded since some release; a run recorded before then
    (without the field) is not compared on it, so it still resumes."""
    output_dir = Path(output_dir)
    path = output_dir / RUN_SETTINGS
    new = _plain(settings)
    found = sorted({p.name for pattern in products for p in output_dir.glob(pattern)})
    found += [folder.name for _, folder, _ in checkpoints(output_dir)]
    if found and path.is_file():
        try:
            old = read_json(path)
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict):
            raise ConfigError(f"{path}: unreadable run settings; to start afresh use {fresh_hint} or another "
                              f"output folder")
        new = {k: v for k, v in new.items() if k not in added or k in old}
        old, flat = _flatten(old), _flatten(new)
        diff = [k for k in sorted(set(old) | set(flat)) if old.get(k) != flat.get(k)]
        if diff:
            changes = "; ".join(f"{k}: {old.get(k)!r} -> {flat.get(k)!r}" for k in diff)
            raise ConfigError(f"{output_dir} holds a run with other settings ({changes}); to start afresh use "
                              f"{fresh_hint}, or give another output folder")
        return
    if found:
        raise ConfigError(f"{output_dir} holds an earlier run ({', '.join(found[:3])}) without {RUN_SETTINGS}, "
                          f"so its settings are unknown; to start afresh use {fresh_hint}, or give another "
                          f"output folder")
    if is_main_process():
        write_json_atomic(path, new)
