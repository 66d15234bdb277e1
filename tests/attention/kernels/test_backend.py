"""`attn_backend="fused"` in the models: every method it serves gives the reference's outputs and gradients
(every parameter's, the position tables' included) with padding, per-head segments, causality, packed
documents and per-example position_ids; two training steps give the same bits; what it cannot serve is refused
(at build time for a method, per call for positions whose runs the mask does not separate); where "auto" lists
the kernel it runs sdpa for those calls and everywhere off CUDA; today's "auto" is sdpa (the kernel is slower
on the GPU measured: docs/gpu.md)."""

import dataclasses
import warnings

import pytest
import torch

from dietpe import ConfigError, DietConfig, DietModel
from dietpe.attention.masks import document_mask
from dietpe.attention.registry import ALL_BACKENDS, resolve_backend
from dietpe.errors import NotServed
from dietpe.models.causal import DietCausalModel
from dietpe.positions.registry import REGISTRY
from tests.attention.kernels.conftest import NO_TRITON, sizes
from tests.conftest import batch, tiny
from tests.models.test_causal import tiny_lm

pytest.importorskip("triton", reason=NO_TRITON)

L = sizes(13, 200)
#: the methods the kernel serves (read from the registry), each with DIET's per-head segments where it has them
SERVED = [(name, "per-head" if info.shareable else "input") for name, info in REGISTRY.items()
          if ALL_BACKENDS["fused"].refusal(value_terms=info.probabilities, dropout=0.0, method=info) is None]


def _randomise(model):
    positions = model.base_model.positions
    with torch.no_grad():  # position terms large enough that a wrong one shows
        for p in positions.parameters():
            p.copy_(torch.randn_like(p) / getattr(positions.method, "logit_scale", 1.0))
    return model


def _pair(make, device, **cfg):
    cfg.setdefault("max_position_embeddings", L + 8)  # learned absolute tables as long as the GPU's inputs
    ref = _randomise(make(attn_backend="eager", **cfg))
    fused = make(attn_backend="fused", **cfg)
    fused.load_state_dict(ref.state_dict())
    return ref.to(device), fused.to(device)


def _step(model, *args, **kwargs):
    """Outputs and every parameter's gradient, for a loss with real gradients: a fixed random projection."""
    model.zero_grad()
    out = model(*args, **kwargs).last_hidden_state
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    (out * w).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(got, want, atol=5e-5):
    torch.testing.assert_close(got[0], want[0], atol=atol, rtol=1e-4)
    assert got[1].keys() == want[1].keys()
    for name, g in want[1].items():
        torch.testing.assert_close(got[1][name], g, atol=atol * max(1.0, g.abs().max().item()), rtol=1e-4,
                                   msg=name)


def test_the_served_methods_are_the_tiled_ones():
    served = {name for name, _ in SERVED}
    assert {"none", "rotary", "t5", "tupe-a", "tupe-r", "diet-abs", "diet-rel", "alibi", "kerple", "fire"} <= served
    assert not served & {"xlnet", "shaw"}


@pytest.mark.parametrize("position,segment", SERVED)
def test_fused_matches_eager_with_gradients(position, segment, device):
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position=position, segment=segment,
                       num_hidden_layers=1)
    ids, mask, seg = batch(L, device=device)
    want, got = _step(ref, ids, mask, seg), _step(fused, ids, mask, seg)
    assert any(n.startswith("positions.") for n in want[1])
    _assert_same(got, want)


@pytest.mark.parametrize("position", ["diet-rel", "alibi", "tupe-a", "fire"])
def test_causal_lm_matches_eager(position, device):
    """Causality alone reaches the kernel as a flag (blocks above the diagonal skipped)."""
    ref, fused = _pair(lambda **kw: DietCausalModel(tiny_lm(position, **kw)), device, num_hidden_layers=1)
    ids = torch.randint(3, 40, (2, L + 4)).to(device)
    _assert_same(_step(fused, ids), _step(ref, ids))


