"""The outside check (scripts/hf_outside/check.py) itself: how it reads outcomes, what it counts as a
regression, the folder it assembles, the hook attaching right after construction (end to end on a stand-in for
transformers' common tests), and a missing network said in one line. The check on transformers' real tests runs
in CI (.ci/run)."""

import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def check():
    return load_script("scripts/hf_outside/check.py", "hf_outside_check")


def report(test, when, outcome, reason=""):
    return json.dumps({"id": f"tests/t.py::{test}", "when": when, "outcome": outcome, "reason": reason})


def test_a_failing_subtest_fails_the_test_and_a_skip_keeps_its_reason(check):
    got = check.outcomes([report("A::test_x", "call", "passed"), report("A::test_x", "call", "failed", "boom"),
                          report("A::test_y", "call", "passed"),
                          report("A::test_z", "setup", "skipped", "no GPU")])
    assert got == {"A::test_x": ("failed", "boom"), "A::test_y": ("passed", ""), "A::test_z": ("skipped", "no GPU")}


def test_a_regression_is_a_plain_pass_that_does_not_pass_attached(check):
    rope = "LlamaOutsideTest::test_model_rope_scaling_frequencies"
    plain = {"A::test_a": ("passed", ""), "A::test_b": ("passed", ""), "A::test_c": ("failed", "x"),
             rope: ("passed", "")}
    other = {"A::test_a": ("passed", ""), "A::test_b": ("skipped", "why"), "A::test_c": ("failed", "x"),
             rope: ("skipped", "no RoPE module")}
    assert check.regressions(plain, other, own=False) == [("A::test_b", "skipped", "why")]
    # the model's own scheme is excused nothing: RoPE's numbers must be the model's
    assert check.regressions(plain, other, own=True) == [("A::test_b", "skipped", "why"),
                                                          (rope, "skipped", "no RoPE module")]
    assert check.regressions(plain, {}, own=True)[0] == ("A::test_a", "missing", "not collected")


def fake_sdist(path: Path, common: str | None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in {"transformers-0.0/tests/test_modeling_common.py": common,
                           "transformers-0.0/README.md": "x"}.items():
            if text is not None:
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


# a stand-in for transformers' common tests: the mixin API families.py uses, two tests that see the method
STAND_IN = '''
import torch
def ids_tensor(shape, vocab_size):
    return torch.randint(0, vocab_size - 1, shape)
def random_attention_mask(shape):
    return torch.ones(shape, dtype=torch.long)
class ModelTesterMixin:
    def test_forward(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        for cls in self.all_model_classes:
            cls(config).eval()(**inputs)
    def test_model_rope_scaling_frequencies(self):
        self._rope_is_the_models()
    def test_rope_is_the_models_own(self):
        self._rope_is_the_models()
    def _rope_is_the_models(self):
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        model = self.all_model_classes[0](config)
        rope = getattr(model.base_model, "rotary_emb", None)
        assert rope is None or "RotaryEmbedding" in type(rope).__name__
'''


def test_the_check_end_to_end_on_a_stand_in(check, tmp_path, capsys):
    """plain and diet-rel runs of the stand-in through the real hook: diet-rel replaces RoPE, so the test
    reading the RoPE module fails: a regression, except under its excluded name."""
    sdist = fake_sdist(tmp_path / "transformers-0.0.tar.gz", STAND_IN)
    out = tmp_path / "out.json"
    code = check.main(["--sdist", str(sdist), "--runs", "plain,diet-rel", "--json", str(out), "-k", "Llama"])
    text = capsys.readouterr().out
    runs = json.loads(out.read_text())["runs"]
    assert runs["plain"]["outcomes"]["LlamaOutsideTest::test_rope_is_the_models_own"][0] == "passed"
    assert runs["diet-rel"]["outcomes"]["LlamaOutsideTest::test_rope_is_the_models_own"][0] == "failed"
    assert runs["diet-rel"]["outcomes"]["LlamaOutsideTest::test_forward"][0] == "passed"
    assert runs["diet-rel"]["outcomes"]["LlamaOutsideTest::test_model_rope_scaling_frequencies"][0] == "failed"
    assert code == 1
    assert "diet-rel: LlamaOutsideTest::test_rope_is_the_models_own passes plain, failed attached" in text
    assert "test_model_rope_scaling_frequencies passes plain" not in text
    assert "| llama | diet-rel | 1 | 2 | 0 |" in text and "hf_outside: FAILED: 1 test(s)" in text


def test_an_sdist_without_the_common_tests_is_refused(check, tmp_path):
    with pytest.raises(RuntimeError, match="holds no tests/test_modeling_common.py"):
        check.assemble(fake_sdist(tmp_path / "t.tar.gz", None), tmp_path / "hf")


def test_no_network_is_said_in_one_line(check, tmp_path, monkeypatch, capsys):
    """pip pointed at an index that refuses connections: Offline, and main skips saying so (exit 0)."""
    for var, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "",
                       "PIP_FIND_LINKS": ""}.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(check.Offline):
        check.download_sdist("0.0.1", tmp_path)
    assert not list(tmp_path.glob("*.tar.gz"))

    def offline(version, cache):
        raise check.Offline("Connection refused")

    monkeypatch.setattr(check, "download_sdist", offline)
    assert check.main(["--cache", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hf_outside: skipped:") and out.count("\n") == 1


def test_runs_must_include_the_plain_reference(check):
    with pytest.raises(SystemExit):
        check.parse_args(["--runs", "own,diet-rel"])


def test_a_missing_test_dependency_is_named(check, tmp_path, monkeypatch):
    common = tmp_path / "test_modeling_common.py"
    common.write_text("import pytest\nfrom parameterized import parameterized\n")
    monkeypatch.setattr(check.importlib.util, "find_spec", lambda name: None if name == "parameterized" else True)
    assert check.missing_modules(common) == ["parameterized"]
