"""An outside check of `dietpe.attach`: transformers' own common model tests on attached models.

    python scripts/hf_outside/check.py                      plain, own scheme, diet-rel; exit 1 on a regression
    python scripts/hf_outside/check.py --runs plain,own,t5 --sdist transformers-5.24.0.tar.gz --json out.json

transformers' source distribution (from the package index, for the installed version) ships the common tests
(`tests/test_modeling_common.py`: `ModelTesterMixin`) but not the per-model files nor `tests/generation/`;
`families.py` holds diet's own thin testers for Llama, GPT-2 and Qwen2. Each run is one pytest process on the
same tests: `plain` (transformers alone, dietpe not imported), `import` (dietpe imported, nothing attached),
`own` (each family's own scheme attached right after construction: `rotary` in Llama and Qwen2, `absolute` in
GPT-2), or a method spec (`diet-rel`). The rule: every test that passes plain passes in every other run,
except, in a run of a method other than the model's own, the tests in `EXCLUDED`, which compare the model's
numbers with RoPE's. The table gives passed / failed / skipped per family and run. Without a network (the
download fails to connect), the check says so in one line and exits 0; any other failure to get the tests is
an error.

Written here, not taken from transformers: transformers' per-model test files are not distributed with it.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = {"LlamaOutsideTest": "llama", "GPT2OutsideTest": "gpt2", "Qwen2OutsideTest": "qwen2"}

_ROPE_SCALING = ("asserts that RoPE scaling (rope_type {}) changes the model's outputs; a method that replaces "
                 "RoPE leaves the scaled and unscaled models equal")
#: tests that compare numbers with RoPE's: not expected to pass once a method other than the model's own replaces it
EXCLUDED = {
    "test_model_rope_scaling_from_config_0_linear": _ROPE_SCALING.format("linear"),
    "test_model_rope_scaling_from_config_1_dynamic": _ROPE_SCALING.format("dynamic"),
    "test_model_rope_scaling_from_config_2_yarn": _ROPE_SCALING.format("yarn"),
    "test_model_rope_scaling_frequencies": "checks the cos/sin of the model's RoPE module at scaled frequencies; "
                                           "the method replaced that module (the test then finds none and skips)",
}

#: what test_modeling_common imports from files the source distribution leaves out; diet's tests declare no
#: generative class and run no export test
STUBS = {
    "exporters/test_export.py": "class ExportTesterMixin:\n    \"\"\"Not shipped in the source distribution.\"\"\"\n",
    "generation/test_utils.py": "class GenerationTesterMixin:\n    \"\"\"Not shipped in the source distribution.\"\"\"\n",
}
PYTEST_INI = "[pytest]\nfilterwarnings =\n    ignore::pytest.PytestUnknownMarkWarning\n"
_OFFLINE = ("Failed to establish a new connection", "Temporary failure in name resolution", "Network is unreachable",
            "Name or service not known", "ProxyError", "Max retries exceeded", "No route to host",
            "Connection refused", "timed out")


class Offline(Exception):
    """The package index cannot be reached."""


def download_sdist(version: str, cache: Path) -> Path:
    """transformers' source distribution of `version`, from `cache` or downloaded there by pip (so a user's index,
    proxy and certificates apply). Raises Offline when pip cannot connect, RuntimeError on any other failure."""
    name = f"transformers-{version}.tar.gz"
    if (cache / name).is_file():
        return cache / name
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--retries", "1",
               "--timeout", "30", "-d", tmp, f"transformers=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / name
        if done.returncode != 0 or not got.is_file():
            text = done.stdout + done.stderr
            last = next((line for line in reversed(text.splitlines()) if line.strip()), "no output")
            if any(s in text for s in _OFFLINE):
                raise Offline(last.strip())
            raise RuntimeError(f"pip download transformers=={version} failed: {last.strip()}")
        os.replace(got, cache / name)  # atomic: a killed download leaves no partial file under the name
    return cache / name


def assemble(sdist: Path, into: Path) -> Path:
    """A folder where pytest runs diet's testers beside transformers' common tests: into/tests/ is a package
    holding test_modeling_common.py (from the sdist), the stubs and families.py; into/conftest.py records."""
    pkg = into / "tests"
    pkg.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("/tests/test_modeling_common.py")), None)
        if member is None:
            raise RuntimeError(f"{sdist.name} holds no tests/test_modeling_common.py")
        (pkg / "test_modeling_common.py").write_bytes(tar.extractfile(member).read())
    (pkg / "__init__.py").write_text("")
    for rel, text in STUBS.items():
        (pkg / rel).parent.mkdir(exist_ok=True)
        (pkg / rel).parent.joinpath("__init__.py").write_text("")
        (pkg / rel).write_text(text)
    shutil.copy(HERE / "families.py", pkg / "test_dietpe_families.py")
    shutil.copy(HERE / "conftest.py", into / "conftest.py")
    (into / "pytest.ini").write_text(PYTEST_INI)
    return into


def missing_modules(common: Path) -> list[str]:
    """The test dependencies the common tests import that are not installed."""
    text = common.read_text()
    return [m for m in ("pytest", "parameterized")
            if (f"import {m}" in text or f"from {m} import" in text) and importlib.util.find_spec(m) is None]


def run(folder: Path, name: str, select: str | None) -> dict:
    """One pytest run (`name`: plain, own or a method spec) in `folder`; returns {test id: (outcome, reason)}."""
    report = folder / f"{name.replace(':', '_').replace('=', '_')}.jsonl"
    env = {**os.environ, "DIETPE_OUTSIDE": name, "DIETPE_OUTSIDE_REPORT": str(report)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_dietpe_families.py"]
    if select:
        cmd += ["-k", select]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if not report.is_file() or done.returncode not in (0, 1):  # 1: some test failed; else pytest itself did
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"run {name!r}: pytest exited {done.returncode}:\n{tail}")
    return {"outcomes": outcomes(report.read_text().splitlines()), "seconds": seconds}


def outcomes(lines: list[str]) -> dict[str, tuple[str, str]]:
    """Each test's outcome from the recorded reports: failed if any report (setup, call, a subtest) failed,
    passed if its call passed, else skipped; with the first reason given."""
    reports = collections.defaultdict(list)
    for line in lines:
        r = json.loads(line)
        reports[r["id"].split("::", 1)[1]].append(r)
    out = {}
    for test, rs in reports.items():
        if any(r["outcome"] == "failed" for r in rs):
            outcome = "failed"
        elif any(r["when"] == "call" and r["outcome"] == "passed" for r in rs):
            outcome = "passed"
        else:
            outcome = "skipped"
        out[test] = (outcome, next((r["reason"] for r in rs if r["outcome"] == outcome and r["reason"]), ""))
    return out


def regressions(plain: dict, other: dict, own: bool) -> list[tuple[str, str, str]]:
    """(test, outcome in `other`, reason) for every test passing in `plain` that does not pass in `other`, less
    `EXCLUDED` when the run's method is not the model's own."""
    bad = []
    for test, (outcome, _) in sorted(plain.items()):
        if outcome != "passed" or (not own and test.split("::")[-1] in EXCLUDED):
            continue
        got, reason = other.get(test, ("missing", "not collected"))
        if got != "passed":
            bad.append((test, got, reason))
    return bad


def counts(results: dict[str, tuple[str, str]]) -> dict[str, collections.Counter]:
    per = collections.defaultdict(collections.Counter)
    for test, (outcome, _) in results.items():
        per[FAMILIES.get(test.split("::")[0], test.split("::")[0])][outcome] += 1
    return per


def table(runs: dict[str, dict]) -> str:
    lines = ["| family | run | passed | failed | skipped |", "| --- | --- | --: | --: | --: |"]
    per_run = {name: counts(r["outcomes"]) for name, r in runs.items()}
    for family in FAMILIES.values():
        for name, per in per_run.items():
            c = per.get(family, collections.Counter())
            lines.append(f"| {family} | {name} | {c['passed']} | {c['failed']} | {c['skipped']} |")
    return "\n".join(lines)


def compare(runs: dict[str, dict]) -> list[str]:
    """One line per regression of every run against `plain`."""
    plain = runs["plain"]["outcomes"]
    lines = []
    for name, r in runs.items():
        if name != "plain":
            for test, got, reason in regressions(plain, r["outcomes"], own=name in ("own", "import")):
                lines.append(f"{name}: {test} passes plain, {got} attached: {reason}")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="plain,own,diet-rel",
                   help="comma-separated runs: plain (required: the reference), import (dietpe imported, "
                        "nothing attached), own (each family's own scheme), method specs (default: %(default)s)")
    p.add_argument("--sdist", type=Path, help="transformers' source distribution (default: downloaded for the "
                                              "installed version into --cache)")
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                   / "dietpe" / "hf-outside", help="where a downloaded sdist is kept (default: %(default)s)")
    p.add_argument("--jobs", type=int, help="runs at once, one CPU thread each (default: every run at once)")
    p.add_argument("-k", dest="select", help="pytest -k expression selecting tests (default: all)")
    p.add_argument("--json", type=Path, help="write every run's outcomes and times there")
    p.add_argument("--keep", type=Path, help="assemble the tests in this (new) folder and keep it")
    args = p.parse_args(argv)
    args.runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if "plain" not in args.runs:
        p.error(f"--runs {','.join(args.runs)}: 'plain' is the reference every other run is compared with")
    if args.jobs is not None and args.jobs < 1:
        p.error(f"--jobs {args.jobs}: at least 1")
    args.jobs = args.jobs or len(args.runs)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import transformers

    version = transformers.__version__
    try:
        sdist = args.sdist or download_sdist(version, args.cache)
    except Offline as e:
        print(f"hf_outside: skipped: transformers {version}'s tests cannot be downloaded, the package index is "
              f"unreachable ({e})")
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = assemble(sdist, args.keep or Path(tmp) / "hf")
        missing = missing_modules(folder / "tests" / "test_modeling_common.py")
        if missing:
            print(f"hf_outside: transformers' common tests import {', '.join(missing)}: pip install "
                  f"{' '.join(missing)}")
            return 2
        with ThreadPoolExecutor(args.jobs) as pool:
            runs = dict(zip(args.runs, pool.map(lambda name: run(folder, name, args.select), args.runs)))
    print(f"transformers {version}: its common model tests ({sdist.name}) on diet's testers")
    print(table(runs))
    print("runs: " + ", ".join(f"{name} {r['seconds']:.0f} s" for name, r in runs.items())
          + f"; {time.perf_counter() - start:.0f} s in all, {args.jobs} at once")
    if args.json:
        args.json.write_text(json.dumps({"transformers": version, "runs": runs}, indent=1))
    bad = compare(runs)
    for line in bad:
        print(line)
    excluded = ", ".join(sorted(EXCLUDED))
    print(f"hf_outside: {'FAILED' if bad else 'ok'}: {len(bad)} test(s) passing plain do not pass attached "
          f"(not expected of a method replacing RoPE: {excluded})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
