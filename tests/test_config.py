import pytest

from dietpe import ConfigError, DietConfig


@pytest.mark.parametrize("field,value,allowed", [
    ("position", "relative", "'diet-rel'"),
    ("segment", "per_head", "'per-head'"),
    ("sharing", "all", "'layer'"),
    ("attention", "performer", "'linformer'"),
    ("attn_backend", "cuda", "'flex'"),
])
def test_unknown_names_list_allowed_values(field, value, allowed):
    with pytest.raises(ConfigError, match=f"{field}='{value}' is not one of .*{allowed}"):
        DietConfig(**{field: value})


@pytest.mark.parametrize("kwargs,message", [
    (dict(position="absolute", sharing="layer"), "sharing='layer' shares DIET's per-head parameters"),
    (dict(position="diet-rel", attention="linformer"), "key positions no longer exist"),
    (dict(position="diet-abs", segment="per-head", attention="linformer"), "projected keys have no segment"),
    (dict(position="t5", position_rank=8), "position_rank=8 only applies to position='diet-abs'"),
    (dict(hidden_size=100, num_attention_heads=3), "not divisible"),
    (dict(num_hidden_layers=0), "must be a positive integer"),
])
def test_nonsensical_combinations_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DietConfig(**kwargs)


def test_sharing_applies_to_per_head_segments_alone():
    assert DietConfig(position="t5", segment="per-head", sharing="layer").sharing == "layer"


def test_unknown_preset():
    with pytest.raises(ConfigError, match="preset='bert-huge'"):
        DietConfig.from_preset("bert-huge")


def test_round_trip_dict():
    cfg = DietConfig.from_preset("bert-mini", position="tupe-r", tupe_reset=False)
    again = DietConfig.from_dict(cfg.to_dict())
    assert again.position == "tupe-r" and again.tupe_reset is False and again.hidden_size == 256


@pytest.mark.parametrize("position", ["absolute", "t5", "alibi", "diet-abs", "diet-rel"])
def test_a_method_name_means_the_same_model_in_python_and_in_a_spec(position):
    from dietpe.methods import parse_method

    assert DietConfig(position=position).segment == parse_method(position).segment
    assert DietConfig(position="diet-rel").segment == "per-head"


def test_an_explicit_segment_survives_save_and_load(tmp_path):
    DietConfig(position="diet-rel", segment="input").save_pretrained(tmp_path)
    assert DietConfig.from_pretrained(tmp_path).segment == "input"


@pytest.mark.parametrize("field,value", [
    ("hidden_dropout_prob", 1.0), ("hidden_dropout_prob", -0.1), ("attention_probs_dropout_prob", 1.5),
    ("classifier_dropout", 2), ("hidden_dropout_prob", "0.1"), ("layer_norm_eps", 0), ("initializer_range", -1),
    ("type_vocab_size", -1),
])
def test_the_python_api_refuses_what_the_command_line_refuses(field, value):
    with pytest.raises(ConfigError, match=f"{field}="):
        DietConfig(**{field: value})
