"""The per-forward objects of DIET-REL, DIET-ABS, T5, KERPLE and ALiBi kept between forwards that build no
autograd graph (DIET §3.1, on any device): the same outputs, to the bit, as a model that builds them afresh and
as a forward that keeps nothing, after any change to the parameters (fused AdamW, which bumps no version
counter, edits through `.data`, a new tensor in their place, a loaded state dict), at alternating lengths and
modes, on every backend; nothing a forward built on them held after it; never kept in training."""

import copy
import io

import pytest
import torch

from dietpe import DietForMaskedLM
from dietpe.attention.kernels import triton_problem
from dietpe.positions.method import forward_key
from tests.conftest import batch, tiny

BACKENDS = ["eager", "sdpa"] + (["fused"] if triton_problem() is None else [])


#: each method and the parameter its kept objects read
SOURCES = {"diet-rel": "r", "t5": "bias", "kerple": "r1", "diet-abs": "p_q"}


def _model(backend="eager", position="diet-rel", **overrides):
    torch.manual_seed(0)
    # DIET-ABS at heads of 16: the fused kernel reads its factors as the head's second part
    head = 16 if position == "diet-abs" else 8
    return DietForMaskedLM(tiny(head, position=position, attn_backend=backend, **overrides)).eval()


def _source(model):
    method = model.diet.positions.method
    return getattr(method, SOURCES[method.name])


def _fresh(model, ids, mask, seg):
    """What a model that keeps nothing gives: a new model with the same weights."""
    other = DietForMaskedLM(model.config).eval()
    other.load_state_dict(model.state_dict())
    return other(ids, attention_mask=mask, token_type_ids=seg).logits


def _kept(model):
    kept = model.diet.positions.method.__dict__.get("_forward_kept")
    return None if kept is None else kept.value


def _same(model, ids, mask, seg):
    out = model(ids, attention_mask=mask, token_type_ids=seg).logits
    torch.testing.assert_close(out, _fresh(model, ids, mask, seg), rtol=0, atol=0)
    # the path that keeps nothing: the same bits (sdpa on the CPU runs other kernels with a gradient to track)
    exact = model.config.attn_backend != "sdpa"
    with torch.inference_mode(False), torch.enable_grad():
        torch.testing.assert_close(out, model(ids, attention_mask=mask, token_type_ids=seg).logits.detach(),
                                   rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6)
    assert out.shape[1] == ids.shape[1]


@pytest.mark.parametrize("position", SOURCES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [None, 1.0])  # the default logit scale (a buffer refilled) and 1 (views of R)
def test_kept_forward_matches_a_fresh_build_after_every_change_to_r(backend, scale, position):
    model = _model(backend, position, **({} if scale is None else {"logit_scale": scale}))
    r = _source(model)
    ids, mask, seg = batch(9)
    with torch.no_grad():
        _same(model, ids, mask, seg)
        kept = _kept(model)
        assert kept is not None
        _same(model, ids, mask, seg)
        assert _kept(model) is kept  # reused, not rebuilt
        r.data.add_(0.25)  # through .data: no version counter moves
        _same(model, ids, mask, seg)
        r.data = r.data * 2  # a new tensor in R's place
        _same(model, ids, mask, seg)
        assert _kept(model) is not kept  # its address changed: built again
        model.load_state_dict(_model(backend, position).state_dict())
        _same(model, ids, mask, seg)
    model.train()
    assert _kept(model) is None  # training lets go of it
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)  # updates without bumping versions
    model(ids, attention_mask=mask, token_type_ids=seg, labels=ids).loss.backward()
    opt.step()
    model.eval()
    with torch.inference_mode():
        _same(model, ids, mask, seg)
        kept = _kept(model)
        opt.step()  # outside: R changes again, through the kernel
        _same(model, ids, mask, seg)
        assert _kept(model) is kept


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("position", [*SOURCES, "alibi"])
def test_kept_forward_follows_lengths_and_modes(backend, position):
    clip = dict(diet_rel_max_distance=4) if position == "diet-rel" else {}  # clipped: gathered, not a view
    model = _model(backend, position, **clip)
    ids, mask, seg = batch(12)
    for n, mode in [(12, torch.no_grad), (7, torch.no_grad), (12, torch.inference_mode), (12, torch.no_grad),
                    (7, torch.inference_mode)]:
        for _ in range(2):  # kept from the first, R changed before the second (what was built on R is stale)
            with mode():
                _same(model, ids[:, :n], mask[:, :n], seg[:, :n])
            if position in SOURCES:  # ALiBi has no parameter: its table is kept whole
                _source(model).data.add_(0.25)
    with torch.no_grad():  # positions the model cannot know without reading them: nothing kept for them
        model.diet.positions.method.__dict__.pop("_forward_kept")
        model(ids, attention_mask=mask, token_type_ids=seg, position_ids=torch.arange(12) + 1)
        assert _kept(model) is None
    out = model(ids, attention_mask=mask, token_type_ids=seg).logits  # a graph to build: nothing kept
    assert _kept(model) is None
    out.float().square().mean().backward()
    if position in SOURCES:
        assert _source(model).grad.abs().sum() > 0


