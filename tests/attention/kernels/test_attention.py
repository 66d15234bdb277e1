"""The fused attention kernel (`dietpe.attention.kernels.attention`) against the equation written out densely:
values and the gradients of q, k, v, the offset table and the segment table, for fp32 and bf16, odd lengths,
head sizes 16 to 128 (and folded widths loaded in two parts), every mask kind; and two runs give the same bits."""

import pytest
import torch

from tests.attention.kernels.conftest import NO_TRITON, sizes
from tests.conftest import TEST_DEVICE

pytest.importorskip("triton", reason=NO_TRITON)


def reference(q, k, v, scale, table=None, segments=None, extras=None, keep=None):
    """softmax(s·q·kᵀ + T[h, i - j + Lk - 1]·a_i·c_j + Ŝ[h, σ_i, τ_j] + mask)·v in float32, from indices;
    with dropout's keep mask Z (B, H, Lq, Lk): (softmax(...) ∘ Z / (1 - p))·v."""
    lq, lk = q.shape[2], k.shape[2]
    scores = scale * q.float() @ k.float().transpose(-1, -2)
    i, j = torch.arange(lq, device=q.device)[:, None], torch.arange(lk, device=q.device)[None, :]
    if table is not None:
        t = table[:, i - j + lk - 1]  # (H|1, Lq, Lk)
        if extras.q_keep is not None:
            t = t * extras.q_keep[:, None] * extras.k_keep[None, :]
        scores = scores + t
    if segments is not None:
        scores = scores + segments[:, extras.q_segments.long()[:, :, None],
                                   extras.k_segments.long()[:, None, :]].transpose(0, 1)
    if extras is not None and extras.mask is not None:
        scores = scores + extras.mask.float()
    if extras is not None and extras.causal:
        scores = scores.masked_fill(j > i, float("-inf"))
    probs = scores.softmax(-1)
    if keep is not None:
        probs = probs * keep / (1 - extras.dropout)
    return (probs @ v.float()).to(v.dtype)


