"""Packing without leaks: documents packed into one row, kept apart by a block-diagonal 4-D attention mask and
position_ids restarting at 0, give each document exactly what it gives alone, for every method of the registry,
encoder and causal LM, on every backend that serves the method (gradients included where the backend trains).
Also: Hugging Face's additive 4-D masks, per-head masks, the blocked-queries and banded paths, cached decoding
with a 4-D mask, and the masked-LM training forward in the form the `--packing documents` collator emits."""

import warnings

import pytest
import torch
from transformers import DynamicCache

from dietpe import ConfigError, DietForMaskedLM, DietModel, InputError
from dietpe.attention import backends
from dietpe.attention import banded as banded_mod
from dietpe.attention.registry import ALL_BACKENDS
from dietpe.attention.masks import document_mask, documents_from_positions, position_document_mask
from dietpe.models.causal import DietCausalModel
from dietpe.models.seq2seq import DietForConditionalGeneration
from dietpe.positions.registry import REGISTRY
from tests.conftest import tiny
from tests.models.test_causal import tiny_lm
from tests.models.test_seq2seq import tiny_s2s

LENGTHS = (5, 3, 4)  # three documents; row 0 packs all three, row 1 two of them and padding
# every registered backend ("auto" is one of them for every method) but those that decline calls (the fused
# kernel: CUDA and default positions only; tests/attention/kernels)
BACKENDS = tuple(name for name in ALL_BACKENDS if ALL_BACKENDS[name].skip is None)


def _build(make, position, backend):
    """The model for (method, backend), or None when that backend cannot serve the method (refused at build)."""
    try:
        model = make(position, backend)
    except ConfigError:
        return None
    with torch.no_grad():  # position terms large enough that a leak or a wrong position shows
        for p in model.positions.parameters():
            p.copy_(torch.randn_like(p))
        for method in model.positions.modules():  # logit-unit tables: N(0, 1) as used, not as stored
            for name in getattr(method, "logit_parameters", ()):
                if name in dict(method.named_parameters(recurse=False)):
                    getattr(method, name).div_(method.logit_scale)
    return model.eval()


def _encoder(position, backend):
    return DietModel(tiny(position=position, attn_backend=backend))


def _causal(position, backend):
    return DietCausalModel(tiny_lm(position, attn_backend=backend))


def _cases(causal: bool):
    make = _causal if causal else _encoder
    out = []
    for position, info in REGISTRY.items():
        if causal and not info.causal_ok:
            continue
        for backend in BACKENDS:
            try:
                make(position, backend)
            except ConfigError:
                continue
            out.append((position, backend))
    return out


def _packed():
    """Documents, and two packed rows: ids (2, 12), position_ids restarting at 0, document ids (-1 = padding)."""
    docs = [torch.randint(1, 40, (n,)) for n in LENGTHS]
    rows = ([0, 1, 2], [2, 0])
    ids, pos, doc = torch.zeros(2, 12, dtype=torch.long), torch.zeros(2, 12, dtype=torch.long), \
        torch.full((2, 12), -1)
    spans = []
    for r, order in enumerate(rows):
        at = 0
        for d in order:
            n = LENGTHS[d]
            ids[r, at:at + n], pos[r, at:at + n], doc[r, at:at + n] = docs[d], torch.arange(n), d
            spans.append((r, at, d))
            at += n
    return docs, ids, pos, doc, spans


def _run(model, causal, ids, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex warns that it runs unfused outside torch.compile on CPU
        return model(ids, **kw).last_hidden_state


def _packed_equals_alone(model, causal, grad):
    docs, ids, pos, doc, spans = _packed()
    mask = document_mask(doc)  # (2, 1, 12, 12)
    weights = torch.randn(2, 12, model.config.hidden_size) * (doc >= 0)[..., None]
    with torch.set_grad_enabled(grad):
        packed = _run(model, causal, ids, attention_mask=mask, position_ids=pos)
        alone = [_run(model, causal, d[None])[0] for d in docs]  # default positions 0 .. n-1, no mask
    for r, at, d in spans:
        torch.testing.assert_close(packed[r, at:at + LENGTHS[d]], alone[d], atol=2e-5, rtol=1e-5)
    if not grad:
        return
    (packed * weights).sum().backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    sum((alone[d] * weights[r, at:at + LENGTHS[d]]).sum() for r, at, d in spans).backward()
    alone_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert packed_grads.keys() == alone_grads.keys()
    assert any(n.startswith("positions.") for n in packed_grads) or not list(model.positions.parameters())
    for name, g in packed_grads.items():
        torch.testing.assert_close(g, alone_grads[name], atol=1e-4, rtol=1e-4, msg=name)


#: gradients for every method on sdpa (what training runs), for one on eager; flex's backward needs CUDA and
#: Shaw's band trains through the reference
GRADIENTS = {("diet-rel", "eager")}


def _with_grad(position, backend):
    return backend == "sdpa" or (position, backend) in GRADIENTS


@pytest.mark.parametrize("position,backend", _cases(causal=False))
def test_encoder_packed_documents_equal_each_document_alone(position, backend):
    model = _build(_encoder, position, backend)
    if model is None:
        return  # auto = sdpa: the sdpa case covers it
    _packed_equals_alone(model, False, grad=_with_grad(position, backend))


@pytest.mark.parametrize("position,backend", _cases(causal=True))
def test_causal_packed_documents_equal_each_document_alone(position, backend):
    model = _build(_causal, position, backend)
    if model is None:
        return
    _packed_equals_alone(model, True, grad=_with_grad(position, backend))


@pytest.mark.parametrize("position", [p for p, info in REGISTRY.items() if info.causal_ok])
def test_cached_decoding_with_a_4d_mask_equals_the_full_forward(position):
    """The 4-D mask of a cached step covers the new queries against cached + new keys."""
    model = _build(_causal, position, "eager")
    _, ids, pos, doc, _ = _packed()
    mask = document_mask(doc)

    with torch.no_grad():
        full = model(ids, attention_mask=mask, position_ids=pos).last_hidden_state
        cache = DynamicCache()
        first = model(ids[:, :7], attention_mask=mask[:, :, :7, :7], position_ids=pos[:, :7],
                      past_key_values=cache, use_cache=True).last_hidden_state
        rest = model(ids[:, 7:], attention_mask=mask[:, :, 7:, :], position_ids=pos,
                     past_key_values=cache, use_cache=True).last_hidden_state
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=2e-5, rtol=1e-5)


