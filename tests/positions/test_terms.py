"""The logit-term contract and the typed cache keys: every term's declared sizes are those of its dense form,
its row blocks are rows of it, and shared tensors are shared only when their keys mean the same tensor."""

import itertools

import pytest
import torch

from dietpe import ConfigError, DietModel
from dietpe.positions.context import Built, CacheKey, ClippedIndex, Context, LayerSlices
from dietpe.positions.registry import REGISTRY
from dietpe.positions.t5 import T5Diagonals, T5Index, t5_index
from dietpe.positions.terms import LogitTerm, PositionBias
from tests.conftest import tiny

L = 7


def _terms(position, segment, per_example):
    try:
        model = DietModel(tiny(position=position, segment=segment))
    except ConfigError:
        return []
    pos = torch.stack([torch.arange(L) + 2, torch.arange(L) * 2]) if per_example else torch.arange(L)
    seg = torch.tensor([[0] * 3 + [1] * 4, [0] * 5 + [1] * 2])
    ctx = model.positions.context(pos, pos, seg, starts=None if per_example else (0, 0))
    return model.positions.layer_terms(ctx, 1).logits


@pytest.mark.parametrize("position,per_example", list(itertools.product(REGISTRY, (False, True))))
def test_declared_sizes_are_the_dense_forms_and_blocks_are_its_rows(position, per_example):
    q = torch.randn(2, 2, L, 8)
    terms = _terms(position, "per-head", per_example)
    assert len(terms) >= 1  # per-head segments at least
    for term in terms:
        dense = term.dense(q)
        b, h, lq, lk = dense.shape
        assert term.size == (lq, lk)
        if term.query_dependent:
            assert term.batch is None and term.heads is None and (b, h) == (2, 2)
        else:
            assert (term.batch, term.heads) == (b, h), type(term).__name__
            assert term.batch == (2 if per_example or term.kind == "segment" else 1)
        for start, stop in ((0, 3), (3, L)):
            torch.testing.assert_close(term.dense(q, (start, stop)), dense[..., start:stop, :], rtol=0, atol=1e-6)
        factors = term.factors()
        if factors is not None:
            torch.testing.assert_close(factors[0] @ factors[1].transpose(-1, -2), dense, rtol=1e-5, atol=1e-6)


def test_the_contract_is_abstract_and_a_function_of_positions_is_a_term():
    with pytest.raises(TypeError, match="build"):
        LogitTerm((2, 2))
    term = PositionBias(lambda qp, kp: (qp - kp).float().expand(-1, 3, -1, -1), torch.arange(4), torch.arange(5) + 1, 3)
    assert (term.size, term.batch, term.heads) == ((4, 5), 1, 3)
    want = (torch.arange(4)[:, None] - torch.arange(5)[None, :] - 1).float().expand(1, 3, 4, 5)
    assert torch.equal(term.dense(), want) and torch.equal(term.dense(None, (1, 3)), want[..., 1:3, :])
    mod = term.score_mod(None)
    assert float(mod(torch.tensor(0), torch.tensor(2), torch.tensor(3), torch.tensor(0))) == 2.0


def test_keys_of_different_classes_never_collide_and_equal_keys_share():
    ctx = Context(torch.arange(5), torch.arange(5))
    a = ctx.cached(T5Index(8, 16, False), lambda: torch.zeros(1))
    assert ctx.cached(T5Diagonals(8, 16, False), lambda: torch.ones(1)) is not a  # same fields, other tensor
    assert ctx.cached(T5Index(8, 16, True), lambda: torch.ones(1)) is not a
    assert ctx.cached(T5Index(8, 16, False), lambda: torch.ones(1)) is a
    owner, other = object(), object()
    assert ctx.cached(Built(owner), lambda: "x") == "x" and ctx.cached(Built(other), lambda: "y") == "y"
    assert ctx.cached(LayerSlices(owner, "r"), lambda: "z") == "z"  # the owner's term and its slices differ
    assert ctx.cached(ClippedIndex(3), lambda: 1) == 1
    with pytest.raises(TypeError, match="CacheKey"):
        ctx.cached("t5_index", lambda: None)
    assert isinstance(T5Index(8, 16, False), CacheKey)


def test_t5_and_tupe_r_read_one_bucket_index():
    """TUPE-R's relative part is T5's buckets: both build the same key, so one index serves both."""
    model = DietModel(tiny(position="tupe-r"))
    pos = torch.tensor([0, 1, 2, 5, 6])  # gaps: the gather path, which reads the index
    ctx = model.positions.context(pos, pos, None)
    method = model.positions.method
    (_, relative) = model.positions.layer_terms(ctx, 0).logits
    relative.dense()
    assert relative.index is t5_index(ctx, method.num_buckets, method.max_distance, method.causal)


def test_the_segment_one_hot_is_f_one_hot_built_once_per_forward_without_reading_the_ids():
    """DIET eq. 2's factor onehot(S(j)) is the same for every layer's Ŝ: built once per forward, by a comparison
    that never copies the ids to the host (`F.one_hot` checks their range there: two syncs a layer on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dietpe.positions import segments as segments_module
    from dietpe.positions.terms.low_rank import one_hot_keys

    ids = torch.tensor([[0, 1, 1, 2], [2, 0, 0, 1]])
    torch.testing.assert_close(one_hot_keys(ids, 3, torch.float32),
                               torch.nn.functional.one_hot(ids, 3).float().unsqueeze(1), rtol=0, atol=0)

    class HostReads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            HostReads.count += func.overloadpacket.__name__ in ("_local_scalar_dense", "nonzero", "equal")
            return func(*args, **(kwargs or {}))
    with HostReads():
        one_hot_keys(ids, 3, torch.bfloat16)
    assert HostReads.count == 0

    built = []
    real = segments_module.one_hot_keys
    model = DietModel(tiny(position="diet-rel", segment="per-head", attn_backend="sdpa", num_hidden_layers=3))
    seg = torch.tensor([[0] * 5 + [1] * 5] * 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(segments_module, "one_hot_keys", lambda *a: built.append(1) or real(*a))
        model(torch.randint(1, 50, (2, 10)), token_type_ids=seg)
    assert len(built) == 1  # three layers, three tables, one one-hot