@pytest.mark.parametrize("max_distance,view", [(None, True), (3, False)])
def test_diet_rel_reads_consecutive_columns_as_a_view(max_distance, view, device, monkeypatch):
    """Unclipped at the default positions, DIET-REL's diagonals read consecutive columns of R: the kernel's
    table is a slice of the parameter (no gather, no scatter-add in the backward); clipped, a gather. Both
    give the reference's outputs and gradients."""
    from dietpe.attention import fused as F

    plans = []
    real = F.plan
    monkeypatch.setattr(F, "plan", lambda terms, mask=None: plans.append(real(terms, mask)) or plans[-1])
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position="diet-rel", num_hidden_layers=2,
                       diet_rel_max_distance=max_distance)
    ids, mask, seg = batch(L, device=device)
    _assert_same(_step(fused, ids, mask, seg), _step(ref, ids, mask, seg))
    assert len(plans) == 2 and all(p.table is not None for p in plans)
    assert [p.table.values._base is not None for p in plans] == [view, view]  # a gather makes a new tensor


def test_the_kernel_reads_the_segment_table_not_its_factors(device, monkeypatch):
    """Per-head segments reach the kernel as their table: the low-rank factors sdpa folds (a gather and a
    one-hot per layer) are never built on the fused path; eager builds them."""
    from dietpe.positions.terms import SegmentBias

    calls = []
    factors = SegmentBias.factors
    monkeypatch.setattr(SegmentBias, "factors", lambda self: calls.append(1) or factors(self))
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position="diet-rel", segment="per-head",
                       num_hidden_layers=2)
    ids, mask, seg = batch(L, device=device)
    got = _step(fused, ids, mask, seg)
    assert calls == []
    want = _step(ref, ids, mask, seg)
    assert calls
    _assert_same(got, want)


@pytest.mark.parametrize("position,head_size", [("diet-abs", 16), ("tupe-a", 64), ("tupe-r", 64)])
def test_low_rank_factors_are_read_from_their_own_tensors(position, head_size, device, monkeypatch):
    """DIET-ABS's P_Q, P_K (rank = head size) and TUPE's correlation (rank Dh, its reset a table: below) reach
    the kernel as a second head part: q and k are never concatenated with them."""
    import dietpe.attention.fused as F

    calls, fold = [], F.fold_low_rank
    monkeypatch.setattr(F, "fold_low_rank", lambda q, k, terms, *a: calls.append(len(terms)) or fold(q, k, terms, *a))
    ref, fused = _pair(lambda **kw: DietModel(tiny(head_size, **kw)), device, position=position,
                       num_hidden_layers=1)
    ids, mask, seg = batch(L, device=device)
    got = _step(fused, ids, mask, seg)
    assert sum(calls) == 0
    _assert_same(got, _step(ref, ids, mask, seg))


@pytest.mark.parametrize("position", ["tupe-a", "tupe-r"])
def test_tupe_reset_reaches_the_kernel_as_a_table(position, device, monkeypatch):
    """TUPE's [CLS] reset reaches the kernel as a 2 × 2 table per head read at [CLS]'s ids, beside the rank-Dh
    correlation: the rank Dh + 2 factors that eager and sdpa read (θ as two more columns) are never built on the
    fused path; eager builds them, and the two agree, gradients included."""
    import dietpe.attention.fused as F
    from dietpe.positions.tupe import ResetCorrelation

    calls, segments = [], []
    factors, plan = ResetCorrelation.factors, F.plan
    monkeypatch.setattr(ResetCorrelation, "factors", lambda self: calls.append(1) or factors(self))
    monkeypatch.setattr(F, "plan", lambda *a: (lambda p: segments.append(p.segments) or p)(plan(*a)))
    ref, fused = _pair(lambda **kw: DietModel(tiny(64, **kw)), device, position=position, num_hidden_layers=2)
    ids, mask, seg = batch(L, device=device)
    got = _step(fused, ids, mask, seg)
    assert calls == [] and len(segments) == 2
    assert segments[0].table.shape == (fused.config.num_attention_heads, 2, 2)
    assert segments[0].q_ids.tolist() == [[1] + [0] * (L - 1)]  # 1 at [CLS], shared by the batch
    want = _step(ref, ids, mask, seg)
    assert calls
    _assert_same(got, want)


