import math

import torch
from transformers.models.t5.modeling_t5 import T5Attention

from dietpe.positions.functional import (
    ALIBI_FLOOR,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    clipped_offset_index,
    relative_gather,
    relative_offsets,
    relative_scatter,
    rotary_angles,
    sinusoids,
    t5_bucket,
)


def test_sinusoids_follow_vaswani_formula():
    p = sinusoids(torch.arange(7), 6)
    for k in range(7):
        for i in range(3):
            assert math.isclose(p[k, 2 * i], math.sin(k / 10000 ** (2 * i / 6)), abs_tol=1e-6)
            assert math.isclose(p[k, 2 * i + 1], math.cos(k / 10000 ** (2 * i / 6)), abs_tol=1e-6)


def test_sinusoids_odd_width():
    assert sinusoids(torch.arange(3), 5).shape == (3, 5)


def test_t5_bucket_equals_t5_reference():
    rel = torch.arange(-300, 301)
    for buckets, dist in ((32, 128), (8, 16), (64, 256)):
        ours = t5_bucket(rel, buckets, dist)
        theirs = T5Attention._relative_position_bucket(rel, True, buckets, dist)
        assert torch.equal(ours, theirs)
        assert int(ours.max()) == buckets - 1


def test_alibi_floor_keeps_attention_and_removes_denormal_weights():
    """Floored at -50, ALiBi's attention equals the unfloored equation to float32 resolution, and no softmax
    weight falls into the denormal range (e^-87 .. e^-103) that makes CPU matmuls several times slower."""
    length, heads = 512, 12
    slopes = alibi_slopes(heads)[:, None, None]
    distance = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).abs()
    floored = alibi_bias(distance, slopes)
    exact = -slopes.double() * distance.double()
    assert floored.min().item() == ALIBI_FLOOR and (floored == exact.float()).float().mean() > 0.4
    g = torch.Generator().manual_seed(0)
    content = torch.randn(heads, length, length, generator=g) * 2
    v = torch.randn(heads, length, 16, generator=g)
    p_floor = torch.softmax(content + floored, -1)
    unfloored = torch.softmax(content + exact.float(), -1)
    reference = (torch.softmax(content.double() + exact, -1) @ v.double()).float()
    assert torch.allclose(p_floor @ v, unfloored @ v, atol=1e-7, rtol=0)  # float32 cannot tell them apart
    assert torch.allclose(p_floor @ v, reference, atol=1e-5, rtol=0)
    tiny = torch.finfo(torch.float32).tiny
    assert ((unfloored > 0) & (unfloored < tiny)).any()  # what the floor is for
    assert not ((p_floor > 0) & (p_floor < tiny)).any()


def test_alibi_slopes_power_of_two_and_not():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # the authors' get_slopes written out: 8 slopes 2^-1 .. 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    assert torch.allclose(alibi_slopes(12), torch.tensor([2.0 ** -(i + 1) for i in range(8)]
                                                         + [2.0 ** -(t + 0.5) for t in range(4)]))
    assert torch.allclose(alibi_slopes(6), torch.tensor([0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]))


def test_rotary_logit_depends_only_on_offset():
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def logit(i, j):
        cq, sq = rotary_angles(torch.tensor([i]), 8)
        ck, sk = rotary_angles(torch.tensor([j]), 8)
        return float((apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum())

    assert math.isclose(logit(3, 1), logit(12, 10), rel_tol=1e-4)
    assert not math.isclose(logit(3, 1), logit(1, 3), rel_tol=1e-3)


def test_clipped_offsets_and_gather_scatter_adjoint():
    rel = relative_offsets(torch.arange(5), torch.arange(5))
    idx = clipped_offset_index(rel, 2)
    assert idx.min() == 0 and idx.max() == 4 and idx[4, 0] == 4 and idx[0, 4] == 0
    x, y = torch.randn(2, 3, 5, 5), torch.randn(2, 3, 5, 5)
    # <gather(x), y> == <x, scatter(y)>: the value term is the adjoint of the key term
    assert torch.allclose((relative_gather(x, idx) * y).sum(), (x * relative_scatter(y, idx, 5)).sum(), atol=1e-5)


def test_t5_causal_bucket_equals_t5_decoder_reference():
    from dietpe.positions.functional import t5_causal_bucket

    rel = torch.arange(-300, 301)  # key minus query; positive ones (future keys) share bucket 0
    for buckets, dist in ((32, 128), (8, 16), (64, 256)):
        ours = t5_causal_bucket(rel, buckets, dist)
        assert torch.equal(ours, T5Attention._relative_position_bucket(rel, False, buckets, dist))
        assert set(ours[rel <= 0].tolist()) == set(range(buckets))  # a causal query meets every bucket


def test_kerple_log_bias_is_the_papers_kernel():
    from dietpe.positions.functional import kerple_log_bias

    d = torch.arange(6)
    r1, r2 = torch.tensor([[0.5], [2.0]]), torch.tensor([[0.1], [1.0]])
    expected = torch.tensor([[-a * math.log(1 + b * x) for x in range(6)] for a, b in ((0.5, 0.1), (2.0, 1.0))])
    torch.testing.assert_close(kerple_log_bias(d, r1, r2), expected)


def test_onehot_gather_and_scatter_equal_the_index_ones_with_gradients():
    from dietpe.positions.functional import ONEHOT_ELEMENTS, OneHot

    index = clipped_offset_index(relative_offsets(torch.arange(9) + 2, torch.arange(11)), 3)  # (9, 11) into 7
    onehot = OneHot.of(index, 7, torch.float64)
    by_offset = torch.randn(2, 3, 9, 7, dtype=torch.float64, requires_grad=True)
    probs = torch.randn(2, 3, 9, 11, dtype=torch.float64, requires_grad=True)
    pairs, fast_pairs = relative_gather(by_offset, index), relative_gather(by_offset, index, onehot)
    assert torch.equal(fast_pairs, pairs)  # each pair picks its score; the other products are exact zeros
    sums, fast_sums = relative_scatter(probs, index, 7), relative_scatter(probs, index, 7, onehot)
    torch.testing.assert_close(fast_sums, sums)
    for slow, fast, wrt in ((pairs, fast_pairs, by_offset), (sums, fast_sums, probs)):
        grad = torch.randn_like(slow)
        torch.testing.assert_close(torch.autograd.grad(fast, wrt, grad)[0], torch.autograd.grad(slow, wrt, grad)[0])
    assert OneHot.of(index[None].expand(2, -1, -1), 7, torch.float32) is None  # per example: the index serves
    assert OneHot.of(torch.zeros(ONEHOT_ELEMENTS // 7 + 1, 1, dtype=torch.long), 7, torch.float32) is None
