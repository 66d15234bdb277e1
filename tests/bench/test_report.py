"""The bench table marks each ratio against the project's cost targets: 1.05 for per-head methods, Shaw 1.10 up to
128 tokens and 1.15 / 1.20 beyond, nothing for XLNet and the peers."""

from dietpe.bench.cost import Row
from dietpe.bench.report import table, target


def _row(method: str, length: int, train: float, infer: float) -> Row:
    return Row("bert-small", method, length, 2, 1, 0.0, 1.0, 1.0, train, infer)


def test_targets_by_method_and_length():
    assert target("shaw", 128) == (1.10, 1.10)
    assert target("shaw", 512) == (1.15, 1.20)
    assert target("diet-rel+seg", 512) == target("t5", 128) == (1.05, 1.05)
    assert target("xlnet", 512) is None and target("hf-bert", 512) is None


def test_marks_follow_the_targets():
    lines = table([_row("none", 128, 1.0, 1.0), _row("shaw", 128, 1.09, 1.104), _row("diet-abs", 128, 1.051, 1.05),
                   _row("xlnet", 128, 1.3, 1.6), _row("hf-bert", 128, 1.0, 0.99)]).splitlines()
    by_method = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    assert "1.09 ✓" in by_method["shaw"] and "1.10 ✗" in by_method["shaw"]  # 1.104 misses 1.10 at 128
    assert "1.05 ✗" in by_method["diet-abs"] and "1.05 ✓" in by_method["diet-abs"]  # 1.051 misses, 1.050 meets
    assert "✓" not in by_method["xlnet"] + by_method["hf-bert"] and "✗" not in by_method["xlnet"]
    shaw_512 = table([_row("shaw", 512, 1.15, 1.104)])
    assert "1.10 ✓" in shaw_512 and "1.15 ✓" in shaw_512
