"""Every position method against a plain reference written straight from its paper's equation.

The reference recomputes each layer of a BERT block with explicit loops over heads and positions, reading
the model's parameters, and must reproduce the model's attention probabilities and hidden states.
"""

import math

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from dietpe import DietCausalConfig, DietForCausalLM, DietModel
from dietpe.config import POSITIONS
from dietpe.positions.registry import names
from dietpe.models.causal import CAUSAL_POSITIONS
from tests.conftest import batch, run_on, tiny

L = 10


def split_heads(x, h):  # (B, L, D) -> (B, H, L, Dh)
    b, n, d = x.shape
    return x.view(b, n, h, d // h).transpose(1, 2)


def sinusoid(pos, d):  # Vaswani §3.5, one position, loops over dimensions
    out = torch.zeros(d)
    for i in range(0, d, 2):
        out[i] = math.sin(pos / 10000 ** (i / d))
        if i + 1 < d:
            out[i + 1] = math.cos(pos / 10000 ** (i / d))
    return out


def t5_bucket(rel, cfg):  # HF's own T5 function, as an independent reference; unidirectional when causal
    return int(T5Attention._relative_position_bucket(torch.tensor(rel), not getattr(cfg, "causal", False),
                                                     cfg.t5_num_buckets, cfg.t5_max_distance))


def kerple_log(h, dist, pe):  # Chi et al. 2022, log variant: -r1 log(1 + r2 |i - j|), r clamped to >= 0.01
    r1, r2 = max(float(pe.r1[h]), 0.01), max(float(pe.r2[h]), 0.01)
    return -r1 * math.log(1 + r2 * dist)


def alibi_slope(h, n_heads):  # Press et al.: 2^(-8/n · (h+1)) for a power-of-two head count
    return 2 ** (-8 / n_heads * (h + 1))


def rotate(x, pos, base=10000.0):  # RoFormer eq. 34, rotate-half layout, one (Dh,) vector
    d = x.shape[-1]
    out = x.clone()
    for m in range(d // 2):
        theta = pos * base ** (-2 * m / d)
        a, b = x[m], x[m + d // 2]
        out[m] = a * math.cos(theta) - b * math.sin(theta)
        out[m + d // 2] = b * math.cos(theta) + a * math.sin(theta)
    return out


L_MAX = 1 << 30  # no clip


def reference_logits(model, layer, q, k, segments, pos):
    """A[b, h, i, j] from the paper's equation for the model's method. q, k: (B, H, L, Dh) projections;
    pos: (B, L) the position of each token (i, j below are positions, not indices)."""
    cfg, pe = model.config, model.positions.method
    B, H, n, dh = q.shape
    lt = 0 if cfg.sharing == "layer" else layer
    hd = (lambda h: 0) if cfg.sharing == "head" else (lambda h: h)
    A = torch.zeros(B, H, n, n)
    if cfg.position in ("tupe-a", "tupe-r"):
        norm = pe.norm
        pq = lambda x: pe.u_q(norm(x)).view(H, dh)  # noqa: E731
        pk = lambda x: pe.u_k(norm(x)).view(H, dh)  # noqa: E731
    for b in range(B):
        for h in range(H):
            for ii in range(n):
                for jj in range(n):
                    qi, kj = q[b, h, ii], k[b, h, jj]
                    i, j = int(pos[b, ii]), int(pos[b, jj])
                    s = 1 / math.sqrt(dh)
                    if cfg.position == "shaw":
                        c = max(-cfg.shaw_max_distance, min(cfg.shaw_max_distance, i - j))
                        a = qi @ (kj + pe.key[layer, c + cfg.shaw_max_distance]) * s
                    elif cfg.position == "xlnet":
                        r = (sinusoid(i - j, cfg.hidden_size) @ pe.w_r[layer]).view(H, dh)[h]
                        a = ((qi + pe.u[layer, h]) @ kj + (qi + pe.v[layer, h]) @ r) * s
                    elif cfg.position == "rotary":
                        a = rotate(qi, i) @ rotate(kj, j) * s
                    elif cfg.position in ("tupe-a", "tupe-r"):
                        s2 = 1 / math.sqrt(2 * dh)
                        v = pq(pe.p[i])[h] @ pk(pe.p[j])[h] * s2
                        if cfg.position == "tupe-r":
                            v = v + pe.logit("bias")[h, t5_bucket(j - i, cfg)]
                        # the reset: θ, plus TUPE-R's learned [CLS] buckets (the authors' code)
                        cls_b = pe.logit("cls_bias")[h] if cfg.position == "tupe-r" and cfg.tupe_reset else (0, 0)
                        if cfg.tupe_reset and i == 0:
                            v = pq(pe.p_theta[0])[h] @ pk(pe.p_theta[0])[h] * s2 + cls_b[0]
                        elif cfg.tupe_reset and j == 0:
                            v = pq(pe.p_theta[1])[h] @ pk(pe.p_theta[1])[h] * s2 + cls_b[1]
                        a = qi @ kj * s2 + v
                    else:
                        a = qi @ kj * s
                        if cfg.position == "t5":
                            a = a + pe.logit("bias")[h, t5_bucket(j - i, cfg)]
                        elif cfg.position == "diet-abs":
                            a = a + pe.logit("p_q")[lt, hd(h), i] @ pe.logit("p_k")[lt, hd(h), j]
                        elif cfg.position == "diet-rel":
                            d = min(cfg.diet_rel_max_distance or L_MAX, cfg.max_position_embeddings - 1)
                            a = a + pe.logit("r")[lt, hd(h), max(-d, min(d, i - j)) + d]  # R_clip(i-j)
                        elif cfg.position == "alibi":
                            a = a - alibi_slope(h, H) * abs(i - j)
                        elif cfg.position == "kerple":
                            a = a + kerple_log(h, abs(i - j), pe)
                    if cfg.segment == "per-head":
                        t = model.positions.head_segments.logit("table")  # the effective table Ŝ
                        a = a + t[lt, hd(h), segments[b, ii], segments[b, jj]]
                    A[b, h, ii, jj] = a
    return A


def reference_layer(model, layer, hidden, mask, segments, pos, causal=False):
    """One BERT block with the reference attention; returns (probs, new hidden). causal: query i sees keys
    j <= i (sequence order)."""
    cfg, blk = model.config, model.layers[layer]
    att = blk.attention
    H = cfg.num_attention_heads
    q, k, v = (split_heads(f(hidden), H) for f in (att.query, att.key, att.value))
    A = reference_logits(model, layer, q, k, segments, pos)
    A = A.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    if causal:
        A = A.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    P = A.softmax(-1)
    o = P @ v
    if cfg.position == "shaw":  # o_i += Σ_j p_ij a^V_clip(i-j)
        pe = model.positions.method
        for b in range(len(pos)):
            for i in range(L):
                for j in range(L):
                    d = int(pos[b, i] - pos[b, j])
                    c = max(-cfg.shaw_max_distance, min(cfg.shaw_max_distance, d)) + cfg.shaw_max_distance
                    o[b, :, i] += P[b, :, i, j, None] * pe.value[layer, c]
    o = o.transpose(1, 2).reshape(hidden.shape)
    x = blk.attention_norm(hidden + blk.attention_output(o))
    return P, blk.output_norm(x + blk.output(blk.act(blk.intermediate(x))))


def reference_embeddings(model, ids, segments, pos):
    cfg = model.config
    x = model.embeddings.word_embeddings(ids)
    if cfg.position == "absolute":
        x = x + model.positions.method.weight[pos]
    elif cfg.position == "sinusoidal":
        x = x + cfg.position_scale * torch.stack([torch.stack([sinusoid(int(p), cfg.hidden_size) for p in row])
                                                  for row in pos])
    if cfg.segment == "input":
        x = x + model.positions.input_segments.weight[segments]
    return model.embeddings.LayerNorm(x)


CASES = [(p, "per-head" if p in ("diet-abs", "diet-rel", "t5") else "input", "none") for p in POSITIONS] + [
    ("diet-abs", "per-head", "layer"), ("diet-abs", "per-head", "head"),
    ("diet-rel", "per-head", "layer"), ("diet-rel", "none", "head"),
    ("none", "per-head", "layer"), ("tupe-a", "none", "none"), ("sinusoidal@0.03", "input", "none"),
    ("diet-rel%3", "per-head", "none"),
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
@pytest.mark.parametrize("position,segment,sharing", CASES)
def test_method_matches_paper_equation(position, segment, sharing, positions, device):
    extra = {"tupe_reset": False} if (position, segment) == ("tupe-a", "none") else {}
    if "@" in position:  # scaled input sinusoids (position_scale)
        position, scale = position.split("@")
        extra["position_scale"] = float(scale)
    if "%" in position:  # DIET-REL clipped at a distance
        position, clip = position.split("%")
        extra["diet_rel_max_distance"] = int(clip)
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


def test_diet_abs_lin_matches_eq4():
    """DIET-ABS-LIN: A = (X W_Q)((E X) W_K)ᵀ/√d + P_Q P_Kᵀ with P_K ∈ R^{k×d_p}; values projected by F."""
    model = DietModel(tiny(position="diet-abs", segment="input", attention="linformer", attn_backend="eager")).eval()
    ids, mask, segments = batch(L, pad_last=0)
    with torch.no_grad():
        out = model(ids, mask, segments, output_attentions=True, output_hidden_states=True)
        blk, pe = model.layers[0], model.positions.method
        att, H = blk.attention, model.config.num_attention_heads
        h0 = out.hidden_states[0]
        q, k, v = (split_heads(f(h0), H) for f in (att.query, att.key, att.value))
        k = torch.einsum("kn,bhnd->bhkd", att.proj_k[:, :L], k)
        dh = q.shape[-1]
        p_q, p_k = pe.logit("p_q")[0], pe.logit("p_k")[0]  # the effective factors
        A = q @ k.transpose(-1, -2) / math.sqrt(dh) + p_q[:, :L] @ p_k.transpose(-1, -2)
        torch.testing.assert_close(out.attentions[0], A.softmax(-1), atol=1e-5, rtol=1e-4)
        assert out.attentions[0].shape[-1] == model.config.linformer_k


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
