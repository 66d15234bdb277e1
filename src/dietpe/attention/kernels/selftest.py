"""A short check of the fused kernels on a real GPU (no interpreter):

    python -m dietpe.attention.kernels.selftest

For every method the fused backend serves (the registry's), a one-layer model with four heads of 64, two
segments and a padded row, at 300 tokens (several tiles, cut at the edge): the output and every parameter's
gradient against the eager reference in float32 (TF32 off); in bfloat16, no further from float32's reference
than three times the eager reference's own bfloat16 run (a sanity check: both round differently); two backward
passes that must give the same bits; the causal LM; packed documents by per-example position_ids and their
mask (the tables read along the runs); attention dropout against the equation with the kernel's own mask; in
bfloat16 at 512 tokens (whole tiles: the unmasked paths), every tile configuration the autotuner may pick; the
rotary kernel against `apply_rotary`; on CUDA, CUDA graphs' replays of a forward and of a training step's
forward and backward (with attention dropout: a new mask at each replay). Prints one line per check and ends with
`selftest: OK` (exit 0) or `selftest: FAILED n of m: ...` (exit 1). Most of its time (over 3.5 minutes on an
H100) is Triton compiling each kernel variant. `--device cpu --length 24` runs the same checks under Triton's
interpreter (TRITON_INTERPRET=1), slowly: a check of this script itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

DEVICE = "cuda"
#: float32 tolerances: output absolute, gradients relative to each gradient's largest entry
FP32_OUT, FP32_GRAD = 1e-4, 1e-3


def _model(position: str, segment: str, backend: str, causal: bool = False, dropout: float = 0.0):
    from dietpe import DietConfig, DietModel
    from dietpe.models.causal import DietCausalConfig, DietCausalModel

    kw = dict(vocab_size=100, hidden_size=256, num_hidden_layers=1, num_attention_heads=4, intermediate_size=256,
              max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=dropout,
              position=position, attn_backend=backend)
    torch.manual_seed(0)
    model = DietCausalModel(DietCausalConfig(**kw)) if causal else DietModel(DietConfig(segment=segment, **kw))
    with torch.no_grad():  # position terms large enough that a wrong one shows
        for p in model.positions.parameters():
            p.add_(torch.randn_like(p) * 0.5 / getattr(model.positions.method, "logit_scale", 1.0))
    return model.to(DEVICE).train()


def _step(model, inputs, dtype=torch.float32):
    model.zero_grad()
    with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = model(**inputs).last_hidden_state.float()
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    (out * w).sum().backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _worst(got, want, floor: float = 1e-3) -> tuple[float, float, str]:
    """(max abs output difference, worst gradient difference, its parameter). A gradient's difference is
    relative to its own size plus `floor` of the largest gradient's: some are zero up to rounding (a key
    projection's bias: softmax ignores a shift of a row), where their own size is noise."""
    out = (got[0] - want[0]).abs().max().item()
    floor = floor * max(g.abs().max().item() for g in want[1].values())
    name, rel = "", 0.0
    for n, g in want[1].items():
        r = (got[1][n] - g).abs().max().item() / (g.abs().max().item() + floor)
        if r > rel:
            name, rel = n, r
    return out, rel, name