def _case(device, dtype, b, h, lq, lk, dq, dv, table_heads=None, nseg=0, keep=False, mask=None, causal=False):
    from dietpe.attention.kernels.attention import Extras

    g = torch.Generator().manual_seed(0)
    leaf = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype).requires_grad_()  # noqa: E731
    q, k, v = leaf(b, h, lq, dq), leaf(b, h, lk, dq), leaf(b, h, lk, dv)
    table = (torch.randn(table_heads, lq + lk - 1, generator=g) * 2).to(device).requires_grad_() \
        if table_heads else None
    segments = torch.randn(h, nseg, nseg, generator=g).to(device).requires_grad_() if nseg else None
    ex = Extras(causal=causal)
    if keep:  # TUPE's reset: position 0 ([CLS]) keeps no offset term
        ex.q_keep = (torch.arange(lq) != 0).float().to(device)
        ex.k_keep = (torch.arange(lk) != 0).float().to(device)
    if nseg:
        ex.q_segments = torch.randint(0, nseg, (b, lq), generator=g).int().to(device)
        ex.k_segments = torch.randint(0, nseg, (b, lk), generator=g).int().to(device)
    if mask == "padding":  # (B, 1, 1, Lk): the last row's last keys padded
        ex.mask = torch.zeros(b, 1, 1, lk)
        ex.mask[-1, ..., -3:] = torch.finfo(torch.float32).min
    elif mask == "documents":  # (B, 1, Lq, Lk) block-diagonal: two packed documents per row
        doc_q, doc_k = (torch.arange(lq) >= lq // 3).long(), (torch.arange(lk) >= lk // 3).long()
        ex.mask = torch.where(doc_q[:, None] == doc_k[None, :], 0.0, torch.finfo(torch.float32).min)
        ex.mask = ex.mask.expand(b, 1, lq, lk)
    if ex.mask is not None:
        ex.mask = ex.mask.to(device, dtype)
    return (q, k, v, table, segments), ex


def _run(inputs, ex, scale=0.3):
    from dietpe.attention.kernels.attention import fused_attention

    q, k, v, table, segments = inputs
    out = fused_attention(q, k, v, scale, table, segments, ex)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    grads = torch.autograd.grad((out.float() * w.float()).sum(), [x for x in inputs if x is not None])
    return out, grads


def _reference_run(inputs, ex, scale=0.3, keep=None):
    q, k, v, table, segments = inputs
    out = reference(q, k, v, scale, table, segments, ex, keep)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    grads = torch.autograd.grad((out.float() * w.float()).sum(), [x for x in inputs if x is not None])
    return out, grads


L, M = sizes(13, 301), sizes(11, 157)  # odd lengths: tiles cut at the edges
E = sizes(32, 256)  # a multiple of every tile
CASES = {
    "fp32-16-table-keep-segments-padding": dict(dtype=torch.float32, b=2, h=2, lq=L, lk=L, dq=16, dv=16,
                                                table_heads=2, nseg=2, keep=True, mask="padding"),
    "fp32-72in2parts-64-table-documents": dict(dtype=torch.float32, b=2, h=2, lq=L + 10, lk=M, dq=72, dv=64,
                                               table_heads=2, mask="documents"),
    "fp32-32-shared-table-3segments-causal": dict(dtype=torch.float32, b=1, h=3, lq=L + 20, lk=L + 20, dq=32,
                                                  dv=32, table_heads=1, nseg=3, causal=True),
    "fp32-130in2parts-8-nothing": dict(dtype=torch.float32, b=1, h=2, lq=M, lk=L, dq=130, dv=8),
    "bf16-128-table-segments-padding": dict(dtype=torch.bfloat16, b=2, h=2, lq=L, lk=L, dq=128, dv=128,
                                            table_heads=2, nseg=2, mask="padding"),
    "bf16-64-table-causal": dict(dtype=torch.bfloat16, b=2, h=1, lq=L + 4, lk=L + 4, dq=64, dv=64, table_heads=1,
                                 causal=True),
    # lengths that are multiples of the tiles: the kernels' unmasked paths (interior tiles, blocks below the
    # causal diagonal), alone and beside masked ones
    "fp32-32-table-keep-segments-padding-even": dict(dtype=torch.float32, b=2, h=2, lq=E, lk=2 * E, dq=32,
                                                     dv=32, table_heads=2, nseg=2, keep=True, mask="padding"),
    "fp32-16-shared-table-causal-even": dict(dtype=torch.float32, b=1, h=2, lq=2 * E, lk=2 * E, dq=16, dv=16,
                                             table_heads=1, causal=True),
    "fp32-24in2parts-table-causal-half-even": dict(dtype=torch.float32, b=1, h=1, lq=3 * E // 2, lk=3 * E // 2,
                                                   dq=24, dv=16, table_heads=1, causal=True),
    "bf16-64-table-documents-even": dict(dtype=torch.bfloat16, b=1, h=2, lq=E, lk=E, dq=64, dv=64, table_heads=2,
                                         mask="documents"),
}


def _assert_matches(out, grads, want, want_grads):
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    for got, ref in zip(grads, want_grads):
        torch.testing.assert_close(got, ref, atol=1e-5 * max(ref.abs().max().item(), 1), rtol=1e-4)


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_the_equation_with_gradients(name, device):
    case = CASES[name]
    inputs, ex = _case(device, **case)
    out, grads = _run(inputs, ex)
    want, want_grads = _reference_run(inputs, ex)
    bf16 = case["dtype"] == torch.bfloat16
    tol = dict(atol=2e-2, rtol=2e-2) if bf16 else dict(atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out, want, **tol)
    names = [n for n, x in zip(("q", "k", "v", "table", "segments"), inputs) if x is not None]
    for n, got, ref in zip(names, grads, want_grads):
        scale = ref.abs().max().item()  # the tables' gradients are sums over many pairs: compare to their size
        if bf16:
            torch.testing.assert_close(got.float(), ref.float(), atol=3e-2 * max(scale, 1), rtol=3e-2, msg=n)
        else:
            torch.testing.assert_close(got, ref, atol=1e-5 * max(scale, 1), rtol=1e-4, msg=n)


TABLE_CASES = [n for n, c in CASES.items() if c.get("table_heads")]


@pytest.mark.parametrize("name", TABLE_CASES)
def test_both_table_gradient_paths_are_the_equation(name, device):
    """The offset table's gradient by block diagonals (the band kernel, the default) and inside the dQ kernel
    (rows): each the equation's, and q's, k's and v's gradients the same bits on both paths (the dQ kernel's
    tile only groups the rows)."""
    from dietpe.attention.kernels import attention as A

    case = CASES[name]
    inputs, ex = _case(device, **case)
    with A.table_gradient("bands"):
        bands = _run(inputs, ex)
    with A.table_gradient("rows"):
        rows = _run(inputs, ex)
    want, want_grads = _reference_run(inputs, ex)
    bf16 = case["dtype"] == torch.bfloat16
    for got in (bands[1][3], rows[1][3]):
        scale = max(want_grads[3].abs().max().item(), 1)
        tol = dict(atol=3e-2 * scale, rtol=3e-2) if bf16 else dict(atol=1e-5 * scale, rtol=1e-4)
        torch.testing.assert_close(got.float(), want_grads[3].float(), **tol)
    assert torch.equal(bands[0], rows[0])
    for i in (0, 1, 2):  # q, k, v (the segment table's partial sums follow the dQ kernel's tile)
        assert torch.equal(bands[1][i], rows[1][i])


@pytest.mark.parametrize("tiles", [1, 2])
def test_a_block_diagonal_split_among_programs(tiles, device, monkeypatch):
    """Long block diagonals are split into runs of BAND_TILES tiles, one program each, whose sums the last kernel
    adds: one tile a program (every tile sheared alone) or two give the equation's table gradient, padding and
    causality included."""
    from dietpe.attention.kernels import attention as A

    monkeypatch.setattr(A, "BAND_TILES", tiles)
    monkeypatch.setattr(A, "_specs", {})  # launches kept from other calls were built with the default
    for case in (dict(lq=3 * E + 7, lk=2 * E + 3, mask="padding", keep=True), dict(lq=3 * E, lk=3 * E, causal=True)):
        inputs, ex = _case(device, torch.float32, b=2, h=2, dq=16, dv=16, table_heads=2, **case)
        with A.table_gradient("bands"):
            out, grads = _run(inputs, ex)
        _assert_matches(out, grads, *_reference_run(inputs, ex))


@pytest.mark.parametrize("path", ["bands", "rows"])
def test_the_table_gradient_under_dropout(path, device):
    """The band kernel draws dropout's mask at each pair as the forward did: the equation with the kernel's own
    mask, tiles of the causal diagonal and below it, and the same bits twice."""
    from dietpe.attention.kernels import attention as A

    inputs, ex = _case(device, torch.float32, b=2, h=2, lq=2 * E + 5, lk=2 * E + 5, dq=16, dv=16, table_heads=2,
                       keep=True, causal=True)
    ex.dropout, ex.seed = 0.25, 2**33 + 5
    keep = A.dropout_keep(ex.seed, ex.dropout, 2, 2, 2 * E + 5, 2 * E + 5, device)
    with A.table_gradient(path):
        first, again = _run(inputs, ex), _run(inputs, ex)
    _assert_matches(*first, *_reference_run(inputs, ex, keep=keep))
    assert all(torch.equal(a, b) for a, b in zip(first[1], again[1]))


@pytest.mark.parametrize("name", ["fp32-32-shared-table-3segments-causal", "fp32-16-shared-table-causal-even",
                                  "fp32-24in2parts-table-causal-half-even", "fp32-16-table-keep-segments-padding"])
@pytest.mark.parametrize("path", ["bands", "rows"])
def test_a_causal_grid_in_either_order_gives_the_same_bits(name, path, device):
    """The forward's and dQ kernel's query blocks run the longest first under causality (the last block first)
    or in index order: each block computes and writes the same, so the same bits, and the equation's; the order
    is the call's (the launches' LONGEST), only where attention is causal."""
    from dietpe.attention.kernels import attention as A

    inputs, ex = _case(device, **CASES[name])
    runs = {}
    for order in ("longest", "index"):
        with A.table_gradient(path), A.causal_order(order):
            runs[order] = _run(inputs, ex)
            sig = A.signature(*inputs[:3], 0.3, *inputs[3:], ex)
        call = A._specs[sig]
        dq_specs = [kept.specs[0] for kept in call.backward.values()]
        assert [call.forward.constants["LONGEST"]] + [s.constants["LONGEST"] for s in dq_specs] == \
            [ex.causal and order == "longest"] * (1 + len(dq_specs)) and dq_specs
    _assert_matches(*runs["longest"], *_reference_run(inputs, ex))
    assert torch.equal(runs["longest"][0], runs["index"][0])
    for a, b in zip(runs["longest"][1], runs["index"][1], strict=True):
        assert torch.equal(a, b)


def test_the_causal_order_setting_names_its_values(monkeypatch):
    from dietpe.attention.kernels import attention as A
    from dietpe.errors import ConfigError

    monkeypatch.setattr(A.ORDER, "stack", [])
    monkeypatch.setenv("DIETPE_FUSED_ORDER", "reverse")
    with pytest.raises(ConfigError, match="DIETPE_FUSED_ORDER='reverse': allowed values are longest, index"):
        A.ORDER.current()
    with pytest.raises(ConfigError, match="allowed values are longest, index"):
        with A.causal_order("backwards"):
            pass


def test_two_runs_give_the_same_bits(device):
    inputs, ex = _case(device, torch.float32, b=2, h=2, lq=L + 6, lk=L, dq=24, dv=16, table_heads=2, nseg=2,
                       keep=True, mask="padding")
    first, second = _run(inputs, ex), _run(inputs, ex)
    assert torch.equal(first[0], second[0])
    for a, b in zip(first[1], second[1]):
        assert torch.equal(a, b)


def test_inference_runs_the_forward_alone(device):
    inputs, ex = _case(device, torch.float32, b=1, h=2, lq=L, lk=L, dq=16, dv=16, table_heads=2, nseg=2)
    from dietpe.attention.kernels.attention import fused_attention

    with torch.inference_mode():
        out = fused_attention(*inputs[:3], 0.3, *inputs[3:], ex)
    torch.testing.assert_close(out, reference(*inputs[:3], 0.3, *inputs[3:], ex), atol=2e-5, rtol=1e-4)
    with torch.no_grad():  # the forward without the autograd Function: no graph, the training forward's bits
        quiet = fused_attention(*inputs[:3], 0.3, *inputs[3:], ex)
    trained = fused_attention(*inputs[:3], 0.3, *inputs[3:], ex)
    assert quiet.grad_fn is None and trained.grad_fn is not None
    assert torch.equal(quiet, trained) and torch.equal(out, trained)


def test_dropout_on_whole_tiles_and_a_causal_diagonal(device):
    """Dropout's mask drawn four keys per Philox call lines up between the forward and both backward kernels on
    unmasked tiles (the key-major dK/dV tile transposes it) and on the causal diagonal."""
    from dietpe.attention.kernels.attention import dropout_keep

    inputs, ex = _case(device, torch.float32, b=1, h=2, lq=2 * E, lk=2 * E, dq=16, dv=16, table_heads=2,
                       causal=True)
    ex.dropout, ex.seed = 0.2, 2**40 + 7
    keep = dropout_keep(ex.seed, ex.dropout, 1, 2, 2 * E, 2 * E, device)
    out, grads = _run(inputs, ex)
    want, want_grads = _reference_run(inputs, ex, keep=keep)
    _assert_matches(out, grads, want, want_grads)


def test_a_table_without_a_gradient_is_read_and_not_summed(device):
    """A fixed table (ALiBi's slopes): the kernels add it and compute no gradient for it."""
    inputs, ex = _case(device, torch.float32, b=1, h=2, lq=E, lk=E, dq=16, dv=16, table_heads=2)
    q, k, v, table, _ = inputs
    table = table.detach()
    from dietpe.attention.kernels.attention import fused_attention

    out = fused_attention(q, k, v, 0.3, table, None, ex)
    want = reference(q, k, v, 0.3, table, None, ex)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    got = torch.autograd.grad((out * w).sum(), [q, k, v])
    ref = torch.autograd.grad((want * w).sum(), [q, k, v])
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5 * max(b.abs().max().item(), 1), rtol=1e-4)


