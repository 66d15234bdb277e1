"""The fused kernel under torch.compile: its custom operators (`dietpe.attention.kernels.op`) pass torch's own
operator checks (schema, fake shapes and strides against the real ones, autograd registration), and a model
with attn_backend="fused" compiles as one graph and gives eager's outputs and gradients (the same bits through
AOTAutograd; within rounding through inductor, which fuses the rest of the model)."""

import pytest
import torch

from dietpe import DietConfig, DietModel
from tests.attention.kernels.conftest import NO_TRITON

pytest.importorskip("triton", reason=NO_TRITON)


def _inputs(device, pieces: bool, nseg: int = 2, folded: bool = False, token_major: bool = False):
    """The forward operator's arguments: q, k, v as (B, L, H, D), contiguous where they are heads split from
    (B, L, H·D) projections (`token_major`), else views with other strides."""
    g = torch.Generator().manual_seed(0)
    b, h, lq, lk, d = 2, 2, 13, 13, 16
    leaf = lambda *s: torch.randn(*s, generator=g).to(device).requires_grad_()  # noqa: E731
    if token_major:  # heads split from (B, L, H·D) projections, as the models make them
        q, k, v = (leaf(b, n, h, d).transpose(1, 2) for n in (lq, lk, lk))
    else:
        q, k, v = leaf(b, h, lq, d), leaf(b, h, lk, d), leaf(b, h, lk, d)
    table = leaf(h if not pieces else 1, lq + lk - 1)
    segments = leaf(h, nseg, nseg)
    q_segments = torch.randint(0, nseg, (b, lq), generator=g).int().to(device)
    k_segments = torch.randint(0, nseg, (b, lk), generator=g).int().to(device)
    mask = torch.zeros(b, 1, 1, lk, device=device)
    mask[-1, ..., -3:] = torch.finfo(torch.float32).min
    den = kinks = slope = intercept = None
    if pieces:
        with torch.no_grad():
            table.abs_()
        den = (torch.rand(lq, generator=g) + 0.5).to(device).requires_grad_()
        kinks = (torch.rand(5, generator=g) * 3).sort().values.to(device)
        slope, intercept = leaf(6, h), leaf(6, h)
    q2, k2 = (leaf(1, h, lq, 12), leaf(1, h, lk, 12)) if folded else (None, None)  # shared by the batch
    return (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), table, segments, None, None, q_segments,
            k_segments, mask, den, kinks, slope, intercept, q2, k2, 0.3, False, 0.0)


@pytest.mark.parametrize("pieces,folded,token_major", [(False, False, False), (True, False, False),
                                                       (False, True, False), (False, False, True)],
                         ids=["table", "piecewise", "folded factors", "token-major"])
def test_the_operators_pass_torchs_checks(pieces, folded, token_major, device):
    """Fake shapes and strides match the real ones (the output and gradients contiguous (B, L, H, D), whatever
    q, k, v's strides)."""
    from dietpe.attention.kernels import op

    args = _inputs(device, pieces, folded=folded, token_major=token_major)
    torch.library.opcheck(op.fused_forward, args)
    q, k, v = args[:3]
    out, lse, seed = op.fused_forward(*args)
    backward = (torch.randn_like(out), q, k, v, out, lse, *args[3:16], seed, 0.3, False, 0.0, True, True)
    torch.library.opcheck(op.fused_backward, tuple(x.detach() if isinstance(x, torch.Tensor) else x
                                                   for x in backward))


def _model(position, segment, dropout):
    cfg = DietConfig.from_preset("bert-tiny", vocab_size=100, position=position, segment=segment,
                                 attn_backend="fused", max_position_embeddings=64, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=dropout)
    model = DietModel(cfg)
    with torch.no_grad():  # position terms large enough that a wrong one shows
        for p in model.positions.parameters():
            p.copy_(torch.randn_like(p) / getattr(model.positions.method, "logit_scale", 1.0))
    return model