@pytest.mark.parametrize("sharing,built", [("layer", 1), ("none", 3)])
def test_shared_factors_are_scaled_once_per_forward(sharing, built, device, monkeypatch):
    """DIET-ABS's factors shared by every layer reach the kernel scaled and cast once per forward, per layer when
    each layer has its own; either way the model matches eager."""
    from dietpe.positions.terms.logit import LogitTerm

    builds, per_forward = [], LogitTerm.per_forward
    monkeypatch.setattr(LogitTerm, "per_forward", lambda self, name, build: per_forward(
        self, name, lambda: builds.append(name) or build()))
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position="diet-abs", sharing=sharing,
                       num_hidden_layers=3)
    ids, mask, seg = batch(L, device=device)
    got = _step(fused, ids, mask, seg)
    assert sum(name.startswith("folded") for name in builds) == built
    _assert_same(got, _step(ref, ids, mask, seg))


def test_fires_pieces_are_packed_once_per_forward(device, monkeypatch):
    """FIRE's pieces, shared by every layer, reach the kernel packed (float32, the layout its tiles read) once per
    forward, not once per layer; the model matches eager."""
    from dietpe.attention.kernels import attention

    packs, pack = [], attention.pack_pieces
    monkeypatch.setattr(attention, "pack_pieces", lambda *a: packs.append(1) or pack(*a))
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position="fire", num_hidden_layers=3)
    ids, mask, seg = batch(L, device=device)
    got = _step(fused, ids, mask, seg)
    assert len(packs) == 1
    _assert_same(got, _step(ref, ids, mask, seg))


def test_packed_documents_by_a_4d_mask_match_eager(device):
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position="diet-rel", segment="per-head",
                       sharing="layer")
    ids, _, seg = batch(L, device=device)
    doc = (torch.arange(L) >= L // 3).long() + (torch.arange(L) >= 2 * L // 3).long()
    mask = document_mask(doc.expand(2, L)).to(device)  # (2, 1, L, L): three documents per row
    _assert_same(_step(fused, ids, mask, seg), _step(ref, ids, mask, seg))


def _packed(device, cuts=((4,), (3, 8))):
    """position_ids restarting at 0 at each row's cuts (per example) and the block-diagonal mask they mark."""
    from dietpe.attention.masks import position_document_mask

    positions = torch.stack([torch.cat([torch.arange(n) for n in torch.diff(torch.tensor([0, *c, L])).tolist()])
                             for c in cuts])
    return positions.to(device), position_document_mask(positions).to(device)


#: the tables the kernel reads along per-example positions' runs: offsets, buckets, TUPE's per-example
#: [CLS] reset, distances, FIRE's per-example normaliser, with DIET's segments
RUN_METHODS = [("diet-rel", "per-head"), ("t5", "input"), ("tupe-r", "input"), ("alibi", "input"),
               ("kerple", "input"), ("fire", "input")]


@pytest.mark.parametrize("position,segment", RUN_METHODS)
def test_packed_documents_by_position_ids_match_eager(position, segment, device):
    """position_ids restarting at 0 per document with the block-diagonal mask they mark: the kernel reads its
    tables along the diagonals i - j, which equal pos_i - pos_j on every pair the mask leaves open."""
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position=position, segment=segment,
                       num_hidden_layers=1)
    ids, _, seg = batch(L, device=device)
    positions, mask = _packed(device)
    want = _step(ref, ids, mask, seg, position_ids=positions)
    _assert_same(_step(fused, ids, mask, seg, position_ids=positions), want)  # served: "fused" never falls back
    with pytest.raises(NotServed, match="position_ids differ from i - j"):  # no mask: documents see each other
        fused(ids, None, seg, position_ids=positions)


@pytest.mark.parametrize("position", ["diet-rel", "fire"])
def test_per_example_starts_match_eager(position, device):
    """Each row one run from its own start (FIRE's normaliser reads it): served whatever the mask."""
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position=position, num_hidden_layers=1)
    ids, mask, seg = batch(L, device=device)
    positions = (torch.arange(L) + torch.tensor([[0], [5]])).to(device)
    _assert_same(_step(fused, ids, mask, seg, position_ids=positions),
                 _step(ref, ids, mask, seg, position_ids=positions))


def test_two_training_steps_give_the_same_bits(device):
    _, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position="diet-rel", segment="per-head")
    ids, mask, seg = batch(L, device=device)
    first, second = _step(fused, ids, mask, seg), _step(fused, ids, mask, seg)
    assert torch.equal(first[0], second[0])
    assert all(torch.equal(first[1][n], second[1][n]) for n in first[1])


