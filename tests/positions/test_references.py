"""Every registered position method against its plain reference written straight from its paper's equation.

The reference (`PositionMethod.reference_logit`, with the `reference_embedding` and `reference_value` hooks,
in each method's own file) recomputes each layer of a BERT block with explicit loops over heads and
positions, reading the model's parameters, and must reproduce the model's attention probabilities and
hidden states. The methods come from the registry: a new method is checked here without a line changed.
"""

import math

import pytest
import torch

from dietpe import DietCausalConfig, DietForCausalLM, DietModel
from dietpe.models.causal import CAUSAL_POSITIONS
from dietpe.positions.registry import REGISTRY, names
from tests.conftest import batch, run_on, tiny

L = 10


def split_heads(x, h):  # (B, L, D) -> (B, H, L, Dh)
    b, n, d = x.shape
    return x.view(b, n, h, d // h).transpose(1, 2)


def reference_logits(model, layer, q, k, segments, pos):
    """A[b, h, i, j] from the paper's equation for the model's method. q, k: (B, H, L, Dh) projections;
    pos: (B, L) the position of each token (i, j below are positions, not indices)."""
    cfg, pe = model.config, model.positions.method
    B, H, n, dh = q.shape
    lt = 0 if cfg.sharing == "layer" else layer
    hd = (lambda h: 0) if cfg.sharing == "head" else (lambda h: h)
    A = torch.zeros(B, H, n, n)
    for b in range(B):
        for h in range(H):
            for ii in range(n):
                for jj in range(n):
                    i, j = int(pos[b, ii]), int(pos[b, jj])
                    a = pe.reference_logit(cfg, q[b, h, ii], k[b, h, jj], i, j, layer, h)
                    if cfg.segment == "per-head":
                        t = model.positions.head_segments.logit("table")  # the effective table Ŝ
                        a = a + t[lt, hd(h), segments[b, ii], segments[b, jj]]
                    A[b, h, ii, jj] = a
    return A


def reference_layer(model, layer, hidden, mask, segments, pos, causal=False):
    """One BERT block with the reference attention; returns (probs, new hidden). causal: query i sees keys
    j <= i (sequence order)."""
    cfg, blk, pe = model.config, model.layers[layer], model.positions.method
    att = blk.attention
    H = cfg.num_attention_heads
    q, k, v = (split_heads(f(hidden), H) for f in (att.query, att.key, att.value))
    A = reference_logits(model, layer, q, k, segments, pos)
    A = A.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    if causal:
        A = A.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    P = A.softmax(-1)
    o = P @ v
    for b in range(len(pos)):  # the value hook: o_i += Σ_j p_ij a_ij (Shaw's a^V_clip(i-j))
        for h in range(H):
            for i in range(L):
                for j in range(L):
                    extra = pe.reference_value(cfg, int(pos[b, i]), int(pos[b, j]), layer, h)
                    if extra is not None:
                        o[b, h, i] += P[b, h, i, j] * extra
    o = o.transpose(1, 2).reshape(hidden.shape)
    x = blk.attention_norm(hidden + blk.attention_output(o))
    return P, blk.output_norm(x + blk.output(blk.act(blk.intermediate(x))))


def reference_embeddings(model, ids, segments, pos):
    cfg, pe = model.config, model.positions.method
    x = model.embeddings.word_embeddings(ids)
    added = [[pe.reference_embedding(cfg, int(p)) for p in row] for row in pos]  # the input hook
    if added[0][0] is not None:
        x = x + torch.stack([torch.stack(row) for row in added])
    if cfg.segment == "input":
        x = x + model.positions.input_segments.weight[segments]
    return model.embeddings.LayerNorm(x)


# Every method with the segments of its papers' row, and with per-head segments (DIET eq. 2) beside each
# method that has a logit term; then sharing, TUPE without its reset, and fields away from their defaults.
CASES = [(p, m.segment, "none", {}) for p, m in REGISTRY.items()] + [
    (p, "per-head", "none", {}) for p, m in REGISTRY.items() if "logits" in m.entry and m.segment != "per-head"] + [
    ("diet-abs", "per-head", "layer", {}), ("diet-abs", "per-head", "head", {}),
    ("diet-rel", "per-head", "layer", {}), ("diet-rel", "none", "head", {}),
    ("none", "per-head", "layer", {}), ("tupe-a", "none", "none", {"tupe_reset": False}),
    ("sinusoidal", "input", "none", {"position_scale": 0.03}),
    ("diet-rel", "per-head", "none", {"diet_rel_max_distance": 3}),
    ("shaw", "none", "none", {"shaw_max_distance": 40}),  # k beyond the length: the terms read a window
    ("rotary", "input", "none", {"rotary_base": 100.0}),
]


# Positions the model is given: the default 0 .. L-1, one shifted and stretched row shared by the batch, and
# per-example rows (packed documents restarting at 0; left padding; positions out of order with repeats).
# All stay inside the tiny config's learned tables (24 positions).
POSITION_IDS = {
    "default": None,
    "shared": (3 + 2 * torch.arange(L))[None],
    "per-example": torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5],
                                 [7, 7, 7, 0, 1, 2, 9, 4, 23, 11]]),
}


@pytest.mark.parametrize("positions", list(POSITION_IDS))
@pytest.mark.parametrize("position,segment,sharing,extra", CASES,
                         ids=[f"{p}-{s}-{h}" + "".join(f"-{k}={v}" for k, v in e.items()) for p, s, h, e in CASES])
