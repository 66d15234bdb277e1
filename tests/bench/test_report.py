"""The bench table prints what was measured: each ratio to `none` with two decimals, "–" where a mode was not
run, and how our BERT-equivalent (`absolute`) compares with Hugging Face's BertModel."""

from dietpe.bench.cost import LongRow, Row
from dietpe.bench.report import long_table, markdown, table


def _row(method: str, length: int, train: float | None, infer: float | None) -> Row:
    return Row("bert-small", method, length, 2, 1_500_000, 0.0123, 10.0, 2.0, train, infer)


def _cells(text: str) -> dict[str, list[str]]:
    return {line.split(" | ")[0].lstrip("| "): [c.strip() for c in line.strip("| ").split(" | ")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method")}


def test_ratios_and_missing_modes():
    cells = _cells(table([_row("none", 128, 1.0, 1.0), _row("shaw", 128, 1.094, None)]))
    assert cells["shaw"] == ["shaw", "1.50M", "+1.23%", "10", "1.09", "2.0", "–", "–", "–"]
    assert cells["none"][4] == "1.00" and cells["none"][6] == "1.00"
    assert "✓" not in str(cells) and "✗" not in str(cells)


def test_absolute_against_hf_bert_states_a_direction_only_outside_the_spread():
    rows = [_row("none", 128, 1.0, 1.0), _row("absolute", 128, 1.02, 0.99), _row("hf-bert", 128, 1.0, 1.1)]
    rows[1].train_iqr, rows[2].train_iqr = (1.01, 1.03), (0.99, 1.005)
    rows[1].infer_iqr, rows[2].infer_iqr = (0.95, 1.02), (1.0, 1.2)
    text = table(rows)
    assert "train: absolute / hf-bert = 1.020 (slower)" in text
    assert ("infer: absolute / hf-bert = 0.900 (within the cycles' spread: interquartile ranges 0.950-1.020 and "
            "1.000-1.200 overlap)") in text
    rows[1].infer_iqr = (0.9, 0.95)
    assert "infer: absolute / hf-bert = 0.900 (faster)" in table(rows)
    rows[1].infer_iqr = None
    assert "0.900 (no per-cycle spread recorded: no direction stated)" in table(rows)


def test_markdown_groups_by_shape_and_length_and_marks_partial_runs():
    rows = [_row("none", 128, 1.0, 1.0), _row("none", 512, 1.0, 1.0), _row("t5", 128, 1.01, 1.0)]
    long = [LongRow("bert-small", "none", 8192, 900.0, 1.0, 30.0, 1.0, 400.0, 1.0)]
    text = markdown(rows, long, {"torch": "2.x", "threads": 1, "repeats": 3, "warmup": 1, "partial": "1 of 2"})
    assert text.count("### bert-small, length 128") == 1 and text.count("### bert-small, length 512") == 1
    assert "**Partial results**: 1 of 2" in text and long_table(long) in text


def test_the_fused_kernels_settings_are_written_with_the_figures(monkeypatch):
    import argparse

    import torch

    from dietpe.bench.cli import _Tables

    args = argparse.Namespace(threads=1, repeats=3, warmup=1, compile=None, precision="fp32")
    for name in [k for k in __import__("os").environ if k.startswith("DIETPE_FUSED_")]:
        monkeypatch.delenv(name)
    assert "Kernel settings" not in markdown([], [], _Tables(args, torch.device("cpu"), 1).settings)
    monkeypatch.setenv("DIETPE_FUSED_ORDER", "index")
    monkeypatch.setenv("DIETPE_FUSED_AUTOTUNE", "0")
    monkeypatch.setenv("DIETPE_DATA", "/elsewhere")  # not the kernel's
    text = markdown([], [], _Tables(args, torch.device("cpu"), 1).settings)
    assert "Kernel settings: `DIETPE_FUSED_AUTOTUNE=0`, `DIETPE_FUSED_ORDER=index`\n" in text
