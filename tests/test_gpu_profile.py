"""The GPU profile script's variants, checked without a GPU: `/jit` and `/score` after a method run its step
with the kernels launched through Triton and the offset tables read per score, and nothing else is accepted."""


import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def profile_script():
    return load_script("scripts/gpu_profile.py", "gpu_profile")


def test_suffixes_are_parsed_and_checked(profile_script):
    assert profile_script._parse("diet-rel@fused") == ("diet-rel@fused", set())
    assert profile_script._parse("diet-rel+seg@fused/score/jit") == ("diet-rel+seg@fused", {"score", "jit"})
    with pytest.raises(SystemExit, match="unknown suffix \\['fast'\\]; allowed: jit, score"):
        profile_script._parse("fire@fused/fast")
    for label in profile_script.METHODS.split(","):
        profile_script._parse(label)


def test_a_variant_runs_its_step_under_its_settings(profile_script):
    pytest.importorskip("triton")
    from dietpe.attention.kernels import attention, launch

    seen = []

    def step():
        seen.append((attention.current_table_read(), launch.cached()))
    plain = profile_script._variant(step, set())
    assert plain is step
    profile_script._variant(step, {"score"})()
    profile_script._variant(step, {"jit", "score"})()
    step()
    default_launch = seen[-1][1]
    assert seen[0] == ("score", default_launch)
    assert seen[1] == ("score", False)
    assert seen[2][0] == attention._table_read_setting()[0]  # restored after the step