def test_head_parts_cover_the_folded_widths():
    from dietpe.attention.kernels.attention import head_parts

    assert [head_parts(d) for d in (8, 16, 24, 64, 72, 96, 128, 130, 192)] == [
        (16, 0), (16, 0), (16, 16), (64, 0), (64, 16), (64, 32), (128, 0), (128, 16), (128, 64)]


def test_dropout_is_the_equation_with_the_kernels_own_mask(device):
    """The kernel drops P's entries by Philox at each pair's index; the backward draws the same mask again."""
    from dietpe.attention.kernels.attention import dropout_keep

    inputs, ex = _case(device, torch.float32, b=2, h=2, lq=L, lk=L + 3, dq=16, dv=16, table_heads=2, nseg=2,
                       mask="padding")
    ex.dropout, ex.seed = 0.3, 12345
    keep = dropout_keep(ex.seed, ex.dropout, 2, 2, L, L + 3, device)
    assert 0.6 < keep.float().mean().item() < 0.8
    assert not torch.equal(keep, dropout_keep(ex.seed + 1, ex.dropout, 2, 2, L, L + 3, device))
    out, grads = _run(inputs, ex)
    want, want_grads = _reference_run(inputs, ex, keep=keep)
    _assert_matches(out, grads, want, want_grads)