def _step(model, run, ids, segments, w):
    torch.manual_seed(0)  # the same attention-dropout seeds, drawn by torch's generators
    model.zero_grad()
    out = run(ids, token_type_ids=segments).last_hidden_state
    (out * w).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                          if p.grad is not None and not n.startswith("pooler.")}


@pytest.mark.parametrize("position,segment,dropout,backend", [
    ("diet-rel", "per-head", 0.2, "aot_eager"), ("fire", "input", 0.0, "aot_eager"),
    ("tupe-r", "input", 0.0, "aot_eager"), ("diet-abs", "per-head", 0.0, "aot_eager"),
    ("diet-rel", "per-head", 0.0, "inductor")])
def test_a_fused_model_compiles_as_one_graph(position, segment, dropout, backend, device):
    model = _model(position, segment, dropout).to(device)
    ids = torch.randint(5, 99, (2, 16)).to(device)
    segments = (torch.arange(16) >= 8).long().expand(2, 16).to(device)
    w = torch.randn(2, 16, model.config.hidden_size, generator=torch.Generator().manual_seed(1)).to(device)
    want = _step(model, model, ids, segments, w)
    torch._dynamo.reset()
    got = _step(model, torch.compile(model, fullgraph=True, backend=backend), ids, segments, w)
    assert any(n.startswith("positions.") for n in want[1]) and got[1].keys() == want[1].keys()
    if backend == "aot_eager":
        assert torch.equal(got[0], want[0]) and all(torch.equal(got[1][n], want[1][n]) for n in want[1])
    else:
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-4)
        for n, g in want[1].items():
            torch.testing.assert_close(got[1][n], g, atol=1e-5 * max(1.0, g.abs().max().item()), rtol=1e-4, msg=n)


def test_a_compiled_fused_model_compiles_once(monkeypatch, device):
    """Building the model imports the kernels: a forward compiled before their import would guard on it and
    compile the whole model again at its second call."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from dietpe.attention import fused

    monkeypatch.setattr(fused, "_KERNELS", [])  # as in a process that never ran the kernel
    model = _model("diet-rel", "per-head", 0.0).to(device)
    assert fused._KERNELS, "building a fused model imports its kernels"
    ids = torch.randint(5, 99, (2, 16)).to(device)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    for _ in range(2):
        compiled(ids).last_hidden_state.sum().backward()
    assert counter.frame_count == 1


def _copied_op_outputs(gm) -> list[str]:
    """The clones in a traced graph of something the fused operators returned (through views only)."""
    copied = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or "clone" not in str(node.target):
            continue
        src = node.args[0]
        while src.op == "call_function" and not str(src.target).startswith("dietpe.") and src.args \
                and isinstance(src.args[0], torch.fx.Node):
            src = src.args[0]  # back through views, transposes and the tuple's getitem
        if str(getattr(src, "target", "")).startswith("dietpe."):
            copied.append(str(src.target))
    return copied


def test_compiled_the_heads_merge_back_without_copies(device):
    """Through the operators, as in eager mode, the output and q, k, v's gradients come token-major, (B, L, H, D)
    contiguous: merging the heads back into (B, L, H·D) is a view, in the forward and in the backward (a clone
    of each before: 4 a layer)."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = {}

    def grab(name):
        def compiler(gm, example_inputs):
            graphs[name] = gm
            return gm.forward
        return compiler

    model = _model("diet-rel", "per-head", 0.0).to(device)
    ids = torch.randint(5, 99, (2, 16)).to(device)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=grab("forward"), bw_compiler=grab("backward")),
                             fullgraph=True)
    compiled(ids).last_hidden_state.sum().backward()
    ops = [str(n.target) for gm in graphs.values() for n in gm.graph.nodes if str(n.target).startswith("dietpe.")]
    assert len(ops) == 2 * model.config.num_hidden_layers  # each layer's forward and backward operator
    assert _copied_op_outputs(graphs["forward"]) == [] and _copied_op_outputs(graphs["backward"]) == []
