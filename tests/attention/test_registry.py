"""The backend registry is open: a backend registered by name is an `attn_backend` every model can use, and
one that cannot serve a configuration is refused when the model is built, naming itself and the reason."""

import inspect

import pytest
import torch

from dietpe import ConfigError, DietConfig, DietForMaskedLM
from dietpe.attention import backends
from dietpe.attention.registry import (ALL_BACKENDS, AttentionBackend, AttentionBackends, AttentionFunction,
                                       backend_names, register_backend, resolve_backend, serving_backend)
from dietpe.positions.registry import REGISTRY
from tests.conftest import batch, tiny


@pytest.fixture
def registered():
    """Registers backends for one test and removes them after it."""
    names = []

    def register(name, fn, **kw):
        names.append(name)
        return register_backend(name, fn, **kw)

    yield register
    for name in names:
        AttentionBackends._global_mapping.pop(name, None)


def test_every_entry_is_a_named_backend_with_the_one_signature():
    want = list(inspect.signature(AttentionFunction.__call__).parameters)[1:]
    assert {"eager", "sdpa", "flex", "banded"} <= set(ALL_BACKENDS)
    for name in ALL_BACKENDS:
        backend = ALL_BACKENDS[name]
        assert isinstance(backend, AttentionBackend) and backend.name == name
        assert list(inspect.signature(backend.forward).parameters) == want, name
    assert backend_names() == ("auto", *ALL_BACKENDS)


def test_a_registered_backend_serves_models_and_computes_what_it_computes(registered):
    calls = []

    def counted_eager(q, k, v, terms, mask, scale, dropout_p, need_probs):
        calls.append(q.shape)
        return backends.eager(q, k, v, terms, mask, scale, dropout_p, need_probs)

    registered("counted", counted_eager, value_terms=True)
    ref = DietForMaskedLM(tiny(position="diet-rel", segment="per-head", attn_backend="eager")).eval()
    mine = DietForMaskedLM(tiny(position="diet-rel", segment="per-head", attn_backend="counted")).eval()
    mine.load_state_dict(ref.state_dict())
    ids, mask, seg = batch(9)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask, token_type_ids=seg).logits
        got = mine(ids, attention_mask=mask, token_type_ids=seg).logits
    torch.testing.assert_close(got, want)
    assert len(calls) == mine.config.num_hidden_layers
    assert "counted" in str(pytest.raises(ConfigError, DietConfig, attn_backend="nope").value)


def test_what_a_backend_cannot_serve_is_refused_at_build_time(registered):
    registered("plain", backends.sdpa)
    registered("no-dropout", backends.sdpa, dropout=False)
    with pytest.raises(ConfigError, match="attn_backend='plain' cannot serve position='shaw': the method's value "
                                          "term needs the attention probabilities; use attn_backend='eager'"):
        tiny(position="shaw", attn_backend="plain")
    with pytest.raises(ConfigError, match="attn_backend='no-dropout' cannot serve .*no attention dropout"):
        DietConfig(attn_backend="no-dropout", attention_probs_dropout_prob=0.1)
    DietConfig(attn_backend="no-dropout", attention_probs_dropout_prob=0.0)


def test_auto_picks_the_first_backend_that_serves():
    from dietpe.attention import fused

    auto = resolve_backend("auto", value_terms=False, dropout=0.1)
    assert (auto.name, auto.fallback.name) == ("fused", "sdpa")  # the kernel on CUDA, sdpa for what it declines
    assert auto.forward is fused.fused_long and ALL_BACKENDS["fused"].forward is fused.fused  # long calls only
    assert resolve_backend("auto", value_terms=False, method=REGISTRY["xlnet"]).name == "sdpa"
    assert resolve_backend("auto", value_terms=True, dropout=0.1).name == "banded"
    assert serving_backend("flex", value_terms=True).name == "banded"  # a model attached to before its method
    assert serving_backend("flex", value_terms=False).name == "flex"
    model = DietForMaskedLM(tiny(position="shaw"))
    assert {m.backend.name for m in model.modules() if hasattr(m, "backend")} == {"banded"}


def test_bad_registrations_are_refused():
    with pytest.raises(ConfigError, match="other than 'auto'"):
        register_backend("auto", backends.eager)
    with pytest.raises(ConfigError, match="not callable"):
        register_backend("x", 3)
    local = AttentionBackends()
    with pytest.raises(ConfigError, match="AttentionBackend named 'y'"):
        local["y"] = backends.eager
    local["y"] = AttentionBackend("y", backends.eager, value_terms=True)  # a local override, not global
    assert "y" in local and "y" not in ALL_BACKENDS
