"""The named method lists are the papers' tables, row by row (DIET Tables 2-5, 8, 9; TUPE Table 1 and §4.3).

Each table is transcribed here from the paper as (position, segment, sharing, d_p) per row; the list's specs
must build exactly those models."""

import pytest

from dietpe.methods import METHOD_LISTS, parse_method, parse_methods
from dietpe.tasks.recipes import build_config


def row(spec: str) -> tuple:
    """(position, segment, sharing, d_p or None, other fields) of a spec at bert-base."""
    m = parse_method(spec)
    c = build_config(m, "bert-base", 30000, 128, 0, 512)
    extra = {k: v for k, v in m.extra if k != "position_rank"}
    return m.position, c.segment, c.sharing, (c.rank if m.position == "diet-abs" else None), extra


def rows(name: str) -> list[tuple]:
    return [row(spec) for spec in METHOD_LISTS[name]]


LIN = {"attention": "linformer", "linformer_k": 32}

# DIET Table 2 (Position, Segment columns), Table 4's Vaswani et al. row
PAPERS = [
    ("absolute", "input", "none", None, {}),                            # Devlin et al.
    ("shaw", "input", "none", None, {"shaw_max_distance": 1024}),       # Shaw et al.: per-head / input
    ("t5", "input", "none", None, {}),                                  # Raffel et al.
    ("tupe-r", "input", "none", None, {}),                              # Ke et al.
    ("diet-rel", "input", "none", None, {}),                            # DIET-REL per-head / input
    ("diet-rel", "per-head", "none", None, {}),                         # DIET-REL per-head / per-head
    ("diet-abs", "per-head", "layer", 128, {}),                         # DIET-ABS (dp=128, share)
    ("absolute", "input", "none", None, LIN),                           # Wang et al. (dp=32)
    ("diet-abs", "input", "none", 32, LIN),                             # DIET-ABS-LIN (dp=32): per-head / input
    ("sinusoidal", "input", "none", None, {}),                          # Vaswani et al. (Table 4)
]
# DIET Table 5: Model, Sharing, Segment
TABLE5 = [
    ("diet-rel", "input", "none", None, {}), ("diet-rel", "input", "head", None, {}),
    ("diet-rel", "input", "layer", None, {}), ("diet-rel", "per-head", "none", None, {}),
    ("diet-rel", "per-head", "head", None, {}), ("diet-rel", "per-head", "layer", None, {}),
    ("diet-abs", "input", "none", 64, {}), ("diet-abs", "per-head", "none", 64, {}),
    ("diet-abs", "per-head", "none", 128, {}), ("diet-abs", "per-head", "none", 512, {}),
    ("diet-abs", "input", "layer", 64, {}), ("diet-abs", "per-head", "layer", 64, {}),
    ("diet-abs", "per-head", "layer", 128, {}), ("diet-abs", "per-head", "layer", 256, {}),
    ("diet-abs", "per-head", "layer", 512, {}),
]
# DIET Table 8: Position, Segment (appendix D)
TABLE8 = [
    ("absolute", "input", "none", None, {}), ("diet-rel", "input", "none", None, {}),
    ("diet-rel", "per-head", "none", None, {}), ("diet-abs", "input", "none", 64, {}),
    ("diet-abs", "per-head", "none", 64, {}), ("diet-abs", "per-head", "layer", 64, {}),
    ("diet-abs", "per-head", "layer", 128, {}),
]
# DIET Table 9: Sharing (segments per head: its unshared rows score as Table 8's per-head rows)
TABLE9 = [
    ("diet-rel", "per-head", "none", None, {}), ("diet-rel", "per-head", "layer", None, {}),
    ("diet-rel", "per-head", "head", None, {}), ("diet-abs", "per-head", "none", 64, {}),
    ("diet-abs", "per-head", "none", 128, {}), ("diet-abs", "per-head", "layer", 64, {}),
    ("diet-abs", "per-head", "layer", 128, {}),
]
# TUPE Table 1 and §4.3: BERT-A, BERT-R, TUPE-A, TUPE-R, TUPE-A^tie-cls, BERT-A^d
TUPE = [
    ("absolute", "input", "none", None, {}), ("t5", "input", "none", None, {"input_positions": True}),
    ("tupe-a", "input", "none", None, {}), ("tupe-r", "input", "none", None, {}),
    ("tupe-a", "input", "none", None, {"tupe_reset": False}), ("bert-ad", "input", "none", None, {}),
]


@pytest.mark.parametrize("name, expected", [("papers", PAPERS), ("table5", TABLE5), ("table8", TABLE8),
                                            ("table9", TABLE9), ("tupe", TUPE), ("linformer", PAPERS[7:9])])
def test_each_list_is_its_tables_rows(name, expected):
    assert rows(name) == expected
    assert len(parse_methods(name)) == len(expected)  # what `dietpe compare --methods NAME` trains


def test_bert_r_is_absolute_input_positions_and_t5s_bias_over_128():
    """TUPE's BERT-R: BERT's input positions and T5's per-head buckets, shared by layers, range 128 (TUPE's t)
    at the papers' 512 rows."""
    from dietpe.models.modeling import DietModel
    from dietpe.positions.t5 import t5_range

    c = build_config(parse_method("t5:input_positions=true"), "bert-tiny", 50, 128, 0, 512)
    model = DietModel(c)
    assert model.positions.input_positions.weight.shape == (512, c.hidden_size)
    assert t5_range(c) == 128 and model.positions.method.bias.shape == (c.num_attention_heads, 32)


def test_lists_combine_and_shared_rows_are_trained_once():
    names = [m.name for m in parse_methods("papers,tupe")]
    assert len(names) == len(set(names)) == len(PAPERS) + len(TUPE) - 2  # absolute, tupe-r in both
    with pytest.raises(Exception, match="listed twice"):
        parse_methods("diet-rel,diet-rel")


def test_a_bench_row_label_is_a_spec_of_the_same_model():
    from dietpe.bench.cost import Variant, model_config
    from dietpe.errors import ConfigError

    # `dietpe bench` names rows diet-rel+seg@fused; training that label builds the model the bench timed
    for label in ("diet-rel+seg", "diet-abs+seg@fused", "t5@sdpa", "alibi@eager"):
        variant, method = Variant.parse(label), parse_method(label)
        timed = model_config("bert-tiny", variant).to_dict()
        trained = build_config(method, "bert-tiny", timed["vocab_size"], 512, 0).to_dict()
        for key in ("position", "segment", "attn_backend"):
            assert trained[key] == timed[key], (label, key)
    assert parse_method("diet-rel+seg") == parse_method("diet-rel:segment=per-head")
    # a bench row without +seg takes input segments; a spec takes the papers' row (per-head for DIET)
    assert Variant.parse("diet-rel").segment == "input" and parse_method("diet-rel").segment == "per-head"
    assert parse_method("diet-rel+seg:sharing=layer").name == "diet-rel:sharing=layer"
    assert parse_method("diet-rel@fused").name == "diet-rel:attn_backend=fused"
    for twice in ("diet-rel+seg:segment=input", "t5@fused:attn_backend=sdpa", "diet-rel:sharing=layer:sharing=head",
                  "diet-abs:position_rank=4:position-rank=8"):  # the last would win, silently
        with pytest.raises(ConfigError, match="twice"):
            parse_method(twice)
    with pytest.raises(ConfigError, match="attn_backend='nope'"):
        parse_method("diet-rel@nope")
