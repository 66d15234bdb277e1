"""Markdown for the cost table: one table per shape and length (time ratios to `none`, parameters as in DIET
Table 6, step peak memory), and the long-input table.
"""

from __future__ import annotations

from dietpe.bench.cost import LongRow, Row


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def table(rows: list[Row]) -> str:
    """One shape and length."""
    first = rows[0]
    lines = [f"### {first.shape}, length {first.length}, batch {first.batch}", "",
             "| method | params | vs none | train ms | train × none | infer ms | infer × none "
             "| train peak MiB | infer peak MiB |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(
            f"| {r.method} | {r.params / 1e6:.2f}M | {r.params_increase * 100:+.2f}% | {_f(r.train_ms, '.0f')} "
            f"| {_f(r.train_ratio, '.2f')} | {_f(r.infer_ms, '.1f')} | {_f(r.infer_ratio, '.2f')} "
            f"| {_f(r.train_peak_mib, '.0f')} | {_f(r.infer_peak_mib, '.0f')} |")
    absolute = next((r for r in rows if r.method == "absolute"), None)
    bert = next((r for r in rows if r.method == "hf-bert"), None)
    if absolute and bert:
        for mode in ("train", "infer"):
            ours, theirs = getattr(absolute, f"{mode}_ratio"), getattr(bert, f"{mode}_ratio")
            if ours is not None and theirs is not None:
                spread = _direction(getattr(absolute, f"{mode}_iqr"), getattr(bert, f"{mode}_iqr"))
                lines += ["", f"{mode}: absolute / hf-bert = {ours / theirs:.3f} ({spread})"]
    return "\n".join(lines)


def _direction(ours: tuple[float, float] | None, theirs: tuple[float, float] | None) -> str:
    """Faster or slower only where the two rows' per-cycle ratios (interquartile ranges) do not overlap: a
    median's difference inside the cycles' spread says nothing about which is faster."""
    if ours is None or theirs is None:
        return "no per-cycle spread recorded: no direction stated"
    if ours[1] < theirs[0] or ours[0] > theirs[1]:
        return "faster" if ours[1] < theirs[0] else "slower"
    return (f"within the cycles' spread: interquartile ranges {ours[0]:.3f}-{ours[1]:.3f} and "
            f"{theirs[0]:.3f}-{theirs[1]:.3f} overlap")


def long_table(rows: list[LongRow]) -> str:
    first = rows[0]
    lines = [f"### long inputs: {first.shape}, inference, length {first.length}, batch 1 (a third of the cycles "
             f"above, at least 3, after 1 warm-up)", "",
             "| method | infer ms | × none | step peak MiB | × none | process peak MiB | × none |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r.method} | {r.infer_ms:.0f} | {r.infer_ratio:.2f} | {_f(r.peak_mib, '.0f')} "
                     f"| {_f(r.peak_ratio, '.2f')} | {_f(r.rss_mib, '.0f')} | {_f(r.rss_ratio, '.2f')} |")
    return "\n".join(lines)


def markdown(rows: list[Row], long_rows: list[LongRow], settings: dict) -> str:
    parts = ["## dietpe bench", "",
             f"torch {settings.get('torch')}, {settings.get('threads')} threads, median of {settings.get('repeats')} "
             f"interleaved cycles after {settings.get('warmup')} warm-up; ratios are medians of per-cycle ratios "
             f"to `none`. `+seg`: per-head segments (DIET eq. 2). Peak MiB: the "
             f"step's RSS high-water mark above the idle process, in a fresh process per configuration."]
    if settings.get("device", "cpu") != "cpu":
        parts[-1] = parts[-1].replace("RSS high-water mark", "GPU allocator peak (max_memory_allocated)") + (
            f" Device: {settings['device']}, {settings.get('precision', 'fp32')}; timings synchronised.")
    compiled = settings.get("compile")
    if compiled and not compiled.startswith("no"):
        parts[-1] += f" Every candidate timed as torch.compile ({compiled}); peak memory is the eager step's."
    if settings.get("command"):
        parts += ["", f"`{settings['command']}`"]
    if settings.get("kernel settings"):  # the fused kernel's DIETPE_FUSED_* choices: its speed, or with
        # DIETPE_FUSED_AUTOTUNE its tiles and so its bits, depend on them
        parts += ["", "Kernel settings: " + ", ".join(f"`{k}={v}`" for k, v in settings["kernel settings"].items())]
    if settings.get("partial"):
        parts += ["", f"**Partial results**: {settings['partial']} (the run was still going, or was stopped)."]
    groups: dict[tuple[str, int], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.shape, r.length), []).append(r)
    for group in groups.values():
        parts += ["", table(group)]
    if long_rows:
        parts += ["", long_table(long_rows)]
    return "\n".join(parts) + "\n"
