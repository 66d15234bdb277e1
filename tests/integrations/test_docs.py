"""Every python block of docs/integrate.md runs as it stands."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrate.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_example_runs(index):
    exec(compile(BLOCKS[index], f"{DOC.name} block {index + 1}", "exec"), {"__name__": "docs"})