def _inputs(length: int, causal: bool, packed: bool = False):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (2, length), generator=g)
    if causal:
        return {"input_ids": ids.to(DEVICE)}
    mask = torch.ones_like(ids)
    mask[1, -(length // 8):] = 0
    seg = torch.zeros_like(ids)
    seg[:, length // 2:] = 1
    inputs = {"input_ids": ids.to(DEVICE), "attention_mask": mask.to(DEVICE), "token_type_ids": seg.to(DEVICE)}
    if packed:  # documents restarting at 0: three in the first row, two in the second; their block mask
        from dietpe.attention.masks import position_document_mask

        cuts = ((0, length // 3, 2 * length // 3, length), (0, length // 2, length))
        positions = torch.stack([torch.cat([torch.arange(b - a) for a, b in zip(c, c[1:])]) for c in cuts])
        inputs.update(position_ids=positions.to(DEVICE), attention_mask=position_document_mask(positions).to(DEVICE))
    return inputs


def check_method(position: str, segment: str, causal: bool, length: int,
                 packed: bool = False) -> list[tuple[str, bool]]:
    inputs = _inputs(length, causal, packed)
    ref, fused = _model(position, segment, "eager", causal), _model(position, segment, "fused", causal)
    fused.load_state_dict(ref.state_dict())
    want, got = _step(ref, inputs), _step(fused, inputs)
    again = _step(fused, inputs)
    half, ref_half = _step(fused, inputs, torch.bfloat16), _step(ref, inputs, torch.bfloat16)
    label = f"{'causal ' if causal else 'packed ' if packed else ''}{position}{'+seg' if segment == 'per-head' else ''}"
    out, rel, name = _worst(got, want)
    hout, hrel, hname = _worst(half, want, 1e-2)  # bfloat16 rounds at 4e-3
    rout, rrel, _ = _worst(ref_half, want, 1e-2)
    same = torch.equal(got[0], again[0]) and all(torch.equal(got[1][n], again[1][n]) for n in got[1])
    print(f"{label:>22}: fp32 out {out:.1e} grad {rel:.1e} ({name}) | bf16 out {hout:.1e} grad {hrel:.1e} "
          f"({hname}; eager bf16: {rout:.1e}, {rrel:.1e}) | two runs same bits: {same}", flush=True)
    return [(f"{label} fp32", out <= FP32_OUT and rel <= FP32_GRAD),
            (f"{label} bf16", hout <= 3 * rout + 1e-3 and hrel <= 3 * rrel + 2e-2),
            (f"{label} deterministic", same)]


def check_dropout(n: int) -> list[tuple[str, bool]]:
    """The kernel with attention dropout against the equation with the kernel's own mask (`dropout_keep`)."""
    from dietpe.attention.kernels.attention import Extras, dropout_keep, fused_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 64, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    table = torch.randn(4, 2 * n - 1, generator=g).to(DEVICE).requires_grad_()
    ex = Extras(dropout=0.1, seed=1234)
    keep = dropout_keep(ex.seed, ex.dropout, 2, 4, n, n, DEVICE)
    i, j = torch.arange(n, device=DEVICE)[:, None], torch.arange(n, device=DEVICE)[None, :]
    probs = (0.125 * q @ k.transpose(-1, -2) + table[:, i - j + n - 1]).softmax(-1)
    want = (probs * keep / 0.9) @ v
    got = fused_attention(q, k, v, 0.125, table, None, ex)
    w = torch.randn(want.shape, generator=g).to(DEVICE)
    grads = torch.autograd.grad((got * w).sum(), (q, k, v, table))
    want_grads = torch.autograd.grad((want * w).sum(), (q, k, v, table))
    err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip((got, *grads), (want, *want_grads)))
    print(f"{'dropout 0.1':>22}: kept {keep.float().mean().item():.3f}, max relative difference {err:.1e}",
          flush=True)
    return [("dropout", err <= FP32_GRAD and abs(keep.float().mean().item() - 0.9) < 0.05)]


def _equation(q, k, v, scale, table, segments, ex, keep):
    """The equation written out densely in float32 (the reference of `check_whole_tiles`)."""
    n = q.shape[2]
    i, j = torch.arange(n, device=DEVICE)[:, None], torch.arange(n, device=DEVICE)[None, :]
    s = scale * q.float() @ k.float().transpose(-1, -2) + table[:, i - j + n - 1]
    if segments is not None:
        s = s + segments[:, ex.q_segments.long()[:, :, None], ex.k_segments.long()[:, None, :]].transpose(0, 1)
    if ex.mask is not None:
        s = s + ex.mask.float()
    if ex.causal:
        s = s.masked_fill(j > i, float("-inf"))
    p = s.softmax(-1)
    if keep is not None:
        p = p * keep / (1 - ex.dropout)
    return p @ v.float()


def check_whole_tiles(n: int) -> list[tuple[str, bool]]:
    """bfloat16 at a length that is a multiple of every tile (the kernels' unmasked paths, which the models'
    300 tokens never take), in every tile configuration the autotuner may pick: output and gradients against
    the equation in float32 from the same inputs, and two runs the same bits."""
    from dietpe.attention.kernels.attention import Extras, dropout_keep, forcing, fused_attention, table_gradient

    cases = {"table": dict(), "table+dropout": dict(dropout=0.1), "causal table+dropout": dict(causal=True,
             dropout=0.1), "table+segments+padding": dict(segments=True, padding=True)}
    results = []
    for label, case in cases.items():
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, 4, n, 64, generator=g).to(DEVICE, torch.bfloat16).requires_grad_()
                   for _ in range(3))
        table = torch.randn(4, 2 * n - 1, generator=g).to(DEVICE).requires_grad_()
        segments = torch.randn(4, 2, 2, generator=g).to(DEVICE).requires_grad_() if case.get("segments") else None
        ex = Extras(causal=case.get("causal", False), dropout=case.get("dropout", 0.0), seed=99)
        if segments is not None:
            ex.q_segments = ex.k_segments = (torch.arange(n) >= n // 2).long().expand(2, n).contiguous().to(DEVICE)
        if case.get("padding"):
            ex.mask = torch.zeros(2, 1, 1, n, device=DEVICE, dtype=torch.bfloat16)
            ex.mask[1, ..., -n // 8:] = torch.finfo(torch.bfloat16).min
        keep = dropout_keep(ex.seed, ex.dropout, 2, 4, n, n, DEVICE) if ex.dropout else None
        leaves = [x for x in (q, k, v, table, segments) if x is not None]
        want = _equation(q, k, v, 0.125, table, segments, ex, keep)
        w = torch.randn(want.shape, generator=g).to(DEVICE)
        want_grads = torch.autograd.grad((want * w).sum(), leaves)
        # every tile the autotuner may pick, the table's gradient by block diagonals; in the dQ kernel at the first
        tiles = [(i, "bands") for i in range(3 if DEVICE == "cuda" else 1)] + [(0, "rows")]  # interpreter: one tile
        for index, path in tiles:
            with forcing(index), table_gradient(path):
                runs = []
                for _ in range(2):
                    out = fused_attention(q, k, v, 0.125, table, segments, ex)
                    runs.append((out, *torch.autograd.grad((out.float() * w).sum(), leaves)))
            same = all(torch.equal(a, b) for a, b in zip(*runs))
            err = max(((a.float() - b).abs().max() / b.abs().max()).item()
                      for a, b in zip(runs[0], (want, *want_grads)))
            name = f"{label} tiles #{index}{' rows' if path == 'rows' else ''}"
            print(f"{name:>39}: max relative difference {err:.1e}, two runs same bits: {same}", flush=True)
            results.append((name, err <= 3e-2 and same))
    return results


def _captured(fn):
    """fn's CUDA graph, captured after two calls on a side stream (torch's docs: tiles chosen, kernels kept)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _graph_result(label: str, check) -> tuple[str, bool]:
    try:
        ok, said = check()
    except Exception as e:  # a failed capture is this check's failure, not the selftest's end
        ok, said = False, f"capture failed: {e!r}"[:300]
    print(f"{label:>22}: {said}: {ok}", flush=True)
    return label, ok


def check_graph(n: int) -> list[tuple[str, bool]]:
    """CUDA graphs captured around a fused model: a forward, and a training forward and backward (torch's whole-
    network capture, the gradients written by the graph). Without dropout a replay gives the call's output and
    gradients, and two replays the same bits; with attention dropout two replays differ (each draws its seed on
    the device; a seed from the host would be replayed as captured)."""
    inputs, results = _inputs(n, False), []
    w = torch.randn(2, n, 256, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    for dropout in (0.0, 0.1):
        model = _model("diet-rel", "per-head", "fused", dropout=dropout)

        def forward():
            model.train(bool(dropout))
            out = {}

            def call():
                out["last"] = model(**inputs).last_hidden_state
            with torch.no_grad():
                want = model(**inputs).last_hidden_state
                graph, replays = _captured(call), []
                for _ in range(2):
                    graph.replay()
                    replays.append(out["last"].clone())  # the captured call's output, rewritten by each replay
            return _compare(replays, [want], dropout)

        def training():
            model.train()

            def step():
                model.zero_grad(set_to_none=True)  # the captured backward allocates the gradients it writes
                (model(**inputs).last_hidden_state * w).sum().backward()
            # captured before any step on the default stream, as torch's docs ask: with one before, the capture
            # failed on an H200 (torch 2.11, which warns of the AccumulateGrad node's stream); the call after
            graph = _captured(step)
            params = [p for p in model.parameters() if p.grad is not None]  # the pooler's have none
            replays = []
            for _ in range(2):
                graph.replay()
                replays.append(torch.cat([p.grad.flatten() for p in params]))
            step()
            return _compare(replays, [torch.cat([p.grad.flatten() for p in params])], dropout)

        results.append(_graph_result(f"CUDA graph, dropout {dropout}", forward))
        results.append(_graph_result(f"graphed step, dropout {dropout}", training))
    return results


def _compare(replays: list, want: list, dropout: float) -> tuple[bool, str]:
    """Two replays against the call: within float32's rounding of it and the same bits as each other without
    dropout (cuBLAS may pick another algorithm under capture); finite and different with it."""
    torch.cuda.synchronize()
    if dropout:
        return bool(torch.isfinite(replays[0]).all()) and not torch.equal(*replays), "two replays differ, finite"
    err = ((replays[0] - want[0]).abs().max() / want[0].abs().max()).item()
    same = torch.equal(*replays)
    return err <= 1e-5 and same, f"replay within {err:.1e} of the call, two replays same bits: {same}"


def check_rotary(n: int) -> list[tuple[str, bool]]:
    from dietpe.attention.kernels.rotary import rotary_qk
    from dietpe.positions.functional import apply_rotary, rotary_angles

    q = torch.randn(2, n, 4, 64, device=DEVICE).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 4, n, 64, device=DEVICE, requires_grad=True)
    angles = rotary_angles(torch.arange(n, device=DEVICE), 64)
    got, want = rotary_qk(q, k, *angles, *angles), (apply_rotary(q, *angles), apply_rotary(k, *angles))
    w = torch.randn_like(want[0]), torch.randn_like(want[1])
    g = torch.autograd.grad((got[0] * w[0]).sum() + (got[1] * w[1]).sum(), (q, k))
    r = torch.autograd.grad((want[0] * w[0]).sum() + (want[1] * w[1]).sum(), (q, k))
    err = max((a - b).abs().max().item() for a, b in zip((*got, *g), (*want, *r)))
    print(f"{'rotary kernel':>22}: max abs difference {err:.1e}", flush=True)
    return [("rotary", err <= 1e-5)]


def main(argv=None) -> int:
    global DEVICE
    parser = argparse.ArgumentParser(prog="python -m dietpe.attention.kernels.selftest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: under the interpreter")
    parser.add_argument("--length", type=int, default=300, help="tokens per row (default: 300)")
    parser.add_argument("--methods", help="comma-separated methods to check (default: every one served); with it "
                                          "the tile configurations are not run through")
    args = parser.parse_args(argv)
    DEVICE, n = args.device, args.length
    from dietpe.attention.kernels import device_problem

    problem = device_problem(torch.empty(0, device="meta" if DEVICE == "cuda" and not torch.cuda.is_available()
                                         else DEVICE))
    if problem:
        print(f"selftest: {problem}; without a GPU: --device cpu under TRITON_INTERPRET=1, or python -m pytest "
              f"tests/attention/kernels", file=sys.stderr)
        return 2
    from dietpe.attention.registry import ALL_BACKENDS
    from dietpe.positions.registry import REGISTRY

    # the models run the fixed tiles (the first of each list); `check_whole_tiles` runs every one
    os.environ.setdefault("DIETPE_FUSED_AUTOTUNE", "0")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU, Triton's interpreter"
    print(f"selftest: {name}, torch {torch.__version__}", flush=True)
    results = []
    fused = ALL_BACKENDS["fused"]
    chosen = set(args.methods.split(",")) if args.methods else set(REGISTRY)
    unknown = chosen - set(REGISTRY)
    if unknown:
        parser.error(f"--methods: {', '.join(sorted(unknown))} not among {', '.join(REGISTRY)}")
    for name, info in REGISTRY.items():
        if name in chosen and fused.refusal(value_terms=info.probabilities, dropout=0.0, method=info) is None:
            results += check_method(name, "per-head" if info.shareable else "input", False, n)
    for name in ("diet-rel", "alibi", "t5", "fire"):
        if name in chosen:
            results += check_method(name, "none", True, n)
    for name, segment in (("diet-rel", "per-head"), ("tupe-r", "input"), ("fire", "input")):
        if name in chosen:
            results += check_method(name, segment, False, n, packed=True)
    results += check_dropout(n)
    if DEVICE == "cuda":  # before the tile configurations, which take most of the compiling
        results += check_graph(n)
    if not args.methods:
        results += check_whole_tiles(512 if DEVICE == "cuda" else 32)
    results += check_rotary(n)
    failed = [label for label, ok in results if not ok]
    print(f"selftest: {'OK' if not failed else f'FAILED {len(failed)} of {len(results)}: ' + ', '.join(failed)} "
          f"({time.perf_counter() - start:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
