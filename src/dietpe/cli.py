"""The `dietpe` command line: one sub-command per job, each defined in its own module.

A module named here exposes `register(subparsers)`, which adds its parser and sets `func`
(a callable taking the parsed namespace and returning an exit code).

Every mistake in the input ends the command with exit code 2 and one line on stderr,
`dietpe <command>: error: ...`, naming the value and the limit (or the file and line): argparse's own errors
(without the usage block), DietError from validation, and a disk that is full, read-only or forbidden while
writing (with the path and what was kept).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from dietpe.errors import DietError

# errno values that mean "this place cannot be written", reported in one line instead of a traceback
WRITE_ERRORS = {errno.ENOSPC: "no space left on device", errno.EROFS: "read-only file system",
                errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                getattr(errno, "EDQUOT", errno.ENOSPC): "disk quota exceeded"}
# what survives an interrupted write, by command
KEPT = {
    "pretrain": "complete checkpoints (marked diet-complete.json) and the settings are kept; the checkpoint or model "
                "being written is not used; free space and rerun the same command to resume",
    "compare": "finished pre-training and fine-tuning runs and complete checkpoints are kept; free space and rerun "
               "the same command to continue",
    "finetune": "finished runs (result.json) and complete checkpoints are kept; free space and rerun the same "
                "command to continue",
    "translate": "complete checkpoints and the tokenizer are kept; the file being written is not used; free space "
                 "and rerun the same command to resume",
    "analyze": "the checkpoint is untouched and the pictures written so far are kept; free space and rerun",
    "prepare": "nothing half-written is trusted (shards are renamed into place when complete); free space and "
               "rerun the same command",
    "bench": "the measurements are printed above only when complete; free space and rerun",
}


class DietArgumentParser(argparse.ArgumentParser):
    """argparse's parser with its errors on one line: `dietpe pretrain: error: argument --steps: ...`."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def write_error(e: BaseException) -> OSError | None:
    """The OSError (full disk, read-only, forbidden) behind `e`, also when a library wrapped it."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno in WRITE_ERRORS:
            return e
        e = e.__cause__ or e.__context__
        seen += 1
    return None

# sub-command -> module that registers it; imported lazily so `dietpe --help` stays fast.
COMMANDS = {
    "pretrain": "dietpe.tasks.pretrain",
    "prepare": "dietpe.tasks.prepare",
    "finetune": "dietpe.tasks.finetune",
    "compare": "dietpe.tasks.compare",
    "translate": "dietpe.tasks.translate",
    "bench": "dietpe.bench.cli",
    "analyze": "dietpe.analysis.cli",
    "lm": "dietpe.tasks.lm",
}


def build_parser() -> argparse.ArgumentParser:
    parser = DietArgumentParser(prog="dietpe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("dietpe"):
                continue  # that job is not part of this build
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    name = " ".join(n for n in (args.command, getattr(args, "translate_command", None)) if n)
    try:
        return int(args.func(args) or 0)
    except (DietError, FileNotFoundError) as e:
        # Our validation raises these with messages naming the value and the limit.
        print(f"dietpe {name}: error: {e}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as e:
        found = write_error(e)
        if found is None:
            raise
        where = found.filename or "(unknown file)"
        print(f"dietpe {name}: error: cannot write {where}: {WRITE_ERRORS[found.errno]} "
              f"[{errno.errorcode.get(found.errno, found.errno)}]; {KEPT.get(args.command, 'free space and rerun')}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
