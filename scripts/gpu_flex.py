"""FlexAttention on a GPU against the eager reference, forward and backward, and its compiled kernels counted.

    python scripts/gpu_flex.py [--speed]

Twelve configurations in one process (every method flex serves, some twice with other head counts, layer counts
and lengths): each model's flex output and the gradient of every parameter are compared with the eager
backend's, for the loss (out · W).sum() with a fixed random W (a loss whose gradients are not ~0), in fp32
with TF32 off. Then the compiled kernels: one per kind of score_mod, a few entries each however many layers and
models used it. One line per configuration, one summary line; exit status 1 when a check fails. About a minute
on an H100/H200, most of it compiling. `--speed` adds forward + backward times of flex and sdpa at bert-small,
4 x 512 (another minute).

Written here rather than as a pytest test: the coordinator's GPU checklist runs it as one bounded step.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from dietpe import DietConfig, DietModel
from dietpe.attention import backends

CONFIGURATIONS = [dict(position="diet-rel", segment="per-head"), dict(position="diet-abs", segment="per-head"),
                  dict(position="t5"), dict(position="tupe-r"), dict(position="tupe-a"), dict(position="alibi"),
                  dict(position="kerple"), dict(position="fire"), dict(position="xlnet"),
                  dict(position="none", segment="per-head"),
                  # the same kinds again at other sizes: their kernels are reused, not recompiled per model
                  dict(position="diet-rel", sharing="layer", num_attention_heads=4, num_hidden_layers=3, length=192),
                  dict(position="fire", num_attention_heads=4, length=160)]
OUT_TOL, GRAD_TOL = 1e-4, 1e-3  # max |Δ| / max |eager|
GRAD_FLOOR = 1e-3


def _config(cfg: dict, backend: str) -> DietConfig:
    cfg = {k: v for k, v in cfg.items() if k != "length"}
    heads = cfg.pop("num_attention_heads", 2)
    return DietConfig(vocab_size=1000, hidden_size=64 * heads, num_attention_heads=heads, intermediate_size=256,
                      num_hidden_layers=cfg.pop("num_hidden_layers", 2), max_position_embeddings=256,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_backend=backend, **cfg)


def _relative(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """max |a - b| over max |b| + floor. A gradient's floor is GRAD_FLOOR of the largest gradient's: some are
    zero up to rounding (a key projection's bias, FIRE's output bias: softmax ignores a shift of a row), and
    relative to their own size the two backends' rounding noise would read as an error."""
    return float((a - b).abs().max() / (b.abs().max() + floor).clamp_min(1e-30))


def check(cfg: dict) -> bool:
    """Flex against eager for one configuration: output and every parameter's gradient."""
    length = cfg.get("length", 128)
    torch.manual_seed(0)
    ref = DietModel(_config(cfg, "eager")).cuda().train()
    with torch.no_grad():  # position terms large enough that a wrong one shows
        for p in ref.positions.parameters():
            p.copy_(torch.randn_like(p))
    flex = DietModel(_config(cfg, "flex")).cuda().train()
    flex.load_state_dict(ref.state_dict())
    ids = torch.randint(1, 1000, (4, length), device="cuda")
    mask = torch.ones_like(ids)
    mask[-1, length * 3 // 4:] = 0
    seg = torch.zeros_like(ids)
    seg[:, length // 2:] = 1
    w = torch.randn(4, length, ref.config.hidden_size, device="cuda")
    outs, grads = [], []
    for model in (ref, flex):
        out = model(ids, mask, seg).last_hidden_state
        (out * w).sum().backward()
        outs.append(out.detach())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    d_out = _relative(outs[1], outs[0])
    missing = sorted(set(grads[0]) ^ set(grads[1]))
    floor = GRAD_FLOOR * max(float(g.abs().max()) for g in grads[0].values())
    d_grad, worst = max((_relative(grads[1][n], g, floor), n) for n, g in grads[0].items() if n in grads[1])
    ok = d_out <= OUT_TOL and d_grad <= GRAD_TOL and not missing
    name = ":".join(f"{v}" for v in cfg.values())
    print(f"flex {name}: out rel Δ {d_out:.1e}, grad rel Δ {d_grad:.1e} (worst {worst}; {len(grads[0])} "
          f"gradients{', missing ' + ', '.join(missing) if missing else ''}) -> {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def kernels() -> dict[str, int]:
    """Compiled entries per kind of score_mod."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return {backends.flex_kind_name(kind): len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__))
            for kind, fn in backends._FLEX_KERNELS.items()}


def speed() -> None:
    """Forward + backward of bert-small, 4 x 512, fp32 (TF32 on, as training runs), flex and sdpa."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    ids = torch.randint(1, 30000, (4, 512), device="cuda")
    mask = torch.ones_like(ids)
    mask[-1, 400:] = 0
    seg = torch.zeros_like(ids)
    seg[:, 256:] = 1
    for position, segment in (("diet-rel", "per-head"), ("t5", "none"), ("alibi", "none"), ("kerple", "none"),
                              ("diet-abs", "per-head"), ("fire", "none")):
        ms = {}
        for backend in ("sdpa", "flex"):
            cfg = DietConfig.from_preset("bert-small", position=position, segment=segment, attn_backend=backend,
                                         attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
            model = DietModel(cfg).cuda().train()
            for i in range(6):
                if i == 3:
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                model(ids, mask, seg).last_hidden_state.float().square().mean().backward()
            torch.cuda.synchronize()
            ms[backend] = (time.perf_counter() - start) / 3 * 1e3
        print(f"speed {position}{'+seg' if segment != 'none' else ''}: flex {ms['flex']:.1f} ms, sdpa "
              f"{ms['sdpa']:.1f} ms (forward + backward, bert-small, 4 x 512, fp32/TF32)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", action="store_true", help="also time flex and sdpa at bert-small, 4 x 512")
    parser.add_argument("--positions", help="comma-separated methods: only their configurations")
    args = parser.parse_args(argv)
    chosen = [c for c in CONFIGURATIONS if not args.positions or c["position"] in args.positions.split(",")]
    if not torch.cuda.is_available():
        print("gpu_flex: CUDA is not available on this machine", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # compare in true fp32
    start = time.perf_counter()
    results = []
    for cfg in chosen:
        try:
            results.append(check(cfg))
        except Exception as e:  # one line per configuration, whatever happens
            print(f"flex {':'.join(map(str, cfg.values()))}: {type(e).__name__}: {str(e).splitlines()[0][:300]} "
                  f"-> FAIL", flush=True)
            results.append(False)
    entries = kernels()
    layers = sum(_config(c, "flex").num_hidden_layers for c in chosen)
    print(f"flex summary: {sum(results)}/{len(results)} configurations ok; {len(entries)} compiled kinds, "
          f"{sum(entries.values())} compiled entries for {layers} layers' calls ({entries}); torch "
          f"{torch.__version__}, {time.perf_counter() - start:.0f} s", flush=True)
    if args.speed:
        speed()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
