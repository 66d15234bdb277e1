"""DIET appendix B: Theorem 1 (rank of the logits) and Theorem 2 (equal gradients for X and P)."""

import torch

from dietpe import DietForMaskedLM, DietModel
from tests.conftest import tiny

N = 20  # sequence length n ≥ d_h + d_p


def _logits(model, hidden, layer=0, head=0):
    """The head's full logit matrix: q·kᵀ/√d_h + the layer's position terms, via the model's own terms."""
    att = model.layers[layer].attention
    b, n, _ = hidden.shape
    q = att.query(hidden).view(b, n, att.num_heads, -1).transpose(1, 2)
    k = att.key(hidden).view(b, n, att.num_heads, -1).transpose(1, 2)
    pos = torch.arange(n)
    terms = model.positions.layer_terms(model.positions.context(pos, pos, None), layer)
    scores = q @ k.transpose(-1, -2) * att.scale
    for term in terms.logits:
        scores = scores + term.dense(q)
    return scores[0, head].double()


def rank(a):  # numerical rank at float32 precision
    return int(torch.linalg.matrix_rank(a, rtol=1e-5))


def test_theorem1_input_positions_bound_rank_by_head_size():
    model = DietModel(tiny(position="absolute", max_position_embeddings=N)).eval()
    ids = torch.randint(1, 50, (1, N))
    with torch.no_grad():
        att = model.layers[0].attention
        att.query.bias.zero_(), att.key.bias.zero_()  # the theorem's logits have no projection biases
        hidden = model(ids, output_hidden_states=True).hidden_states[0]  # LN(X + P)
        a = _logits(model, hidden)
    d_h = model.config.head_size
    assert rank(a) <= d_h < N


def test_theorem1_per_head_positions_reach_dh_plus_dp_on_the_papers_construction():
    cfg = tiny(position="diet-abs", position_rank=8, max_position_embeddings=N, num_attention_heads=2)
    d, d_h, d_p = cfg.hidden_size, cfg.head_size, cfg.rank  # 16, 8, 8
    model = DietModel(cfg).eval()
    att = model.layers[0].attention
    with torch.no_grad():
        # W_Q = W_K = [I_dh; 0] for head 0, zero biases; X has the identity in its first d rows
        for lin in (att.query, att.key):
            lin.weight.zero_(), lin.bias.zero_()
            lin.weight[:d_h, :d_h] = torch.eye(d_h)
        x = torch.zeros(1, N, d)
        x[0, :d, :] = torch.eye(d)
        # P̂ = [0; I_dp]: zeros on the first n - d_p positions, identity on the last d_p
        p_hat = torch.zeros(N, d_p)
        p_hat[N - d_p:] = torch.eye(d_p)
        model.positions.method.p_q[0, 0] = p_hat
        model.positions.method.p_k[0, 0] = p_hat
        a = _logits(model, x)
    assert rank(a) == min(d_h + d_p, N) > d_h


def test_theorem1_random_diet_abs_exceeds_head_size():
    model = DietModel(tiny(position="diet-abs", position_rank=8, max_position_embeddings=N)).eval()
    with torch.no_grad():
        model.positions.method.p_q.normal_(), model.positions.method.p_k.normal_()
        hidden = model(torch.randint(1, 50, (1, N)), output_hidden_states=True).hidden_states[0]
        att = model.layers[0].attention
        att.query.bias.zero_(), att.key.bias.zero_()
        assert rank(_logits(model, hidden)) > model.config.head_size


def test_theorem2_input_positions_get_the_token_embeddings_gradient():
    model = DietForMaskedLM(tiny(position="absolute", segment="none", tie_word_embeddings=False))
    ids = torch.randperm(49)[:12][None] + 1  # each token once, so its embedding row meets one position
    loss = model(ids, labels=ids).loss
    loss.backward()
    word = model.diet.embeddings.word_embeddings.weight.grad[ids[0]]
    pos = model.diet.positions.method.weight.grad[:12]
    assert word.abs().sum() > 0
    torch.testing.assert_close(word, pos)


def test_theorem2_per_head_positions_get_their_own_gradient():
    """With DIET-ABS the position parameters see the logits' gradient, not the token embeddings'."""
    model = DietForMaskedLM(tiny(position="diet-abs", segment="none", tie_word_embeddings=False))
    ids = torch.randperm(49)[:12][None] + 1
    model(ids, labels=ids).loss.backward()
    p_q = model.diet.positions.method.p_q.grad
    assert p_q[:, :, :12].abs().sum() > 0 and p_q[:, :, 12:].abs().sum() == 0  # unused positions untouched
