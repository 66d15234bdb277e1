"""`position_ids` reach every method: relative terms read pos_i - pos_j of the given positions, absolute terms
index their tables with them, per example or shared by the batch, on every backend (the paper-equation
references with arbitrary positions are in test_references.py)."""

import warnings

import pytest
import torch

from dietpe import DietForMaskedLM, DietModel
from dietpe.attention import backends
from dietpe.config import POSITIONS
from dietpe.positions.registry import names
from dietpe.errors import InputError
from tests.conftest import batch, tiny

L = 10
# methods whose logits depend on positions only through pos_i - pos_j
SHIFT_INVARIANT = names(relative=True)
LEARNED_TABLES = names(learned_table=True)
LENGTH_FREE = names(learned_table=False)


def _segment(position):
    return "per-head" if position.startswith("dietpe") else "input"


def _model(position, backend="eager", **kw):
    return DietModel(tiny(position=position, segment=_segment(position), attn_backend=backend, **kw)).eval()


@pytest.mark.parametrize("position", POSITIONS)
def test_stretched_positions_change_the_output_and_a_shift_changes_only_absolute_methods(position):
    model = _model(position)
    ids, mask, seg = batch(L)
    with torch.no_grad():
        # at init (std 0.02) attention is nearly uniform and position terms too small to see; parameters
        # initialised at unit scale (KERPLE's r1, r2) are visible already, and 25 times them would saturate
        for p in model.positions.parameters():
            p.mul_(25 if p.abs().mean() < 0.1 else 1)
        for layer in model.layers:
            layer.attention.query.weight.mul_(10)
            layer.attention.key.weight.mul_(10)
        base = model(ids, mask, seg).last_hidden_state
        default = model(ids, mask, seg, position_ids=torch.arange(L)[None]).last_hidden_state
        stretched = model(ids, mask, seg, position_ids=2 * torch.arange(L)[None]).last_hidden_state
        shifted = model(ids, mask, seg, position_ids=(torch.arange(L) + 5)[None]).last_hidden_state
    assert torch.equal(base, default)
    if position == "none":
        torch.testing.assert_close(stretched, base)
        return
    assert (stretched - base).abs().max() > 1e-3, "stretched positions must change the output"
    if position in SHIFT_INVARIANT:
        torch.testing.assert_close(shifted, base, atol=2e-5, rtol=1e-4)
    else:
        assert (shifted - base).abs().max() > 1e-3


# Shaw is served by eager only; the config refuses sdpa (tested in test_backends.py)
@pytest.mark.parametrize("position,backend", [(p, b) for p in POSITIONS for b in ("eager", "sdpa")
                                              if (p, b) != ("shaw", "sdpa")])
def test_per_example_positions_equal_running_each_row_alone(position, backend):
    model = _model(position, backend)
    ids, mask, seg = batch(L)
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5], [6, 4, 2, 0, 1, 3, 5, 7, 9, 11]])
    with torch.no_grad():
        together = model(ids, mask, seg, position_ids=position_ids).last_hidden_state
        for row in range(len(ids)):
            alone = model(ids[row:row + 1], mask[row:row + 1], seg[row:row + 1],
                          position_ids=position_ids[row]).last_hidden_state
            torch.testing.assert_close(together[row:row + 1], alone, atol=2e-5, rtol=1e-4)


def _grads(model, ids, mask, seg, position_ids):
    out = model(ids, attention_mask=mask, token_type_ids=seg, position_ids=position_ids, labels=ids)
    out.loss.backward()
    return out.logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


SDPA_CASES = [(p, kind, long) for p in POSITIONS if p != "shaw" for kind in ("shared", "per-example")
              for long in (False, True)]


@pytest.mark.parametrize("position,kind,long", SDPA_CASES)
def test_sdpa_matches_eager_with_arbitrary_positions_and_gradients(monkeypatch, position, kind, long):
    """Shared non-consecutive positions leave the Toeplitz path; per-example ones give (B, H, Lq, Lk) terms;
    `long` forces the query blocks of long inputs."""
    if long:
        monkeypatch.setattr(backends, "LONG_ELEMENTS", 40)
        monkeypatch.setattr(backends, "BLOCK_ELEMENTS", 40)
    cfg = dict(position=position, segment=_segment(position))
    ref = DietForMaskedLM(tiny(**cfg, attn_backend="eager"))
    fast = DietForMaskedLM(tiny(**cfg, attn_backend="sdpa"))
    fast.load_state_dict(ref.state_dict())
    ids, mask, seg = batch(L)
    position_ids = (torch.tensor([[0, 2, 3, 5, 8, 9, 10, 12, 13, 20]]) if kind == "shared"
                    else torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5], [9, 4, 2, 0, 1, 3, 5, 7, 9, 11]]))
    (lr, gr), (lf, gf) = _grads(ref, ids, mask, seg, position_ids), _grads(fast, ids, mask, seg, position_ids)
    torch.testing.assert_close(lf, lr, atol=2e-5, rtol=1e-4)
    assert gr.keys() == gf.keys()
    for name in gr:
        torch.testing.assert_close(gf[name], gr[name], atol=2e-5, rtol=1e-3, msg=name)


