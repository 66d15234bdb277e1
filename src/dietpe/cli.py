"""The `dietpe` command line: one sub-command per job, each defined in its own module.

Each command's parser is built by `dietpe.commands` (without importing torch); it sets `func`, a callable
taking the parsed namespace and returning an exit code, which imports the command's module when it runs.

Every mistake in the input ends the command with exit code 2 and one line on stderr,
`dietpe <command>: error: ...`, naming the value and the limit (or the file and line): argparse's own errors
(without the usage block), DietError from validation, and a disk that is full, read-only or forbidden while
writing (with the path and what was kept).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
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


class DietHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown once: not for options without one (None, False), nor where the help already says it."""

    #: what Python 3.10's BooleanOptionalAction appends to its help itself (3.11 leaves it to the formatter)
    ADDED = " (default: %(default)s)"

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS):
            return text.removesuffix(self.ADDED)
        if action.nargs == 0 and action.const is False:  # store_false's `--no-x`: "(default: True)" reads as on
            return text
        if "default" in text:
            return text
        return super()._get_help_string(action)


class DietArgumentParser(argparse.ArgumentParser):
    """argparse's parser with its errors on one line: `dietpe pretrain: error: argument --steps: ...`.

    Every command's parser is one: the description is the first paragraph of what it is given (a module's
    docstring, never cut mid-sentence) and defaults are shown by `DietHelpFormatter`."""

    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = DietHelpFormatter
        if kwargs.get("description"):
            kwargs["description"] = " ".join(kwargs["description"].strip().split("\n\n")[0].split())
        super().__init__(*args, **kwargs)

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

# sub-command -> (module that does its work, one-line help). `dietpe --help` lists them without importing
# any (torch and transformers take seconds to import); a command's module is imported when it runs.
COMMANDS = {
    "pretrain": ("dietpe.tasks.pretrain", "masked-LM pre-training (DIET appendix A)"),
    "prepare": ("dietpe.tasks.prepare", "read, tokenize and pack a corpus once into cached token shards"),
    "finetune": ("dietpe.tasks.finetune", "fine-tune a pre-trained model on GLUE/XNLI/QA (lr grid x seeds)"),
    "compare": ("dietpe.tasks.compare", "pre-train and fine-tune every position method; write a report"),
    "translate": ("dietpe.tasks.translate", "train and evaluate encoder-decoder translation models"),
    "bench": ("dietpe.bench.cli", "time and memory of every position method against `none`"),
    "analyze": ("dietpe.analysis.cli", "rank and attention pictures of a checkpoint (DIET Fig. 2, 4-8; TUPE Fig. 2, 6)"),
    "lm": ("dietpe.tasks.lm", "causal LMs per position method, then length generalisation"),
    "lengths": ("dietpe.tasks.lengths", "perplexity at 1, 2, 4, 8 times the training length"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, that command's parser and a one-line entry for each other command.
    No command's module is imported (`dietpe.commands` holds the parsers; the job is imported when it runs)."""
    from dietpe import __version__
    from dietpe.commands import REGISTER, module_file

    parser = DietArgumentParser(prog="dietpe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dietpe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=DietArgumentParser)
    # a job whose module is not part of this build is left out
    present = {name for name, (module, _) in COMMANDS.items() if module_file(module).is_file()}
    wanted = [name for name in COMMANDS if (only is None or name == only) and name in present]
    for name in wanted:
        if name not in sub.choices:
            REGISTER[name](sub)
    for name, (module, help_text) in COMMANDS.items():
        if name not in sub.choices and name in present:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


@contextlib.contextmanager
def quiet_libraries():
    """transformers' info and warnings (cache notes, "mtime may not be reliable") would land inside the
    progress bar's line: only its errors are shown while a command runs, unless TRANSFORMERS_VERBOSITY is set."""
    if "transformers" not in sys.modules or os.environ.get("TRANSFORMERS_VERBOSITY"):
        yield
        return
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def _named_command(argv: list[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    only = _named_command(argv)
    try:
        parser = build_parser(only or "")  # "": no command's module imported
    except ImportError as e:
        from dietpe.extras import missing

        if missing(e) is None:
            raise
        print(f"dietpe {only}: error: {missing(e)}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    name = " ".join(n for n in (args.command, getattr(args, "translate_command", None)) if n)
    try:
        with quiet_libraries():
            return int(args.func(args) or 0)
    except ImportError as e:
        from dietpe.extras import missing

        if missing(e) is None:
            raise
        print(f"dietpe {name}: error: {missing(e)}", file=sys.stderr)
        return 2
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
