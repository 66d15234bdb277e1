"""`position_scale`: a scale on `sinusoidal`'s input sinusoids, validated by DietConfig."""

import pytest
import torch

from dietpe import DietConfig, DietModel
from dietpe.errors import ConfigError


def tiny(**kw):
    return DietConfig.from_preset("bert-tiny", vocab_size=30, max_position_embeddings=16, **kw)


def test_the_scale_multiplies_the_sinusoids_only():
    a = DietModel(tiny(position="sinusoidal")).positions.method
    b = DietModel(tiny(position="sinusoidal", position_scale=0.03)).positions.method
    pos = torch.arange(10)[None]
    torch.testing.assert_close(b.embed(pos), 0.03 * a.embed(pos))
    torch.testing.assert_close(b.position_table(10), 0.03 * a.position_table(10))
    assert tiny(position="sinusoidal", position_scale=0.03).to_dict()["position_scale"] == 0.03


@pytest.mark.parametrize("kw", [dict(position="sinusoidal", position_scale=0), dict(position="sinusoidal",
                                position_scale=float("inf")), dict(position="sinusoidal", position_scale=True),
                                dict(position="absolute", position_scale=0.5)])
def test_bad_scales_are_refused(kw):
    with pytest.raises(ConfigError, match="position_scale"):
        tiny(**kw)
