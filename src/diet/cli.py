"""The `diet` command line: one sub-command per job, each defined in its own module.

A module named here exposes `register(subparsers)`, which adds its parser and sets `func`
(a callable taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from diet.errors import DietError

# sub-command -> module that registers it; imported lazily so `diet --help` stays fast.
COMMANDS = {
    "pretrain": "diet.tasks.pretrain",
    "finetune": "diet.tasks.finetune",
    "compare": "diet.tasks.compare",
    "translate": "diet.tasks.translate",
    "bench": "diet.bench.cli",
    "analyze": "diet.analysis.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("diet"):
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
    try:
        return int(args.func(args) or 0)
    except (DietError, FileNotFoundError) as e:
        # Our validation raises these with messages naming the value and the limit.
        print(f"diet {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
