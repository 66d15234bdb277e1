"""Checks the command line makes before any work: argparse types for numbers with limits, output folders and
files that can be written, model folders that can be loaded. Each failure is one line naming the value and the
limit (argparse prints `dietpe CMD: error: argument --steps: 0 is not a positive integer (must be >= 1)`; the
others raise DietError, which `dietpe.cli` prints the same way)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import tempfile
from pathlib import Path

from dietpe.errors import ConfigError, DataError, first_line

# -- argparse types -------------------------------------------------------------------------------------------


def _parse(text: str, cast, what: str):
    try:
        return cast(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def int_at_least(low: int, why: str = ""):
    """An argparse type: an integer >= low (`why` says what the limit is for)."""
    def parse(text: str) -> int:
        value = _parse(text, int, "an integer")
        if value < low:
            kind = "not a positive integer" if low == 1 else ("not a non-negative integer" if low == 0
                                                               else "too small")
            raise argparse.ArgumentTypeError(f"{text} is {kind} (must be >= {low}{why})")
        return value
    parse.__name__ = f"int >= {low}"
    return parse


positive_int = int_at_least(1)


def at_most_cores(text: str) -> int:
    """A count of worker processes: at least 1, at most this machine's cores (each holds a tokenizer)."""
    value, cores = positive_int(text), os.cpu_count() or 1
    if value > cores:
        raise argparse.ArgumentTypeError(f"{text} is more than this machine's cores (at most {cores})")
    return value
non_negative_int = int_at_least(0)


def seed(text: str) -> int:
    value = _parse(text, int, "an integer")
    if not 0 <= value < 2 ** 32:
        raise argparse.ArgumentTypeError(f"{text} is not a seed (must be >= 0 and < 2**32)")
    return value


def _float(text: str, limit: str = "") -> float:
    value = _parse(text, float, "a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number{limit}")
    return value


def positive_float(text: str) -> float:
    value = _float(text, " (must be positive and finite)")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number (must be > 0)")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text, " (must be >= 0 and finite)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number (must be >= 0)")
    return value


def finite_float(text: str) -> float:
    return _float(text)


def open_fraction(text: str) -> float:
    """A number in (0, 1): a tolerance relative to the largest value."""
    value = _parse(text, float, "a number")
    if not 0 < value < 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text} is not a number in (0, 1)")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1): warm-up fractions, dropout, label smoothing."""
    value = _parse(text, float, "a number")
    if not 0 <= value < 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in [0, 1)")
    return value


def names(text: str) -> list[str]:
    """A comma-separated, non-empty list of distinct names (one named twice would be run or counted once)."""
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing (give a comma-separated list)")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{text!r} names {', '.join(twice)} more than once")
    return values


# -- output folders and files -----------------------------------------------------------------------------------


def refuse_unused(args, options: dict[str, str], why: str) -> None:
    """An option given where it has no effect is refused, never silently ignored: `options` maps each such
    option's dest to its flag; `why` ends the message ("with --tokenizer: no tokenizer is trained")."""
    for dest, flag in options.items():
        if getattr(args, dest, None) not in (None, False):
            raise ConfigError(f"{flag} does not apply {why}")


def _probe_write(folder: Path) -> None:
    """Create and remove a file in `folder`: the only test that holds for root, ACLs and read-only mounts."""
    fd, name = tempfile.mkstemp(prefix=".diet-write-test-", dir=folder)
    os.close(fd)
    os.unlink(name)


def _existing_ancestor(path: Path) -> Path:
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def check_output_dir(path: str | Path, option: str) -> Path:
    """Refuse, before any work, an output folder that is a file, lies under a file, or cannot be written.

    Creates nothing: the folder (and missing parents) are made later by the command itself."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path}: is a file, not a folder; name a folder (created if missing)")
    parent = _existing_ancestor(path)
    if not parent.is_dir():
        raise ConfigError(f"{option} {path}: {parent} is a file, not a folder, so nothing can be created under it")
    try:
        _probe_write(parent)
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot write in {parent} ({e.strerror or e}); choose a writable "
                          f"folder") from None
    return path


def check_output_file(path: str | Path, option: str) -> Path:
    """Refuse, before any work, an output file that is a folder or cannot be created."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a folder, not a file; name a file")
    parent = _existing_ancestor(path.parent)
    if not parent.is_dir():
        raise ConfigError(f"{option} {path}: {parent} is a file, not a folder, so nothing can be created under it")
    try:
        _probe_write(parent)
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot write in {parent} ({e.strerror or e})") from None
    return path


def _remove_empty(folder: Path, stop: Path) -> None:
    while folder != stop and folder.is_dir():
        try:
            folder.rmdir()  # only if empty
        except OSError:
            return
        folder = folder.parent


@contextlib.contextmanager
def created_only_on_success(path: str | Path, disposable: tuple[str, ...] = ("run_settings.json",)):
    """The command's hold on its output folder (`run_lock`). If the command fails, remove the folder (and the
    parents it made) again when it did not exist before and holds nothing but `disposable` bookkeeping files: a
    mistake in the input leaves no trace, and fixing it does not meet a folder "holding a run with other
    settings"."""
    path = Path(path).absolute()
    existed = path.exists()
    ancestor = _existing_ancestor(path)
    try:
        with run_lock(path):
            yield
    except Exception:
        if not existed and path.is_dir():
            entries = list(path.iterdir())
            if all(p.is_file() and (p.name in disposable or p.name.startswith(".")) for p in entries):
                for p in entries:
                    p.unlink(missing_ok=True)
                _remove_empty(path, ancestor)
        raise


