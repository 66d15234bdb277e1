"""The length table beside the peers (dietpe.bench.lengths), run tiny on generated text."""

import csv
import importlib.util
import io
import math
import random
import sys

from dietpe.bench import lengths

HAS_X = importlib.util.find_spec("x_transformers") is not None
TINY = ["--steps", "3", "--batch-size", "2", "--length", "16", "--hidden", "16", "--layers", "1", "--heads", "2",
        "--eval-tokens", "256"]


def text_folder(tmp_path):
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "ran", "far"]
    for name, n in (("train.txt", 4000), ("valid.txt", 800)):
        (tmp_path / name).write_text(" ".join(rng.choice(words) for _ in range(n)) + "\n", encoding="utf-8")
    # a character the training text lacks: scored as the unknown id, not a crash
    with open(tmp_path / "valid.txt", "a", encoding="utf-8") as f:
        f.write("Z\n")
    return tmp_path


def test_table_every_model_same_loop(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    data = text_folder(tmp_path / "data")
    peers = ["diet", "llama", "hf-llama"] + (["x-transformers"] if HAS_X else [])
    out = tmp_path / "out"
    argv = ["--data", str(data), "-o", str(out), "--methods", "none,rotary,t5", "--peers", ",".join(peers)] + TINY
    assert lengths.main(argv) == 0
    rows = list(csv.DictReader((out / "lengths.csv").open()))
    # hf-llama has rotary only; x-transformers has all three
    expected = {(p, m) for p in peers for m in ("none", "rotary", "t5") if lengths.offers(p, m)}
    assert {(r["model"], r["method"]) for r in rows} == expected
    vocab = len(set((data / "train.txt").read_text())) + 1
    for r in rows:
        for m in lengths.MULTIPLES:
            ppl = float(r[f"ppl_{m}L"])
            # per character: above 1, and a 3-step model is still near uniform over the characters
            assert 1.0 < ppl < 3 * vocab and math.isfinite(ppl), r
    md = (out / "lengths.md").read_text()
    line = next(row for row in md.splitlines() if row.startswith("| none |"))
    assert line.count("–") == 2  # transformers' Llama has no position-free form: empty cells
    # same seed, same batches: Llama + attached rotary is transformers' Llama with its own RoPE, to the
    # digit, at every length; diet's own model is another architecture
    by = {(r["model"], r["method"]): [float(r[f"ppl_{m}L"]) for m in lengths.MULTIPLES] for r in rows}
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(by[("llama", "rotary")], by[("hf-llama", "rotary")]))
    assert by[("diet", "rotary")] != by[("llama", "rotary")]
    # a second call reuses the finished runs and writes the same table
    before = (out / "lengths.csv").read_text()
    capsys.readouterr()
    assert lengths.main(argv) == 0
    assert "step " not in capsys.readouterr().err
    assert (out / "lengths.csv").read_text() == before


def test_runs_are_deterministic(tmp_path):
    """The same figures twice: every column but the training's wall time."""
    data = text_folder(tmp_path)
    figures = []
    for out in ("a", "b"):
        assert lengths.main(["--data", str(data), "-o", str(tmp_path / out), "--methods", "alibi",
                             "--peers", "diet"] + TINY) == 0
        rows = list(csv.DictReader(io.StringIO((tmp_path / out / "lengths.csv").read_text())))
        figures.append([{k: v for k, v in row.items() if k != "train_seconds"} for row in rows])
    assert figures[0] == figures[1] and len(figures[0]) == 1 and "ppl_1L" in figures[0][0]


def test_missing_x_transformers_is_one_line(tmp_path, capsys, monkeypatch):
    if HAS_X:  # installed here: hide it, as on a machine without the extra
        monkeypatch.setitem(sys.modules, "x_transformers", None)
    data = text_folder(tmp_path)
    assert lengths.main(["--data", str(data), "-o", str(tmp_path / "out"), "--peers", "x-transformers"]
                        + TINY) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install 'dietpe[bench]'" in err and err.startswith("python -m dietpe"), err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_bad_names_are_one_line(tmp_path, capsys):
    for option, value in (("--methods", "t5,rope"), ("--peers", "gpt-neox")):
        assert lengths.main(["--data", str(tmp_path), "-o", str(tmp_path / "out"), option, value]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and value.split(",")[-1] in err and "not one of" in err, err
    assert lengths.main(["--data", str(tmp_path / "nowhere"), "-o", str(tmp_path / "out"), "--peers", "diet"]
                        + TINY) == 2
    assert "train.txt: not found" in capsys.readouterr().err
    # a bad field of a spec: one line, before any output folder exists
    data = text_folder(tmp_path)
    assert lengths.main(["--data", str(data), "-o", str(tmp_path / "out"), "--peers", "diet", "--methods",
                         "alibi,diet-rel:diet_rel_max_distance=-2"] + TINY) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "diet_rel_max_distance=-2" in err and not (tmp_path / "out").exists(), err


def test_a_kept_run_with_other_settings_is_trained_again(tmp_path, capsys):
    data = text_folder(tmp_path)
    argv = ["--data", str(data), "-o", str(tmp_path / "out"), "--methods", "alibi", "--peers", "diet"] + TINY
    assert lengths.main(argv) == 0
    first = (tmp_path / "out" / "lengths.csv").read_text()
    capsys.readouterr()
    assert lengths.main(argv + ["--seed", "1"]) == 0  # not the kept seed-0 run
    assert "[lengths] diet alibi" in capsys.readouterr().err
    assert (tmp_path / "out" / "lengths.csv").read_text() != first
    assert not list((tmp_path / "out").rglob("*.part"))


def test_a_learned_table_reads_n_a_beyond_its_length(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    data = text_folder(tmp_path / "data")
    out = tmp_path / "out"
    argv = ["--data", str(data), "-o", str(out), "--methods", "absolute", "--peers", "diet"] + TINY
    for _ in range(2):  # the run, then its table again from the kept result
        assert lengths.main(argv) == 0
        line = next(row for row in (out / "lengths.md").read_text().splitlines() if row.startswith("| absolute |"))
        cells = [c.strip() for c in line.strip("| ").split(" | ")]
        assert float(cells[1]) > 1 and cells[2] == "n/a (beyond the table)"
        (row,) = csv.DictReader((out / "lengths.csv").open())
        assert float(row["ppl_1L"]) > 1 and row["ppl_8L"] == ""