def test_the_tile_choice_is_fixed_under_deterministic_algorithms(monkeypatch):
    """The GPU's launch path (no interpreter): with DIETPE_FUSED_AUTOTUNE=0 (as under deterministic
    algorithms) the first configuration that fits shared memory is taken, remembered per key, and `forcing`
    overrides it without being remembered."""
    from triton.runtime.errors import OutOfResources

    from dietpe.attention.kernels import attention as A

    monkeypatch.setattr(A, "interpreting", lambda: False)
    monkeypatch.setattr(A, "_chosen", {})
    monkeypatch.setattr(A, "_AUTOTUNE", [False])  # DIETPE_FUSED_AUTOTUNE=0
    launched = []

    def launch(config):
        launched.append(config)
        if config == "big":
            raise OutOfResources(300000, 232448, "shared memory")

    A._launch(("k",), ["big", "fits", "small"], launch, "interp")
    A._launch(("k",), ["big", "fits", "small"], launch, "interp")
    with A.forcing(2):
        A._launch(("k",), ["big", "fits", "small"], launch, "interp")
    with A.forcing(0):  # a forced configuration that does not fit: the next one that does, as the tuner skips
        A._launch(("k",), ["big", "fits", "small"], launch, "interp")
    assert launched == ["big", "fits", "fits", "small", "big", "fits"]
    assert A.chosen_configs() == {("k", "fixed"): ("fits", {})}


