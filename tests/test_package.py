"""The package a user installs: a lean core, extras for the tools, and the README's commands installing what
they run."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dietpe.extras import EXTRAS, MissingExtra, need

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10, the floor: its backport (the test extra)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CORE = {"torch", "transformers", "safetensors", "tokenizers", "numpy"}


def names(requirements):
    return {re.split(r"[<>=!\[ ]", r, maxsplit=1)[0] for r in requirements}


def test_the_core_is_the_model_library():
    assert names(PYPROJECT["project"]["dependencies"]) == CORE


def test_every_extra_module_is_declared_in_its_extra():
    extras = PYPROJECT["project"]["optional-dependencies"]
    for module, extra in EXTRAS.items():
        # a module's distribution name may spell "_" as "-" (x_transformers: x-transformers), PEP 503
        assert module.replace("_", "-") in {n.replace("_", "-") for n in names(extras[extra])}, (module, extra)


#: the Triton kernels' modules import triton at the top (a kernel is decorated when its module loads); nothing
#: imports them before a kernel runs (`test_import_dietpe_needs_no_triton`)
KERNELS = ROOT / "src" / "dietpe" / "attention" / "kernels"
KERNEL_MODULES = {KERNELS / "attention.py", KERNELS / "rotary.py"}


def test_no_module_imports_an_extra_at_import_time():
    # an extra imported at the top of a module would break `import dietpe` (and every command) without it
    stdlib = set(sys.stdlib_module_names)
    for path in (ROOT / "src" / "dietpe").rglob("*.py"):
        allowed = {"triton"} if path in KERNEL_MODULES else set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                assert top in stdlib | CORE | allowed | {"dietpe", "__future__"}, \
                    f"{path.relative_to(ROOT)} imports {mod}"


def test_import_dietpe_needs_no_triton():
    """Without Triton a model still builds and runs (auto runs sdpa off CUDA) and no kernel module is loaded."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "import torch, dietpe\n"
            "from dietpe import DietConfig, DietModel\n"
            "m = DietModel(DietConfig.from_preset('bert-tiny', vocab_size=20, position='rotary'))\n"
            "m(torch.randint(1, 20, (1, 5)))\n"
            "assert not [n for n in sys.modules if n.startswith('dietpe.attention.kernels.')], sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_missing_extra_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    with pytest.raises(MissingExtra, match=r"pip install 'dietpe\[translate\]'"):
        need("sacrebleu")


def test_the_cli_reports_a_missing_extra_in_one_line(monkeypatch, capsys):
    from dietpe import cli

    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    import dietpe.analysis.stats as stats

    def run(args):
        stats.t_quantile(0.95, 3)

    parser = cli.build_parser("bench")
    monkeypatch.setattr(cli, "build_parser", lambda only=None: parser)
    bench_parser(parser).set_defaults(func=run)
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'dietpe[study]'" in err


def test_the_readme_commands_install_what_they_run():
    readme = (ROOT / "README.md").read_text()
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert 'pip install -e ".[study]" && dietpe compare' in readme
    assert 'pip install -e ".[test]" && python -m pytest -q -n auto' in readme
    assert {"accelerate", "matplotlib", "scipy"} <= names(extras["study"])
    assert "dietpe[all]" in extras["test"] and {"pytest", "pytest-xdist"} <= names(extras["test"])
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().endswith('python -m pytest -q -n auto --maxprocesses 4')  # CI runs the README's command
    assert 'python -m pytest -q -n auto --maxprocesses 4\n```' in readme


def test_the_readme_has_no_relative_links():
    # a package index shows the README without the repository's files
    readme = (ROOT / "README.md").read_text()
    assert not re.findall(r"\]\((?!https?://|#)[^)]+\)", readme)


def test_the_licence_is_shipped():
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == "Apache-2.0"


def bench_parser(parser):
    """The `bench` sub-command's parser (its defaults, such as func, win over the top-level parser's)."""
    import argparse

    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]


def ci_exit(body: str, tmp_path) -> int:
    """Runs `body` under .ci/run's own cleanup (its trap on EXIT), as the script runs, and gives its status."""
    ci = (ROOT / ".ci" / "run").read_text()
    cleanup = re.search(r"^cleanup\(\) \{.*?^trap cleanup EXIT$", ci, re.S | re.M).group(0)
    script = f'set -euo pipefail\nroot="{tmp_path / "root"}"\nmkdir -p "$root"\n{cleanup}\n{body}\n'
    return subprocess.run(["bash", "-c", script], timeout=60).returncode


def test_ci_exits_as_its_last_command_did_whatever_its_background_jobs_did(tmp_path):
    # every background job joined: `kill` then has no job to stop, which must not become CI's status
    assert ci_exit("(true) & wait $!\necho done", tmp_path) == 0
    assert not (tmp_path / "root").exists()  # the environments are removed
    assert ci_exit("(sleep 60) &\necho done", tmp_path) == 0  # one still running is stopped, not waited for
    assert ci_exit("(true) & wait $!\nfalse\necho never", tmp_path) == 1
    assert ci_exit("(exit 3) & wait $!", tmp_path) == 3  # a failed job fails CI


def test_a_command_refuses_a_missing_extra_before_any_work_naming_its_own(monkeypatch, tmp_path, capsys):
    from dietpe import cli, extras

    # accelerate is in 'study' and 'translate': the asking command's own is named
    assert "pip install 'dietpe[translate]'" in extras.message("accelerate", "translate")
    asked = []

    def missing(module, extra=None):
        asked.append((module, extra))
        raise MissingExtra(extras.message(module, extra))

    monkeypatch.setattr(extras, "need", missing)
    files = [str(tmp_path / f) for f in ("a.de", "a.en")]
    argv = ["translate", "train", "--train-source", files[0], "--train-target", files[1], "--valid-source", files[0],
            "--valid-target", files[1], "-o", str(tmp_path / "tr")]
    assert cli.main(argv) == 2 and asked == [("accelerate", "translate")]
    assert "pip install 'dietpe[translate]'" in capsys.readouterr().err and not (tmp_path / "tr").exists()
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # lm's plot comes last: refused first
    assert cli.main(["lm", str(tmp_path / "corpus.txt"), "-o", str(tmp_path / "lm")]) == 2
    assert "pip install 'dietpe[study]'" in capsys.readouterr().err and not (tmp_path / "lm").exists()