@pytest.mark.parametrize("position,segment", [("tupe-r", "input"), ("diet-rel", "per-head")])
def test_nothing_on_the_path_is_flagged_nondeterministic(position, segment, device):
    """Under torch.use_deterministic_algorithms no op of the fused path warns (on a GPU: index_select's or a
    float cumsum's backward would); cuBLAS's own warning about its workspace is torch's, not ours."""
    _, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position=position, segment=segment,
                     num_hidden_layers=1)
    ids, mask, seg = batch(L, device=device)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _step(fused, ids, mask, seg)
    finally:
        torch.use_deterministic_algorithms(False)
    flagged = [str(w.message) for w in caught if "determinis" in str(w.message).lower()
               and "cublas" not in str(w.message).lower()]
    assert not flagged, flagged


def test_methods_it_cannot_serve_are_refused_when_built():
    for position in ("xlnet", "shaw"):
        with pytest.raises(ConfigError, match="attn_backend='fused' cannot serve"):
            tiny(16, position=position, attn_backend="fused")
    assert DietConfig.from_preset("bert-tiny", position="t5", attn_backend="fused").attention_probs_dropout_prob > 0


def test_attention_dropout_repeats_with_the_seed(device):
    _, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position="diet-rel", segment="per-head",
                     attention_probs_dropout_prob=0.3)
    ids, mask, seg = batch(L, device=device)
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)  # the kernel's Philox seed comes from torch's generator
        runs.append(_step(fused, ids, mask, seg))
    assert torch.equal(runs[0][0], runs[1][0]) and all(torch.equal(runs[0][1][n], runs[1][1][n]) for n in runs[0][1])
    assert not torch.equal(runs[0][0], runs[2][0])


def test_the_dropout_seed_is_drawn_on_the_device_and_read_by_the_kernels_at_each_launch(device, monkeypatch):
    """A CUDA graph replays launches with the arguments they were captured with: a seed from the host would drop
    the same scores at every replay. So the seed is drawn on q's device by torch's generator (a seeded run
    repeats) and the kernels read it from memory when they run: a new value in the same tensor gives the mask of
    that seed, forward and backward. The compiled path's operator returns that tensor for its backward."""
    from dietpe.attention.kernels import attention, op

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, L, 16, generator=g).to(device).requires_grad_() for _ in range(3))
    table = torch.randn(2, 2 * L - 1, generator=g).to(device).requires_grad_()
    torch.manual_seed(0)
    seed = attention.dropout_seed(0.3, q)
    torch.manual_seed(0)
    assert torch.equal(attention.dropout_seed(0.3, q), seed) and attention.dropout_seed(0.0, q) == 0
    assert (seed.shape, seed.dtype, seed.device) == ((1,), torch.int64, q.device)
    w = torch.randn(2, 2, L, 16, generator=g).to(device)

    def run(ex):
        out = attention.fused_attention(q, k, v, 0.25, table, None, ex)
        return (out, *torch.autograd.grad((out * w).sum(), (q, k, v, table)))

    held = torch.tensor([5], device=device)
    for name in ("item", "tolist", "__int__", "__index__", "cpu"):  # the host never reads it (a replay would not)
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, real=real, name=name: pytest.fail(
            f"the seed read on the host by .{name}") if self is held else real(self, *a))
    ex = attention.Extras(dropout=0.3, seed=held)
    first = run(ex)
    held.fill_(6)  # what a replay's draw does: the same tensor, a new value
    second = run(ex)
    for got, want in ((first, run(attention.Extras(dropout=0.3, seed=5))),
                      (second, run(attention.Extras(dropout=0.3, seed=6)))):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not torch.equal(first[0], second[0])
    out, _, drawn = op.fused_forward(*_op_inputs(device))
    assert drawn.device == q.device and drawn.dtype == torch.int64 and torch.isfinite(out).all()


def _op_inputs(device):
    from tests.attention.kernels.test_op import _inputs

    return (*_inputs(device, pieces=False)[:-1], 0.2)  # attention dropout 0.2


