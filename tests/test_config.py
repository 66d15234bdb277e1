import pytest

from dietpe import ConfigError, DietCausalConfig, DietConfig
from dietpe.config import POSITIONS
from dietpe.positions.registry import FIELDS, REGISTRY, users


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


@pytest.mark.parametrize("position", POSITIONS)
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


@pytest.mark.parametrize("field", list(FIELDS))
def test_a_method_field_is_checked_and_refused_where_its_method_is_absent(field):
    owners = users(field)
    with pytest.raises(ConfigError, match=f"{field}='x' "):  # every field's own check refuses text
        DietConfig(position=owners[0], **{field: "x"})
    other = next(p for p in POSITIONS if p not in owners)
    default = FIELDS[field].default
    # a valid non-default value (T5's range must exceed its 8 exact buckets)
    value = (not default) if isinstance(default, bool) else (9 if field == "t5_max_distance" else 7)
    assert getattr(DietConfig(position=owners[0], **{field: value}), field) == value
    with pytest.raises(ConfigError, match=f"{field}={value!r} only applies to .*{owners[-1]!r}.*not {other!r}"):
        DietConfig(position=other, **{field: value})


def test_a_shared_field_is_declared_once_by_its_owner():
    assert users("t5_num_buckets") == ("t5", "tupe-r")
    declared = [f for m in REGISTRY.values() for f in m.fields]
    assert all(f is FIELDS[f.name] for f in declared)  # one Field object per name, whoever reads it


def test_method_cross_checks_come_from_the_method():
    with pytest.raises(ConfigError, match="position='rotary' needs an even head size, got 3"):
        DietConfig(position="rotary", hidden_size=12, num_attention_heads=4)
    assert DietConfig(position="t5", hidden_size=12, num_attention_heads=4).head_size == 3


def test_a_saved_config_loads_whatever_fields_of_other_methods_it_holds():
    saved = {**DietConfig(position="absolute").to_dict(), "shaw_max_distance": 3, "t5_num_buckets": 8}
    again = DietConfig.from_dict(saved)
    assert again.position == "absolute" and again.shaw_max_distance == 16 and again.t5_num_buckets == 32
    kept = DietConfig.from_dict({**saved, "position": "t5"})
    assert kept.t5_num_buckets == 8  # the method's own field is read as saved


def test_the_causal_lm_has_its_own_default_for_a_method_field():
    from dietpe import DietCausalConfig

    assert DietCausalConfig(position="tupe-r").tupe_reset is False
    assert DietCausalConfig(position="t5").tupe_reset is False
    with pytest.raises(ConfigError, match="tupe_reset=True only applies to position in 'tupe-a', 'tupe-r'"):
        DietCausalConfig(position="t5", tupe_reset=True)


@pytest.mark.parametrize("position", ["t5", "tupe-r"])
def test_t5_buckets_that_cannot_be_spaced_are_refused(position):
    """Below 4 buckets there is no exact one (a division by zero); a max distance at or below the exact buckets
    makes the log spacing's divisor 0 or negative (bucket ids outside the table, or wrapping into others)."""
    for fields, message in ((dict(t5_num_buckets=2), "no exact bucket"), (dict(t5_max_distance=8), "must exceed"),
                            (dict(t5_max_distance=4), "must exceed")):
        with pytest.raises(ConfigError, match=message):
            DietConfig(position=position, **fields)
    DietConfig(position=position, t5_max_distance=9)
    with pytest.raises(ConfigError, match="in causal attention"):
        DietCausalConfig(position="t5", t5_max_distance=16)