def test_views_with_gaps_and_expanded_heads(device):
    """q, k, v as a model hands them over: views of one fused projection (GPT-2's split: rows with gaps), keys
    and values repeated over grouped heads. The gradients are written densely at their own strides, not at the
    inputs' (which overran the gradients' buffers: a crash under the interpreter, an illegal write on a GPU)."""
    from dietpe.attention.kernels.attention import Extras, fused_attention

    g = torch.Generator().manual_seed(0)
    b, h, n, d = 2, 4, E, 16
    qkv = torch.randn(b, n, 3 * h * d, generator=g).to(device).requires_grad_()
    q, k, v = (x.view(b, n, h, d).transpose(1, 2) for x in qkv.split(h * d, dim=-1))
    k, v = k[:, :2, None].expand(b, 2, 2, n, d).reshape(b, h, n, d), v[:, :2, None].expand(b, 2, 2, n, d)
    v = v.reshape(b, h, n, d)
    table = torch.randn(h, 2 * n - 1, generator=g).to(device).requires_grad_()
    ex = Extras(causal=True)
    w = torch.randn(b, h, n, d, generator=g).to(device)
    got = torch.autograd.grad((fused_attention(q, k, v, 0.3, table, None, ex) * w).sum(), [qkv, table])
    want = torch.autograd.grad((reference(q, k, v, 0.3, table, None, ex) * w).sum(), [qkv, table])
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r, atol=1e-5 * max(r.abs().max().item(), 1), rtol=1e-4)


