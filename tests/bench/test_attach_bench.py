"""bench.attach at a tiny size on the CPU: a row per method beside the native model, a failing row printed
rather than ending the run, the census column."""

from dietpe.bench.attach import main


def test_tiny_table(capsys):
    assert main(["--device", "cpu", "--dtype", "float32", "--layers", "1", "--hidden", "32", "--heads", "4",
                 "--kv-heads", "2", "--vocab", "64", "--shapes", "2x32", "--steps", "1", "--warmup", "0",
                 "--census", "--methods", "native,none,rotary,diet-rel,no-such-method"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2×32")]
    assert [r.split("|")[2].strip() for r in rows] == ["native", "none", "rotary", "diet-rel", "no-such-method"]
    native, none, rotary, rel, bad = (r.split("|") for r in rows)
    assert native[5].strip() == "1.00" and float(rel[4]) > 0
    assert none[3].strip() == "transformers" and rel[3].strip() == "sdpa"
    assert native[7].split()[0].isdigit()  # the census column (its meaning is tested in test_census.py)
    assert "ConfigError" in bad[4]


def test_the_bench_tools_end_bad_input_in_one_line(capsys):
    """`python -m dietpe.bench.*` ends as the `dietpe` command does: one line, exit code 2, no traceback."""
    import subprocess
    import sys

    import pytest

    from dietpe.errors import ConfigError, module_main

    def refused():
        raise ConfigError("model size 'bogus' is not one of toy, bert-tiny")

    assert module_main(refused, "python -m dietpe.bench.study_time") == 2
    assert capsys.readouterr().err == ("python -m dietpe.bench.study_time: error: model size 'bogus' is not one of "
                                       "toy, bert-tiny\n")
    with pytest.raises(SystemExit):
        main(["--shapes", "8by2048"])
    assert "--shapes: '8by2048' is not BATCHxLENGTH" in capsys.readouterr().err
    done = subprocess.run([sys.executable, "-m", "dietpe.bench.params", "--bogus"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "unrecognized arguments: --bogus" in done.stderr
