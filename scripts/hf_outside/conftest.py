"""Records the outcome of every test of one run of transformers' common tests (copied by check.py beside them):
one JSON line per test report into the file `DIETPE_OUTSIDE_REPORT` names, with the first line of a failure or
the reason of a skip, so check.py can compare runs without parsing pytest's text. Every test starts from seed 0
(torch, `random`, the common tests' own generator), so each run sees the same inputs and weights."""

import json
import os
import random
import sys

import pytest
import torch

_PATH = os.environ.get("DIETPE_OUTSIDE_REPORT")


def pytest_configure(config):
    torch.set_num_threads(1)  # tiny models: threads only contend (see tests/integrations/conftest.py)


@pytest.fixture(autouse=True)
def _seeded():
    random.seed(0)
    torch.manual_seed(0)
    common = sys.modules.get("tests.test_modeling_common")
    if common is not None and hasattr(common, "global_rng"):
        common.global_rng.seed(0)  # ids_tensor's inputs


def _reason(report) -> str:
    if report.passed:
        return ""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def pytest_runtest_logreport(report):
    if _PATH is None or (report.when != "call" and report.passed):
        return
    line = {"id": report.nodeid, "when": report.when, "outcome": report.outcome, "reason": _reason(report)}
    with open(_PATH, "a") as f:
        f.write(json.dumps(line) + "\n")
