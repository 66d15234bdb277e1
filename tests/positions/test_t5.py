"""T5's default range: half the model's length, at most T5's own 128, never below the bucket count."""

import pytest

from dietpe import DietCausalConfig, DietConfig, DietForCausalLM
from dietpe.positions.t5 import t5_range


@pytest.mark.parametrize("length, expected", [(512, 128), (2048, 128), (128, 64), (64, 32), (40, 32)])
def test_default_range_follows_the_length(length, expected):
    config = DietConfig(position="t5", max_position_embeddings=length, hidden_size=32, num_attention_heads=4,
                        num_hidden_layers=1, intermediate_size=32, vocab_size=20)
    assert config.t5_max_distance is None
    assert t5_range(config) == expected


def test_a_given_range_and_a_saved_one_are_kept(tmp_path):
    sizes = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=32, vocab_size=20,
                 max_position_embeddings=128)
    given = DietCausalConfig(position="t5", t5_max_distance=128, **sizes)
    assert t5_range(given) == 128
    model = DietForCausalLM(given)
    model.save_pretrained(tmp_path)
    loaded = DietForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.t5_max_distance == 128
    assert loaded.diet.positions.method.max_distance == 128
    default = DietForCausalLM(DietCausalConfig(position="tupe-r", tupe_reset=False, **sizes))
    assert default.config.t5_max_distance is None
    assert default.diet.positions.method.max_distance == 64  # TUPE-R's buckets follow the same rule