def assert_same_reads(by_score, by_window):
    """Both table reads' (out, gradients): the same bits under the interpreter (the same values in the same
    order); on a GPU within float32 rounding (two compiled kernels may contract a multiply-add differently)."""
    for a, b in zip((by_score[0], *by_score[1]), (by_window[0], *by_window[1]), strict=True):
        if TEST_DEVICE == "cuda":
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6 * max(a.abs().max().item(), 1))
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["fp32-16-table-keep-segments-padding", "fp32-72in2parts-64-table-documents",
                                  "fp32-32-shared-table-3segments-causal", "fp32-32-table-keep-segments-padding-even",
                                  "bf16-64-table-causal"])
def test_both_table_reads_give_the_same_bits(name, device):
    """The table read as one window per tile and expanded by a gather is the table read per score: the same
    values in the same order, so the same output and gradients (forward, dQ and dK/dV; `assert_same_reads`)."""
    from dietpe.attention.kernels.attention import table_read

    inputs, ex = _case(device, **CASES[name])
    with table_read("score"):
        by_score = _run(inputs, ex)
    with table_read("window"):
        by_window = _run(inputs, ex)
    assert len(by_score[1]) == len(by_window[1]) >= 4
    assert_same_reads(by_score, by_window)


def test_the_table_read_setting_names_its_values(monkeypatch):
    from dietpe.attention.kernels import attention as A
    from dietpe.errors import ConfigError

    monkeypatch.setenv("DIETPE_FUSED_TABLE", "score")
    assert A.TABLE_READ.read() == "score"
    monkeypatch.setenv("DIETPE_FUSED_TABLE", "tiles")
    with pytest.raises(ConfigError, match="DIETPE_FUSED_TABLE='tiles': allowed values are window, score"):
        A.TABLE_READ.read()
    monkeypatch.setattr(A.TABLE_READ, "stack", [])  # read at the first use, not at import: the CLI's one line
    with pytest.raises(ConfigError, match="DIETPE_FUSED_TABLE='tiles'"):
        A.current_table_read()
    with pytest.raises(ConfigError, match="allowed values are window, score"):
        with A.table_read("rows"):
            pass
    monkeypatch.delenv("DIETPE_FUSED_TABLE_GRAD", raising=False)
    assert A.TABLE_GRAD.read() == "bands"  # the default
    monkeypatch.setenv("DIETPE_FUSED_TABLE_GRAD", "rows")
    monkeypatch.setattr(A.TABLE_GRAD, "stack", [])
    assert A.TABLE_GRAD.current() == "rows"
    monkeypatch.setenv("DIETPE_FUSED_TABLE_GRAD", "atomics")
    monkeypatch.setattr(A.TABLE_GRAD, "stack", [])
    with pytest.raises(ConfigError, match="DIETPE_FUSED_TABLE_GRAD='atomics': allowed values are bands, rows"):
        A.TABLE_GRAD.current()


#: the first tile of each of the GPU's lists at head size 64 in bf16 (the interpreter's own tiles are 16-32)
GPU_TILES = dict(fwd=(128, 64, 8, 3), kv=(32, 128, 8, 3), q=(128, 32, 8, 3), q_square=(64, 64, 8, 3),
                 band=(64, 64, 8, 3))


def test_the_gpus_tiles_read_the_table_by_window_too(device, monkeypatch):
    """With the GPU's tile sizes (a window of 256 offsets per forward tile, tiles cut at the lengths' edges):
    both table reads agree (`assert_same_reads`), and the equation's values and gradients."""
    from dietpe.attention.kernels import attention as A

    for name, tiles in GPU_TILES.items():
        monkeypatch.setitem(A.INTERPRETER_CONFIGS, name, tiles)
    n = sizes(200, 300)
    inputs, ex = _case(device, torch.float32, b=1, h=2, lq=n, lk=n, dq=32, dv=32, table_heads=2, nseg=2,
                       keep=True, mask="padding")
    with A.table_read("score"):
        by_score = _run(inputs, ex)
    with A.table_read("window"):
        by_window = _run(inputs, ex)
    assert_same_reads(by_score, by_window)
    _assert_matches(*by_window, *_reference_run(inputs, ex))