def test_causal_4d_mask_is_combined_with_causality():
    """An all-True 4-D mask in the causal LM is no mask at all: causality still holds."""
    model = _build(_causal, "alibi", "sdpa")
    ids = torch.randint(1, 40, (2, 9))
    with torch.no_grad():
        plain = model(ids).last_hidden_state
        full = model(ids, attention_mask=torch.ones(2, 1, 9, 9, dtype=torch.bool)).last_hidden_state
    torch.testing.assert_close(full, plain, atol=1e-6, rtol=1e-6)


def _hf_forms(keep):
    """A boolean mask in the forms Hugging Face models take: integers and additive floats."""
    f = torch.float32
    return {"int": keep.long(),
            "finfo.min": torch.zeros(keep.shape, dtype=f).masked_fill(~keep, torch.finfo(f).min),
            "-inf": torch.zeros(keep.shape, dtype=f).masked_fill(~keep, float("-inf")),
            "-1e4": torch.zeros(keep.shape, dtype=f).masked_fill(~keep, -1e4)}


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
@pytest.mark.parametrize("make", [_encoder, _causal], ids=["encoder", "causal"])
def test_hugging_face_additive_and_integer_4d_masks_equal_the_boolean_one(make, backend):
    model = _build(make, "t5", backend)
    _, ids, pos, doc, _ = _packed()
    keep = document_mask(doc)
    with torch.no_grad():
        want = _run(model, None, ids, attention_mask=keep, position_ids=pos)
        for name, mask in _hf_forms(keep).items():
            got = _run(model, None, ids, attention_mask=mask, position_ids=pos)
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex", "auto"])
def test_per_head_4d_masks(backend):
    """(B, H, L, L): the same mask for every head equals (B, 1, L, L); different heads' masks agree with the
    reference on every backend (the banded Shaw paths read one mask for all heads: they hand it to eager)."""
    position = "shaw" if backend == "auto" else "diet-rel"
    ref = _build(_encoder, position, "eager")
    model = _build(_encoder, position, backend)
    model.load_state_dict(ref.state_dict())
    _, ids, pos, doc, _ = _packed()
    keep = document_mask(doc)
    per_head = torch.cat([keep, torch.ones_like(keep)], dim=1)  # head 0 documents, head 1 the whole row
    with torch.no_grad():
        one = _run(model, None, ids, attention_mask=keep, position_ids=pos)
        both = _run(model, None, ids, attention_mask=keep.expand(-1, 2, -1, -1), position_ids=pos)
        torch.testing.assert_close(both, one, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(_run(model, None, ids, attention_mask=per_head, position_ids=pos),
                                   _run(ref, None, ids, attention_mask=per_head, position_ids=pos),
                                   atol=2e-5, rtol=1e-5)


def test_sdpa_blocked_queries_path_reads_the_4d_mask(monkeypatch):
    """Long inputs attend block of queries by block; each block reads its rows of the 4-D mask."""
    model = _build(_encoder, "diet-rel", "sdpa")
    _, ids, pos, doc, _ = _packed()
    mask = document_mask(doc)
    with torch.no_grad():
        want = model(ids, attention_mask=mask, position_ids=pos).last_hidden_state
    calls = []
    real = backends._sdpa_blocks
    monkeypatch.setattr(backends, "_sdpa_blocks", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(backends, "LONG_ELEMENTS", 1)
    monkeypatch.setattr(backends, "BLOCK_ELEMENTS", 2 * 2 * 12 * 5)  # blocks of 5 queries
    with torch.no_grad():
        got = model(ids, attention_mask=mask, position_ids=pos).last_hidden_state
    assert calls, "the blocked-queries path did not run"
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("min_keys", [4, 10_000], ids=["banded", "dense"])
def test_shaw_inference_paths_serve_a_general_4d_mask(monkeypatch, min_keys):
    """Shaw at inference with consecutive positions and a block-diagonal mask: the banded path (from MIN_KEYS
    keys) and the dense one read the mask per query, as the reference adds it."""
    ref = _build(_encoder, "shaw", "eager")
    model = _build(_encoder, "shaw", "auto")
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(1, 40, (2, 20))
    doc = torch.tensor([[0] * 7 + [1] * 9 + [2] * 4, [0] * 12 + [1] * 5 + [-1] * 3])
    mask = document_mask(doc)
    monkeypatch.setattr(banded_mod, "MIN_KEYS", min_keys)
    used = []
    for name in ("banded", "dense"):
        real = getattr(banded_mod, name)
        monkeypatch.setattr(banded_mod, name, lambda *a, _r=real, _n=name, **k: used.append(_n) or _r(*a, **k))
    with torch.no_grad():
        got = model(ids, attention_mask=mask).last_hidden_state
        want = ref(ids, attention_mask=mask).last_hidden_state
    assert used and set(used) == {"banded" if min_keys == 4 else "dense"}
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_a_plain_padding_mask_builds_no_query_key_mask():
    """The fast path stays: a (B, L) mask reaches the backends as (B, 1, 1, L), not (B, 1, L, L)."""
    model = _build(_encoder, "diet-rel", "sdpa")
    seen = []
    for layer in model.layers:
        real = layer.attention.backend
        layer.attention.backend = lambda q, k, v, t, mask, *a, _r=real: seen.append(tuple(mask.shape)) or _r(
            q, k, v, t, mask, *a)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, -3:] = 0
    with torch.no_grad():
        model(torch.randint(1, 40, (2, 12)), attention_mask=mask)
    assert seen == [(2, 1, 1, 12)] * 2


def test_masked_lm_trains_on_the_packing_collators_form():
    """`--packing documents` rows: position_ids restarting per document, a (B, 1, L, L) boolean mask True within
    a document. The MLM loss (mean over masked tokens) is the token-weighted mean of the documents' own losses,
    and its gradients are theirs."""
    model = DietForMaskedLM(tiny(position="diet-rel", segment="per-head"))
    docs, ids, pos, doc, spans = _packed()
    labels = torch.full_like(ids, -100)
    labels[:, ::2] = ids[:, ::2]
    labels[doc < 0] = -100
    out = model(ids, attention_mask=position_document_mask(pos) & (doc >= 0)[:, None, None, :] | torch.eye(
        12, dtype=torch.bool), position_ids=pos, labels=labels)
    out.loss.backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    total, count = 0.0, int((labels != -100).sum())
    for r, at, d in spans:
        n = LENGTHS[d]
        lab = labels[r, at:at + n][None]
        alone = model(docs[d][None], labels=lab)
        k = int((lab != -100).sum())
        (alone.loss * k / count).backward()
        total += alone.loss.item() * k
    assert out.loss.item() == pytest.approx(total / count, rel=1e-5)
    for name, g in packed_grads.items():
        torch.testing.assert_close(g, dict(model.named_parameters())[name].grad, atol=1e-5, rtol=1e-4, msg=name)


def test_translation_model_takes_a_4d_target_mask():
    """The decoder's self-attention combines a 4-D mask with causality: the expansion of (B, T) padding gives
    the same logits. A 4-D source mask is refused: cross-attention needs the source's padding."""
    model = DietForConditionalGeneration(tiny_s2s("diet-rel")).eval()
    src, tgt = torch.randint(4, 30, (2, 7)), torch.randint(4, 30, (2, 6))
    src_mask, tgt_mask = torch.ones(2, 7, dtype=torch.long), torch.ones(2, 6, dtype=torch.long)
    src_mask[1, -2:] = 0
    tgt_mask[0, -1:] = 0
    square = tgt_mask.bool()[:, None, None, :].expand(-1, 1, 6, -1) | torch.eye(6, dtype=torch.bool)
    with torch.no_grad():
        want = model(src, src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask).logits
        got = model(src, src_mask, decoder_input_ids=tgt, decoder_attention_mask=square).logits
    real = tgt_mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=1e-5)
    with pytest.raises(InputError, match=r"attention_mask \(the source's\) must be \(batch, source length\)"):
        model(src, torch.ones(2, 1, 7, 7, dtype=torch.bool), decoder_input_ids=tgt)


def test_document_ids_from_restarting_positions():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [3, 4, 0, 1, 2, 3, 0, 0, 1]])
    assert documents_from_positions(pos).tolist() == [[1, 1, 1, 2, 2, 3, 3, 3, 3], [1, 1, 2, 2, 2, 2, 3, 4, 4]]
    mask = position_document_mask(pos)
    assert mask.shape == (2, 1, 9, 9) and mask.dtype == torch.bool
    assert mask[0, 0, 3].tolist() == [False] * 3 + [True] * 2 + [False] * 4
    assert torch.equal(document_mask(documents_from_positions(pos[0])), mask[:1])
