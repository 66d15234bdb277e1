"""DIET-REL's range: the paper's unclipped table in an encoder, half the model's length in causal attention."""

import pytest
import torch

from dietpe import DietCausalConfig, DietConfig, DietForCausalLM, attach
from dietpe.errors import ConfigError

SIZES = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
             max_position_embeddings=32)


def test_the_encoder_keeps_the_papers_unclipped_table():
    config = DietConfig(position="diet-rel", **SIZES)
    assert config.diet_rel_max_distance is None
    from dietpe import DietModel
    assert DietModel(config).positions.method.span == 31  # every offset of 32 positions


def test_causal_attention_clips_at_half_the_length_unless_told():
    assert DietCausalConfig(position="diet-rel", **SIZES).diet_rel_max_distance == 16
    assert DietCausalConfig(position="diet-rel", diet_rel_max_distance=None, **SIZES).diet_rel_max_distance is None
    assert DietCausalConfig(position="diet-rel", diet_rel_max_distance=5, **SIZES).diet_rel_max_distance == 5
    lm = DietForCausalLM(DietCausalConfig(position="diet-rel", **SIZES))
    assert lm.diet.positions.method.span == 16 and lm.diet.positions.method.r.shape[-1] == 33


def test_a_saved_causal_config_loads_with_the_range_it_was_built_with(tmp_path):
    for given, expected in (({}, 16), ({"diet_rel_max_distance": None}, None), ({"diet_rel_max_distance": 7}, 7)):
        DietCausalConfig(position="diet-rel", **given, **SIZES).save_pretrained(tmp_path)
        assert DietCausalConfig.from_pretrained(tmp_path).diet_rel_max_distance == expected
    # a config written before the causal default names None, as every one did: its model loads as trained
    DietCausalConfig(position="diet-rel", diet_rel_max_distance=None, **SIZES).save_pretrained(tmp_path)
    model = DietForCausalLM(DietCausalConfig.from_pretrained(tmp_path))
    assert model.diet.positions.method.span == 31


def test_the_clipped_default_is_the_reference_beyond_half_the_length():
    """Offsets past the clip read the edge of R: the logits of a 32-token causal input equal R[clip(i - j)]."""
    torch.manual_seed(0)
    lm = DietForCausalLM(DietCausalConfig(position="diet-rel", attn_backend="eager", hidden_dropout_prob=0.0,
                                          attention_probs_dropout_prob=0.0, **SIZES)).eval()
    method = lm.diet.positions.method
    with torch.no_grad():
        method.r.normal_()
    ids = torch.randint(1, 40, (1, 32))
    out = lm(ids, output_attentions=True, output_hidden_states=True)
    layer, h = lm.diet.layers[0].attention, out.hidden_states[0]
    with torch.no_grad():
        q = layer.query(h).view(1, 32, 2, 8).transpose(1, 2)
        k = layer.key(h).view(1, 32, 2, 8).transpose(1, 2)
        for head in range(2):
            for i in (31, 20):
                logits = torch.stack([method.reference_logit(lm.config, q[0, head, i], k[0, head, j], i, j, 0, head)
                                      for j in range(i + 1)])
                torch.testing.assert_close(out.attentions[0][0, head, i, :i + 1], logits.softmax(-1),
                                           atol=1e-5, rtol=1e-4)
        edge = method.logit("r")[0, 0, -1]
        bias = [method.reference_logit(lm.config, torch.zeros(8), torch.zeros(8), 31, j, 0, 0) for j in (0, 15, 16)]
    assert bias[0] == bias[1] == edge and bias[2] != edge  # offsets 31 and 16 share the edge, 15 has its own


def test_attached_to_a_decoder_the_range_follows_its_length():
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama():
        return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))

    assert attach(llama(), "diet-rel").model.diet_positions.config.diet_rel_max_distance == 32
    unclipped = attach(llama(), "diet-rel:diet_rel_max_distance=none")
    assert unclipped.model.diet_positions.config.diet_rel_max_distance is None


def test_a_field_the_causal_method_does_not_read_is_still_refused():
    with pytest.raises(ConfigError, match="diet_rel_max_distance=5 only applies to position='diet-rel'"):
        DietCausalConfig(position="alibi", diet_rel_max_distance=5, **SIZES)