@pytest.mark.parametrize("position", [p for p in POSITIONS if p != "shaw"])
def test_flex_forward_matches_eager_with_per_example_positions(position):
    ref, flex = _model(position), _model(position, "flex")
    flex.load_state_dict(ref.state_dict())
    ids, mask, seg = batch(L)
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5], [9, 4, 2, 0, 1, 3, 5, 7, 9, 11]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex warns that it runs unfused outside torch.compile on CPU
        torch.testing.assert_close(flex(ids, mask, seg, position_ids=position_ids).last_hidden_state,
                                   ref(ids, mask, seg, position_ids=position_ids).last_hidden_state,
                                   atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(3, L), (2, L + 1), (2, 1, L), (L - 1,)])
def test_position_ids_of_the_wrong_shape_are_refused_naming_the_shape(shape):
    model = _model("diet-rel")
    ids, mask, seg = batch(L)
    with pytest.raises(InputError, match=rf"position_ids has shape \({shape[0]}"):
        model(ids, mask, seg, position_ids=torch.zeros(shape, dtype=torch.long))


def test_float_position_ids_are_refused():
    with pytest.raises(InputError, match="integer tensor, got torch.float32"):
        _model("rotary")(batch(L)[0], position_ids=torch.arange(L, dtype=torch.float32))


@pytest.mark.parametrize("position", LEARNED_TABLES)
@pytest.mark.parametrize("bad", [24, -1])
def test_position_ids_beyond_a_learned_table_are_refused_naming_the_limit(position, bad):
    model = _model(position)  # max_position_embeddings=24
    position_ids = torch.arange(L)[None].clone()
    position_ids[0, 3] = bad
    with pytest.raises(InputError, match=rf"position_ids must lie in \[0, 23\].*max_position_embeddings=24.*got {bad}"):
        model(batch(L)[0], position_ids=position_ids)


@pytest.mark.parametrize("position", LENGTH_FREE)
def test_relative_methods_accept_positions_beyond_the_training_length(position):
    out = _model(position)(batch(L)[0], position_ids=(100 + 7 * torch.arange(L))[None]).last_hidden_state
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("position", ["diet-abs", "absolute"])
def test_linformer_reads_query_positions_and_backends_agree(position):
    """DIET-ABS-LIN indexes P_Q with the given positions (its keys are projected slots, not positions)."""
    cfg = dict(position=position, segment="input", attention="linformer")
    ref = DietForMaskedLM(tiny(**cfg, attn_backend="eager"))
    fast = DietForMaskedLM(tiny(**cfg, attn_backend="sdpa"))
    fast.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for model in (ref, fast):
            for p in model.diet.positions.parameters():  # large enough to see at init
                p.mul_(25)
    ids, mask, seg = batch(L, pad_last=0)
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5], [9, 4, 2, 0, 1, 3, 5, 7, 9, 11]])
    (lr, gr), (lf, gf) = _grads(ref, ids, mask, seg, position_ids), _grads(fast, ids, mask, seg, position_ids)
    torch.testing.assert_close(lf, lr, atol=2e-5, rtol=1e-4)
    for name in gr:
        torch.testing.assert_close(gf[name], gr[name], atol=2e-5, rtol=1e-3, msg=name)
    with torch.no_grad():
        assert (ref(ids, mask, seg).logits - lr).abs().max() > 1e-4


def _additive(keep):
    return torch.where(keep, 0.0, torch.finfo(torch.float32).min)


def _runs_hold(q_pos, k_pos, keep=None, causal=False):
    """`Runs.hold`, against the pairs written out: every pair the mask (and causality) opens has
    pos_i - pos_j = i - j + Lk - Lq."""
    from dietpe.positions.context import Context

    runs = Context(q_pos, k_pos).runs()
    mask = None if keep is None else _additive(keep)
    got = runs.hold(mask, causal, rows=2)  # two queries at a time: the loop over row blocks too
    lq, lk = q_pos.shape[-1], k_pos.shape[-1]
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    opened = torch.ones(lq, lk, dtype=torch.bool) if keep is None else keep.any(1)
    if causal:
        opened = opened & (j <= i + lk - lq)
    agree = (q_pos.reshape(-1, lq, 1) - k_pos.reshape(-1, 1, lk)) == (i - j + lk - lq)
    assert got == bool((agree | ~opened).all())
    return got


def test_runs_hold_where_the_mask_opens_only_pairs_of_one_run():
    from dietpe.attention.masks import position_document_mask

    packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 1, 0, 1, 2, 3, 4]])
    documents = position_document_mask(packed)  # (2, 1, 7, 7) True within a document
    assert _runs_hold(packed, packed, documents)
    assert not _runs_hold(packed, packed)  # no mask: documents see each other at pos_i - pos_j != i - j
    starts = torch.arange(7) + torch.tensor([[0], [3]])
    assert _runs_hold(starts, starts)  # one run per row: any mask
    left = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 2, 3]])  # left padding, pads at 0
    padding = (torch.arange(7) >= torch.tensor([[0], [3]]))[:, None, None, :].expand(2, 1, 7, 7)
    assert _runs_hold(left, left, padding, causal=True)  # a padded query sees no key
    assert not _runs_hold(left, left, padding)  # without causality padded queries see the tokens
    step = torch.tensor([[7], [4]])  # decoding: one new query after the cached keys
    step_keys = torch.cat([padding[:, :, :1], torch.ones(2, 1, 1, 1, dtype=torch.bool)], -1)  # (2, 1, 1, 8)
    assert _runs_hold(step, torch.cat([left, step], 1), step_keys)
    assert not _runs_hold(step + 1, torch.cat([left, step], 1), step_keys)  # a query position off by one
