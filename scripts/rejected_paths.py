"""Two ways to serve per-head segments at 512 tokens that were measured and not kept (issue 13, third pass).

    python scripts/rejected_paths.py model SHAPE LENGTH BATCH CYCLES   key runs against the fold, in the model
    python scripts/rejected_paths.py flex LENGTH BATCH CYCLES          compiled FlexAttention on CPU, kernel alone

`model`: inference with DIET-REL and per-head segments, the fold (what runs) against one fused-kernel call per
example and run of keys in one segment, merged through the calls' log-sum-exps (online softmax): within a run
Ŝ[S(i), g] is a per-query constant, so the calls need neither extra q/k channels nor a (B, H, L, L) bias.
Medians of per-cycle ratios to DIET-REL, interquartile range in brackets, 1 thread. Up to
`backends.ADD_LOW_RANK_KEYS` (256) keys the running path adds the segments to the bias instead of folding.

`flex`: the kernel alone, 8 heads of 64: torch's SDPA with no bias, a DIET-REL bias and a (B, H, L, L)
DIET-REL + segments bias, against `torch.compile(flex_attention)` reading the same terms through score_mods.
"""
import statistics
import sys

import torch
import torch.nn.functional as F

from dietpe.attention import backends
from dietpe.bench import cost
from dietpe.errors import ConfigError
from dietpe.positions.base import SegmentBias

torch.set_num_threads(1)
FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def key_runs(segments: torch.Tensor) -> list[list[tuple[int, int, int]]]:
    """(start, end, segment) of each run of keys in one segment, per example."""
    ids = segments.tolist()
    out = []
    for row in ids:
        starts = [0] + [j for j in range(1, len(row)) if row[j] != row[j - 1]]
        out.append([(a, b, row[a]) for a, b in zip(starts, starts[1:] + [len(row)])])
    return out


def sdpa_key_runs(q, k, v, terms, mask, scale, dropout_p, need_probs=False):
    segment = [t for t in terms.logits if isinstance(t, SegmentBias)]
    dense = [t for t in terms.logits if not isinstance(t, SegmentBias)]
    if len(segment) != 1 or torch.is_grad_enabled():
        return backends.sdpa(q, k, v, terms, mask, scale, dropout_p, need_probs)
    s = scale * terms.score_scale
    bias = backends._summed_bias(dense, mask, q, q.dtype, terms.cache)
    fq = segment[0].factors()[0]  # (B, H, Lq, k): column g is Ŝ[S(i), g]
    b, h, lq, _ = q.shape
    out = q.new_empty(b, lq, h, v.shape[-1]).transpose(1, 2)
    for e, runs in enumerate(key_runs(segment[0].k_segments)):
        acc = lse = None
        for start, end, g in runs:
            keys = slice(start, end)
            m_e = None if bias is None else (bias[e:e + 1] if bias.shape[0] > 1 else bias)[..., keys]
            o, m = FLASH_CPU(q[e:e + 1], k[e:e + 1, :, keys], v[e:e + 1, :, keys], attn_mask=m_e, scale=s)
            m = m + fq[e, :, :, g]
            if acc is None:
                acc, lse = o, m
                continue
            total = torch.logaddexp(lse, m)
            acc, lse = torch.lerp(acc, o, (m - total).exp_().unsqueeze(-1)), total
        out[e:e + 1] = acc
    return out, None


def interleaved(steps: dict, cycles: int, base: str) -> None:
    times = cost.interleaved_times(steps, cycles, 2)
    for name, t in times.items():
        lo, hi = cost.ratio_spread(t, times[base])
        print(f"{name:34s} {cost.median_ratio(t, times[base]):.3f} [{lo:.3f}, {hi:.3f}] "
              f"{1e3 * statistics.median(t):.2f} ms", flush=True)


def model(shape: str, length: int, batch: int, cycles: int) -> None:
    inputs = cost.make_inputs(batch, length, cost.DietConfig.from_preset(shape).vocab_size)

    def build(method: str, split: bool):
        m = cost.build_model(cost.model_config(shape, cost.Variant.parse(method), 512)).eval()
        for layer in m.modules():
            if split and hasattr(layer, "backend_name"):
                layer.backend = sdpa_key_runs
        return m

    with torch.no_grad():  # the two paths compute the same thing
        err = cost.first_output(build("diet-rel+seg", True)(**inputs)) - cost.first_output(
            build("diet-rel+seg", False)(**inputs))
    print(f"key runs vs fold, largest difference in the last hidden states {err.abs().max().item():.2e}")
    steps = {name: cost.inference_step(build(method, split), inputs) for name, method, split in (
        ("diet-rel", "diet-rel", False), ("diet-rel+seg, fold", "diet-rel+seg", False),
        ("diet-rel+seg, key runs", "diet-rel+seg", True))}
    interleaved(steps, cycles, "diet-rel")


def flex(length: int, batch: int, cycles: int) -> None:
    from torch.nn.attention.flex_attention import flex_attention

    h, d = 8, 64
    q, k, v = (torch.randn(batch, h, length, d) for _ in range(3))
    table, pair = torch.randn(h, 2 * length - 1), torch.randn(h, 2, 2)
    seg = torch.zeros(batch, length, dtype=torch.long)
    seg[:, length // 2:] = 1
    idx = torch.arange(length)
    rel = table[:, idx[:, None] - idx[None, :] + length - 1][None]  # (1, H, L, L)
    both = rel + pair[:, seg[:, :, None], seg[:, None, :]].transpose(0, 1)  # (B, H, L, L)

    def rel_mod(score, b, hh, qi, ki):
        return score + table[hh, qi - ki + length - 1]

    def both_mod(score, b, hh, qi, ki):
        return score + table[hh, qi - ki + length - 1] + pair[hh, seg[b, qi], seg[b, ki]]

    compiled = torch.compile(flex_attention, dynamic=False)
    with torch.no_grad():
        err = (compiled(q, k, v, score_mod=both_mod) - F.scaled_dot_product_attention(q, k, v, attn_mask=both))
        print(f"compiled flex vs sdpa, largest difference {err.abs().max().item():.2e}")
        steps = {"sdpa, no bias": lambda: F.scaled_dot_product_attention(q, k, v),
                 "sdpa, DIET-REL bias": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=rel),
                 "sdpa, DIET-REL + segments bias": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=both),
                 "flex, DIET-REL": lambda: compiled(q, k, v, score_mod=rel_mod),
                 "flex, DIET-REL + segments": lambda: compiled(q, k, v, score_mod=both_mod)}
        interleaved(steps, cycles, "sdpa, no bias")


if __name__ == "__main__":
    args = sys.argv[1:]
    if not (args[:1] == ["model"] and len(args) == 5 or args[:1] == ["flex"] and len(args) == 4) or not all(
            a.isdigit() for a in args[-3:]):
        sys.exit("usage: rejected_paths.py model SHAPE LENGTH BATCH CYCLES | flex LENGTH BATCH CYCLES")
    try:
        if args[0] == "model":
            model(args[1], int(args[2]), int(args[3]), int(args[4]))
        else:
            flex(int(args[1]), int(args[2]), int(args[3]))
    except ConfigError as e:
        sys.exit(f"rejected_paths.py: {e}")