def test_per_example_positions_are_declined_per_call_and_auto_runs_sdpa(device, monkeypatch):
    ref, fused = _pair(lambda **kw: DietModel(tiny(16, **kw)), device, position="t5")
    ids, mask, seg = batch(L, device=device)
    positions = torch.arange(L).expand(2, L).flip(-1).to(device)  # per example: no offset table
    with pytest.raises(NotServed, match="position_ids"):
        fused(ids, mask, seg, position_ids=positions)
    from dietpe.attention import fused as fused_module

    monkeypatch.setattr(fused_module.backends, "LONG_ELEMENTS", 0)  # every call with a term counts as long
    auto = resolve_backend("auto", value_terms=False, method=REGISTRY["t5"])
    assert auto.name == "fused" and auto.fallback.name == "sdpa"
    tried = []
    decline = auto.forward

    def forward(*args):
        tried.append(True)
        return decline(*args)

    for layer in fused.layers:  # on the CPU too (auto skips the kernel there): try it, then fall back
        layer.attention.backend = dataclasses.replace(auto, forward=forward, skip=lambda q: False)
    with torch.no_grad():
        got = fused(ids, mask, seg, position_ids=positions).last_hidden_state
        want = ref(ids, mask, seg, position_ids=positions).last_hidden_state
    assert tried, "auto tried the fused kernel first"
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("position,long,kernel", [("diet-rel", False, False), ("diet-rel", True, True),
                                                  ("none", True, False), ("rotary", True, False)])
def test_auto_gives_the_kernel_long_calls_with_logit_terms(position, long, kernel, device, monkeypatch):
    """On CUDA "auto" runs the kernel where sdpa would build the bias block by block (its blocks kept for the
    backward: (L, L) a layer), and sdpa for short calls, where it was faster (docs/gpu.md), and for calls with
    no logit term (flash). Long: the bias with the padding mask's batch, 2 × 2 heads × L², above LONG_ELEMENTS
    (lowered here to make these lengths long)."""
    from dietpe.attention import fused as fused_module

    monkeypatch.setattr(fused_module, "skip_call", lambda q: False)  # as on CUDA, whatever the device
    monkeypatch.setattr(fused_module.backends, "LONG_ELEMENTS", 4 * L * L - 1 if long else 4 * L * L)
    ran = []
    real = fused_module.fused
    monkeypatch.setattr(fused_module, "fused", lambda *a, **k: ran.append(1) or real(*a, **k))
    cfg = dict(position=position, max_position_embeddings=L + 8)
    ref = _randomise(DietModel(tiny(16, attn_backend="eager", **cfg))).to(device)
    auto = DietModel(tiny(16, attn_backend="auto", **cfg))
    auto.load_state_dict(ref.state_dict())
    auto = auto.to(device)
    assert auto.layers[0].attention.backend.name == "fused"  # first in the chain; sdpa for what it declines
    ids, mask, seg = batch(L, device=device)
    _assert_same(_step(auto, ids, mask, seg), _step(ref, ids, mask, seg))
    assert bool(ran) == kernel


def test_auto_leaves_the_cpu_to_sdpa(monkeypatch):
    """Off CUDA "auto" never tries the kernel (the interpreter is for the tests that ask for it by name)."""
    from dietpe.attention import fused as fused_module

    monkeypatch.setattr(fused_module.backends, "LONG_ELEMENTS", 0)  # however long
    model = DietModel(tiny(16, position="diet-rel"))
    assert model.layers[0].attention.backend.name == "fused"  # what auto picks for a served method
    monkeypatch.setattr(fused_module, "plan", lambda *a: pytest.fail("the kernel was tried on the CPU"))
    ids, mask, seg = batch(L)
    with torch.no_grad():
        model(ids, mask, seg)


def _attached_pair(spec, device):
    """A tiny Hugging Face Llama given `spec` with backend="fused" (random position parameters), and the same
    with backend="eager"."""
    import dietpe
    from tests.integrations.test_attach import build

    fused = dietpe.attach(build("llama"), spec, backend="fused").eval().to(device)
    with torch.no_grad():
        for p in fused.model.diet_positions.parameters():
            p.normal_()
    ref = dietpe.attach(build("llama"), spec, backend="eager").eval().to(device)
    ref.load_state_dict(fused.state_dict())
    return fused, ref