def test_method_matches_paper_equation(position, segment, sharing, extra, positions, device):
    model = DietModel(tiny(position=position, segment=segment, sharing=sharing, attn_backend="eager", **extra)).eval()
    ids, mask, segments = batch(L)
    position_ids = POSITION_IDS[positions]
    pos = (torch.arange(L) if position_ids is None else position_ids).expand(len(ids), L)
    with torch.no_grad():
        out = run_on(device, model, ids, mask, segments, position_ids=position_ids, output_attentions=True,
                     output_hidden_states=True)
        hidden = reference_embeddings(model, ids, segments, pos)
        torch.testing.assert_close(out.hidden_states[0], hidden, atol=1e-5, rtol=1e-4)
        for layer in range(model.config.num_hidden_layers):
            probs, hidden = reference_layer(model, layer, out.hidden_states[layer], mask, segments, pos)
            torch.testing.assert_close(out.attentions[layer], probs, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.hidden_states[layer + 1], hidden, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("heads", [6, 12])
@pytest.mark.parametrize("position", ["alibi", "kerple", "t5", "diet-rel"])
def test_a_head_count_that_is_not_a_power_of_two(position, heads):
    """ALiBi's slopes for 6 or 12 heads follow the authors' get_slopes (not 2^(-8(h+1)/n)); every per-head
    method is checked beyond the tiny config's two heads."""
    model = DietModel(tiny(head_size=4, position=position, attn_backend="eager", num_attention_heads=heads,
                           hidden_size=4 * heads)).eval()
    ids, mask, segments = batch(L)
    pos = torch.arange(L).expand(len(ids), L)
    with torch.no_grad():
        out = model(ids, mask, segments, output_attentions=True, output_hidden_states=True)
        probs, _ = reference_layer(model, 0, out.hidden_states[0], mask, segments, pos)
    torch.testing.assert_close(out.attentions[0], probs, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pad_last", [0, 3])
def test_diet_abs_lin_matches_eq4(pad_last):
    """DIET-ABS-LIN: A = (X W_Q)((E X) W_K)ᵀ/√d + P_Q P_Kᵀ with P_K ∈ R^{k×d_p}; values (F X) W_V (Linformer eq. 7:
    the length projection acts on the layer's input, so the projections' biases are added once per slot). The
    biases are drawn non-zero, as training leaves them; padded tokens are left out of E X."""
    torch.manual_seed(0)
    model = DietModel(tiny(position="diet-abs", segment="input", attention="linformer", attn_backend="eager")).eval()
    ids, mask, segments = batch(L, pad_last=pad_last)
    with torch.no_grad():
        att = model.layers[0].attention
        for lin in (att.key, att.value):
            lin.bias.normal_()
        seen = {}
        att.register_forward_hook(lambda mod, args, output: seen.update(out=output[0]))
        out = model(ids, mask, segments, output_attentions=True, output_hidden_states=True)
        pe, H = model.positions.method, model.config.num_attention_heads
        x = out.hidden_states[0] * mask[:, :, None]
        ex = torch.einsum("kn,bnd->bkd", att.proj_k[:, :L], x)
        q, k = split_heads(att.query(out.hidden_states[0]), H), split_heads(ex @ att.key.weight.T + att.key.bias, H)
        dh = q.shape[-1]
        p_q, p_k = pe.logit("p_q")[0], pe.logit("p_k")[0]  # the effective factors
        A = q @ k.transpose(-1, -2) / math.sqrt(dh) + p_q[:, :L] @ p_k.transpose(-1, -2)
        torch.testing.assert_close(out.attentions[0], A.softmax(-1), atol=1e-5, rtol=1e-4)
        assert out.attentions[0].shape[-1] == model.config.linformer_k
        fx = torch.einsum("kn,bnd->bkd", att.proj_v[:, :L], x)
        v = split_heads(fx @ att.value.weight.T + att.value.bias, H)
        ctx = (A.softmax(-1) @ v).transpose(1, 2).reshape(len(ids), L, -1)
        torch.testing.assert_close(seen["out"], ctx, atol=1e-5, rtol=1e-4)


def test_relative_methods_accept_lengths_beyond_training_length():
    for position in names(learned_table=False):
        model = DietModel(tiny(position=position)).eval()
        ids = torch.randint(1, 50, (1, 40))  # max_position_embeddings is 24
        assert model(ids).last_hidden_state.shape == (1, 40, 16)


@pytest.mark.parametrize("positions", ["default", "per-example"])
@pytest.mark.parametrize("position", CAUSAL_POSITIONS)
def test_causal_lm_matches_paper_equation(position, positions, device):
    """The decoder-only LM: the same equations under a causal mask; `none` is NoPE (Kazemnejad et al. 2023:
    no position term, the mask alone orders the tokens), T5's buckets the unidirectional ones of T5's
    decoder (HF's `_relative_position_bucket(..., bidirectional=False)`)."""
    cfg = tiny(position=position, attn_backend="eager").to_dict()
    cfg.pop("model_type", None)
    cfg.pop("diet_rel_max_distance")  # the causal LM's own default: half its length
    lm = DietForCausalLM(DietCausalConfig(**{**cfg, "segment": "none", "tupe_reset": False})).eval()
    model = lm.diet
    ids, _, segments = batch(L, pad_last=0)
    mask = torch.ones_like(ids)
    position_ids = POSITION_IDS[positions]
    pos = (torch.arange(L) if position_ids is None else position_ids).expand(len(ids), L)
    with torch.no_grad():
        out = run_on(device, model, ids, position_ids=position_ids, output_attentions=True, output_hidden_states=True)
        torch.testing.assert_close(out.hidden_states[0], reference_embeddings(model, ids, segments, pos),
                                   atol=1e-5, rtol=1e-4)
        for layer in range(model.config.num_hidden_layers):
            probs, hidden = reference_layer(model, layer, out.hidden_states[layer], mask, segments, pos, causal=True)
            torch.testing.assert_close(out.attentions[layer], probs, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.hidden_states[layer + 1], hidden, atol=1e-5, rtol=1e-4)