LOCK_PREFIX = ".diet-lock-"
_held: dict[Path, list] = {}  # folder -> [fd, depth]: one lock per folder and process, however nested


@contextlib.contextmanager
def run_lock(path: Path):
    """One process per rank writes into an output folder: a second command there, or a worker left running by a
    killed torchrun, is refused in one line instead of racing the run. A POSIX record lock on
    `path/.diet-lock-RANK`: the kernel releases it when its process exits, however it exits, and a forked child
    (a data-loader or study worker) does not inherit it, so a rerun right after a kill is not refused."""
    try:
        import fcntl
    except ImportError:  # no POSIX locks (Windows): run unguarded
        yield
        return
    if path in _held:
        _held[path][1] += 1
        try:
            yield
        finally:
            _held[path][1] -= 1
        return
    path.mkdir(parents=True, exist_ok=True)
    lock = path / f"{LOCK_PREFIX}{os.environ.get('RANK', '0')}"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(f"{path}: another dietpe process (pid {holder}) is running in this folder, a second "
                          f"command or a worker of a killed torchrun; let it end or stop it, then rerun") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[path] = [fd, 1]
    try:
        yield
    finally:
        del _held[path]
        os.close(fd)  # releases the lock; the file stays, so that a waiting command locks the same one


# -- model folders ----------------------------------------------------------------------------------------------


def find_model_dir(path: str | Path, what: str = "pre-trained model") -> Path:
    """The folder holding config.json: `path` itself or `path/model` (a `dietpe pretrain` run folder), checked."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such {what} folder")
    for candidate in (path, path / "model"):
        if (candidate / "config.json").is_file():
            check_model_files(candidate)
            return candidate
    raise DataError(f"{path}: not a {what} (no config.json here or in {path / 'model'}); pass a `dietpe pretrain` "
                    f"run folder or its model/ folder")


def load_whole(cls, model_dir: str | Path, new: tuple[str, ...] = (), **kwargs):
    """`cls.from_pretrained` (safetensors only), refusing weights the checkpoint lacks or holds at another shape
    than config.json gives: transformers would initialise them at random (a silent wrong model) or fail deep
    inside. `new`: prefixes of parameters meant to be new (a fine-tuning head)."""
    model, info = cls.from_pretrained(str(model_dir), use_safetensors=True, output_loading_info=True,
                                      ignore_mismatched_sizes=True, **kwargs)
    problems = [f"lack {k}" for k in sorted(info.get("missing_keys", ())) if not k.startswith(new)]
    problems += [f"hold {k if isinstance(k, str) else k[0]} at another shape than config.json gives"
                 for k in info.get("mismatched_keys", ())]
    if problems:
        more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
        raise DataError(f"{model_dir}: the weights {'; '.join(problems[:2])}{more}: the folder is damaged or its "
                        f"config.json edited")
    return model


def check_model_files(model_dir: str | Path) -> None:
    """config.json parses and every safetensors file is whole, so loading cannot fail half-way."""
    from dietpe.data.text import read_text

    model_dir = Path(model_dir)
    config = model_dir / "config.json"
    try:
        fields = json.loads(read_text(config))
    except json.JSONDecodeError as e:
        raise DataError(f"{config}:{e.lineno}: not valid JSON ({e.msg}); the model folder is damaged") from None
    if not isinstance(fields, dict):
        raise DataError(f"{config}: holds a JSON {type(fields).__name__}, not an object of the model's settings")
    if config.read_bytes().startswith(b"\xef\xbb\xbf"):  # transformers reads it as plain JSON, which has none
        raise DataError(f"{config}: starts with a byte-order mark, which transformers cannot read; save the file "
                        f"without one (UTF-8 without BOM)")
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        held = ", ".join(sorted(p.name for p in model_dir.iterdir())[:8])
        raise DataError(f"{model_dir}: no model.safetensors (the weights) next to config.json; the folder holds "
                        f"{held}")
    from safetensors import safe_open

    held = {}
    for file in weights:
        try:
            with safe_open(str(file), framework="pt") as f:
                held.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
        except Exception as e:  # safetensors raises its own SafetensorError
            reason = first_line(e)
            raise DataError(f"{file}: cannot read the weights ({reason}): the file is truncated or corrupt; copy "
                            f"or save the model again") from None
    _check_encoder_weights(model_dir, fields, held)


def _check_encoder_weights(model_dir: Path, fields: dict, held: dict[str, tuple]) -> None:
    """A diet model's encoder weights are all there at the shapes config.json gives, before any data is read
    (`load_whole` refuses the same as it loads, heads included; this is the early word)."""
    if fields.get("model_type") not in ("diet", "diet-causal"):
        return
    import torch
    from transformers import AutoConfig

    from dietpe.models.causal import DietCausalModel
    from dietpe.models.modeling import DietModel

    cls = DietCausalModel if fields["model_type"] == "diet-causal" else DietModel
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in cls(config).state_dict().items() if not k.startswith("pooler.")}
    prefix = cls.base_model_prefix + "."
    held = {k.removeprefix(prefix): shape for k, shape in held.items()}
    problems = [f"lack {prefix}{k}" for k in expected if k not in held]
    problems += [f"hold {prefix}{k} at {list(held[k])}, where config.json gives {list(shape)}"
                 for k, shape in expected.items() if k in held and held[k] != shape]
    if problems:
        more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
        raise DataError(f"{model_dir}: the weights {'; '.join(problems[:2])}{more}: the folder is damaged or its "
                        f"config.json edited")