@pytest.mark.parametrize("spec", ["fire", "diet-rel", "alibi"])
def test_attached_llama_decodes_with_the_kernel_as_with_eager(spec, device):
    """A Hugging Face Llama given a method with backend="fused": the cached decoding's logits (the query's
    position past the cache: FIRE's normaliser reads it) equal the full forward's and eager's."""
    from tests.integrations.test_attach import assert_cached_equals_full, ids

    fused, ref = _attached_pair(spec, device)
    x = ids(batch=2, length=10).to(device)
    assert_cached_equals_full(fused, x)
    torch.testing.assert_close(fused(x).logits, ref(x).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("position", ["diet-rel", "fire", "t5"])
def test_left_padded_causal_lm_trains_and_decodes_as_eager(position, device):
    """Left padding with position_ids from the attention mask (each row's first token at 0, pads at 0): per
    example, one run per row on the tokens, so the kernel serves the training step and every cached decoding
    step. Compared on the tokens (a padded query sees no key: its row is no loss's)."""
    from dietpe.models.causal import DietForCausalLM

    ref, fused = _pair(lambda **kw: DietForCausalLM(tiny_lm(position, **kw)), device, num_hidden_layers=1)
    ids = torch.randint(3, 40, (2, L)).to(device)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    w = torch.randn(2, L, fused.config.vocab_size, generator=torch.Generator().manual_seed(1)).to(device)
    w = w * mask[..., None]
    grads = []
    for model in (fused, ref):
        model.zero_grad()
        logits = model(ids, attention_mask=mask, position_ids=positions).logits
        (logits * w).sum().backward()
        grads.append((logits.detach() * mask[..., None], {n: p.grad for n, p in model.named_parameters()
                                                          if p.grad is not None}))
    _assert_same(*grads)
    for model in (fused, ref):
        model.eval()
    with torch.no_grad():
        got, want = (m.generate(ids[:, :L - 4], attention_mask=mask[:, :L - 4], max_new_tokens=4,
                                do_sample=False) for m in (fused, ref))
    assert torch.equal(got, want)


@pytest.mark.parametrize("spec", ["fire", "diet-rel"])
def test_attached_llama_serves_left_padding_and_packed_sequences(spec, device):
    """Per-example positions in a Hugging Face Llama with backend="fused" (which never falls back): left-padded
    greedy generation (generate's position_ids from the mask) gives eager's tokens; documents packed by
    position_ids alone (Hugging Face then builds the block-causal mask) give eager's logits, and a document's
    own when run alone."""
    from tests.integrations.test_attach import ids

    fused, ref = _attached_pair(spec, device)
    x = ids(batch=2, length=10).to(device)
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    packed = ids(batch=1, length=12).to(device)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]], device=device)
    with torch.no_grad():
        got, want = (m.generate(x, attention_mask=mask, max_new_tokens=4, do_sample=False) for m in (fused, ref))
        assert torch.equal(got, want)
        got, want = (m(packed, position_ids=positions, use_cache=False).logits for m in (fused, ref))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        alone = fused(packed[:, 5:8], position_ids=positions[:, 5:8], use_cache=False).logits
        torch.testing.assert_close(got[:, 5:8], alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("spec", ["diet-rel", "t5", "alibi"])
def test_attached_llama_decodes_into_a_static_cache_as_eager(spec, device):
    """A static cache hands every step its whole preallocated buffer, the queries short of its end: cut to the
    filled slots, the kernel serves each decoding step (batch 2, with and without left padding), with eager's
    tokens and scores."""
    from tests.integrations.test_attach import ids

    fused, ref = _attached_pair(spec, device)
    x = ids(batch=2, length=5).to(device)
    mask = torch.ones_like(x)
    mask[1, :2] = 0
    for m in (None, mask):
        with torch.no_grad():
            got, want = (model.generate(x, attention_mask=m, max_new_tokens=4, do_sample=False, pad_token_id=0,
                                        cache_implementation="static", output_scores=True,
                                        return_dict_in_generate=True) for model in (fused, ref))
        assert torch.equal(got.sequences, want.sequences)
        torch.testing.assert_close(torch.stack(got.scores), torch.stack(want.scores), atol=1e-5, rtol=1e-4)