@pytest.mark.parametrize("position", [*SOURCES, "alibi"])
def test_a_kept_forward_holds_nothing_a_forward_built_on_it(position):
    """The dense forms and the (Lq, Lk) index a forward builds go when it ends, as a forward's own terms do."""
    model = _model("sdpa", position)
    ids, mask, seg = batch(9)
    with torch.no_grad():
        model(ids, attention_mask=mask, token_type_ids=seg)
    kept = _kept(model)
    per_layer = position in ("diet-rel", "diet-abs")
    terms = [layer.logits[0] for layer in kept.layers] if per_layer else [kept.term]
    assert len(terms) == (model.config.num_hidden_layers if per_layer else 1)
    for term in terms:
        assert term._dense is None and not isinstance(getattr(term, "_index", None), torch.Tensor)
        # ALiBi keeps its kernel's table (constants), built by no forward here: sdpa reads the dense form
        assert not term._per_forward


def test_nothing_is_kept_while_compiling_or_building_a_graph(monkeypatch):
    """The buffer R × logit_scale is refilled by each forward: a graph captured reading it would read freed
    memory once a new length replaced it."""
    model = _model()
    method = model.diet.positions.method
    ctx = model.diet.positions.context(torch.arange(9), torch.arange(9), None, starts=(0, 0))
    with torch.no_grad():
        assert forward_key(ctx, (method.r,), 1.0) is not None
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert forward_key(ctx, (method.r,), 1.0) is None
    monkeypatch.undo()
    assert forward_key(ctx, (method.r,), 1.0) is None  # a graph to build


@pytest.mark.parametrize("position", [*SOURCES, "alibi"])
def test_a_model_that_kept_a_forward_pickles_and_copies_without_it(position):
    model = _model("eager", position)
    ids, mask, seg = batch(9)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, token_type_ids=seg).logits
    assert _kept(model) is not None
    buffer = io.BytesIO()
    torch.save(model, buffer)  # the whole module pickled: the kept objects hold closures
    buffer.seek(0)
    for other in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
        assert _kept(other) is None
        with torch.no_grad():
            torch.testing.assert_close(other(ids, attention_mask=mask, token_type_ids=seg).logits, expected,
                                       rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("position", ["diet-rel", "diet-abs"])
def test_kept_per_head_segments_read_each_forwards_ids(backend, position):
    """The per-head segment terms are kept with their table's slices, and take each forward's ids (another
    batch size too)."""
    model = _model(backend, position, segment="per-head")
    segments = model.diet.positions.head_segments
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        kept = None
        for size in (2, 2, 3, 2):
            ids, mask, _ = batch(9, batch_size=size)
            seg = torch.randint(0, 2, (size, 9), generator=generator)
            _same(model, ids, mask, seg)
            now = segments.__dict__["_forward_kept"].value
            assert kept is None or now is kept
            kept = now
            segments.table.data.add_(0.25)  # read afresh from the refilled buffer
    assert all(layer.logits[0].q_segments is None for layer in kept.layers if layer is not None)  # let go


@pytest.mark.parametrize("position", ["diet-rel", "diet-abs", "t5"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forward_inside_another_uses_its_own_objects(backend, position):
    """Two forwards at once on one model (threads serving inference; here one run inside another's first layer):
    the second finds the kept objects in use and builds its own, so neither reads the other's segment ids, nor
    loses its objects when the other ends."""
    model = _model(backend, position, segment="per-head")
    ids, mask, seg = batch(9)
    other_ids, other_seg = ids.flip(0), 1 - seg
    layer, inner = model.diet.layers[0], []
    forward = layer.forward

    def interleaved(*args, **kwargs):
        if not inner:
            inner.append(None)  # the inner forward's own first layer runs as usual
            inner[0] = model(other_ids, attention_mask=mask, token_type_ids=other_seg).logits
        return forward(*args, **kwargs)

    with torch.no_grad():
        model(ids, attention_mask=mask, token_type_ids=seg)  # objects kept, now free
        layer.forward = interleaved
        out = model(ids, attention_mask=mask, token_type_ids=seg).logits
        layer.forward = forward
        torch.testing.assert_close(out, _fresh(model, ids, mask, seg), rtol=0, atol=0)
        torch.testing.assert_close(inner[0], _fresh(model, other_ids, mask, other_seg), rtol=0, atol=0)
        kept = _kept(model)
        _same(model, ids, mask, seg)  # free again: reused
        assert _kept(model) is kept


def test_a_forward_that_raises_frees_the_kept_objects(monkeypatch):
    """A layer that raises ends the forward: its context is released all the same, so the next forward reuses
    the kept objects (rather than finding them claimed while the exception's traceback holds the context)."""
    model = _model("eager", "diet-rel", segment="per-head")
    ids, mask, seg = batch(9)
    layer = model.diet.layers[1]
    with torch.no_grad():
        model(ids, attention_mask=mask, token_type_ids=seg)
        kept = _kept(model)
        monkeypatch.setattr(layer, "forward", lambda *a, **k: 1 / 0)
        with pytest.raises(ZeroDivisionError) as raised:
            model(ids, attention_mask=mask, token_type_ids=seg)
        monkeypatch.undo()
        starts, start = [], type(kept).start
        monkeypatch.setattr(type(kept), "start", lambda self, ctx: starts.append(1) or start(self, ctx))
        _same(model, ids, mask, seg)
        assert raised.value is not None and _kept(model) is kept and starts  # reused while the traceback lives
