"""The command line's help: every option explained once, one name per concept, descriptions whole, and the
top-level help built without importing torch (its speed is measured in a benchmark, not here)."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from dietpe import __version__
from dietpe.cli import COMMANDS, build_parser, main


def parsers():
    top = build_parser()
    found = {}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, p in action.choices.items():
                found[name] = p
                for sub in p._actions:
                    if isinstance(sub, argparse._SubParsersAction):
                        found.update({f"{name} {n}": q for n, q in sub.choices.items()})
    return found


PARSERS = parsers()


def test_every_command_is_listed():
    assert set(COMMANDS) <= set(PARSERS)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_explains_every_option_once(name, capsys):
    p = PARSERS[name]
    for action in p._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        assert action.help and action.help.strip(), f"dietpe {name}: {action.option_strings or action.dest} has no help"
    text = p.format_help()
    assert "(default: None)" not in text and "(default: False)" not in text
    for entry in text.split("\n  -"):
        assert entry.count("default") <= 1 + entry.count("defaults"), f"dietpe {name}: {entry!r}"
    # the description is a whole paragraph, not cut mid-sentence
    if p.description:
        assert p.description.rstrip().endswith((".", ")", ":")), f"dietpe {name}: {p.description!r}"


def test_a_default_added_by_the_action_itself_is_shown_once_or_not_at_all():
    """Python 3.10's BooleanOptionalAction appends " (default: %(default)s)" to its help (3.11 does not): the
    formatter drops it where the default is no value (False, None) and shows a real one once, on any Python."""
    from dietpe.cli import DietArgumentParser

    p = DietArgumentParser(prog="x")
    p.add_argument("--off", action="store_true", help="flag" + " (default: %(default)s)")
    p.add_argument("--on", action=argparse.BooleanOptionalAction, default=True, help="flag on")
    p.add_argument("--steps", type=int, default=3, help="steps")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip memory")
    text = " ".join(p.format_help().split())
    assert "(default: False)" not in text and "flag (default" not in text
    assert text.count("(default: True)") == 1 and text.count("(default: 3)") == 1  # --on's, not --no-memory's


CANONICAL = {"--output-dir": "-o", "--lr": None, "--size": None, "--seed": None}
OLD = ("--out", "--learning-rate", "--preset", "--position")


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_one_name_per_concept(name):
    p = PARSERS[name]
    visible = {s for a in p._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
    assert not visible & set(OLD), f"dietpe {name} shows old spellings {visible & set(OLD)}"
    if "--output-dir" in visible:
        assert "-o" in visible


def test_old_spellings_still_work():
    args = build_parser().parse_args(["translate", "train", "-o", "x", "--learning-rate", "0.5", "--preset",
                                      "transformer-tiny"])
    assert (args.learning_rate, args.preset) == (0.5, "transformer-tiny")
    args = build_parser().parse_args(["analyze", "ckpt", "--data", "d", "--out", "o"])
    assert args.out == "o"


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"dietpe {__version__}"


def test_python_dash_m_runs_the_command():
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-m", "dietpe", "--version"], capture_output=True, text=True,
                         env={"PYTHONPATH": src, "PATH": ""})
    assert out.returncode == 0 and out.stdout.strip() == f"dietpe {__version__}"


def test_the_command_lists_its_commands_without_importing_torch(tmp_path):
    # run as the console script does (argv[0] is `dietpe`): the top-level parser needs neither torch nor
    # transformers, nor any command's module
    script = tmp_path / "dietpe"
    script.write_text("import sys\nfrom dietpe.cli import build_parser\nbuild_parser('').format_help()\n"
                      "print(sorted(m for m in ('torch', 'transformers', 'dietpe.tasks.pretrain') if m in sys.modules))\n")
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PATH": ""})
    assert out.stdout.strip() == "[]"


def test_every_commands_help_is_built_without_importing_torch(tmp_path):
    # each command's full parser and help, as `dietpe X --help` builds it: no torch, no transformers, no job
    script = tmp_path / "dietpe"
    script.write_text(
        "import sys\nfrom dietpe.cli import COMMANDS, build_parser\n"
        "for name in COMMANDS:\n"
        "    top = build_parser(name)\n"
        "    sub = next(a for a in top._actions if a.dest == 'command').choices[name]\n"
        "    assert any(a.dest == 'func' or a.option_strings for a in sub._actions), name\n"
        "    sub.format_help()\n"
        "heavy = ('torch', 'transformers', 'dietpe.models', 'dietpe.tasks.pretrain', 'dietpe.analysis')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n")
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PATH": ""})
    assert out.stdout.strip() == "[]"


def test_the_names_the_parsers_offer_are_the_models():
    from dietpe.commands import LM_SIZES, PACKINGS, SEQ2SEQ_SIZES
    from dietpe.data.mlm import PACKINGS as MLM_PACKINGS
    from dietpe.models.seq2seq import SEQ2SEQ_PRESETS
    from dietpe.tasks.lm import SIZES

    assert PACKINGS == MLM_PACKINGS
    assert sorted(SEQ2SEQ_SIZES) == sorted(SEQ2SEQ_PRESETS)
    assert sorted(LM_SIZES) == sorted(SIZES)


def test_a_command_runs_its_module_once_parsed(monkeypatch):
    from dietpe.tasks import prepare

    seen = []
    monkeypatch.setattr(prepare, "main", lambda args: seen.append(args.corpus) or 0)
    assert main(["prepare", "somewhere"]) == 0 and seen == ["somewhere"]


def test_library_messages_are_quiet_while_a_command_runs(monkeypatch):
    # transformers' warnings would land inside the progress bar's line
    import transformers
    from transformers.utils import logging as hf_logging

    from dietpe import cli

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    seen = []
    parser = cli.build_parser("bench")
    bench_parser(parser).set_defaults(func=lambda args: seen.append(hf_logging.get_verbosity()) or 0)
    monkeypatch.setattr(cli, "build_parser", lambda only=None: parser)
    before = hf_logging.get_verbosity()
    assert cli.main(["bench"]) == 0 and transformers
    assert seen == [hf_logging.ERROR] and hf_logging.get_verbosity() == before


def bench_parser(parser):
    """The `bench` sub-command's parser (its defaults, such as func, win over the top-level parser's)."""
    import argparse

    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
