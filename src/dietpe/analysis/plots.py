"""Pictures of the analysis numbers, in the layout of DIET (Chen et al. 2021) Fig. 2/8 (ranks per layer and head),
Fig. 4/7 and TUPE (Ke et al. 2021) Fig. 6 (position-only attention heatmaps), Fig. 6 (segment attention) and
Fig. 5 (cosine similarity of position embeddings). Each function takes numbers already computed by
`dietpe.analysis.rank` / `dietpe.analysis.patterns` and writes one PNG; none of them touches a model.
"""

from __future__ import annotations

from pathlib import Path

from dietpe.extras import need

matplotlib = need("matplotlib")
matplotlib.use("Agg")  # files only: no display on servers and in tests

plt = need("matplotlib.pyplot")
import numpy as np  # noqa: E402
from torch import Tensor  # noqa: E402

DPI = 100


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_ranks(ranks: dict[str, np.ndarray], path: str | Path, title: str, limit: int | None = None) -> Path:
    """One annotated layers × heads heatmap per term (e.g. token-to-token, position, full logits).

    ranks: name -> (layers, heads) array of (mean) numerical ranks; limit: the colour scale's top (e.g. the
    sequence length), shared by the panels so they compare at a glance.
    """
    names = list(ranks)
    top = limit or max(float(np.nanmax(r)) for r in ranks.values())
    layers, heads = next(iter(ranks.values())).shape
    fig, axes = plt.subplots(1, len(names), figsize=(1.0 + 0.55 * heads * len(names) + 1.2 * len(names),
                                                     1.6 + 0.45 * layers), squeeze=False, layout="constrained")
    for ax, name in zip(axes[0], names):
        r = ranks[name]
        im = ax.imshow(r, vmin=0, vmax=top, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(r):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if v < 0.6 * top else "black")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(heads))
        ax.set_yticks(range(layers))
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="numerical rank")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_patterns(patterns: list[Tensor | None], path: str | Path, title: str, label: str = "logit",
                  marks: list[float] | None = None) -> Path:
    """Heatmaps of (H, Lq, Lk) patterns: one row per layer that has one, one column per head. Each panel has its
    own symmetric colour scale, since heads differ in magnitude and the shape is what matters. `marks`: index
    boundaries drawn as dotted lines on both axes."""
    rows = [(i, p) for i, p in enumerate(patterns) if p is not None]
    heads = rows[0][1].shape[0]
    fig, axes = plt.subplots(len(rows), heads, figsize=(1.6 * heads + 0.6, 1.6 * len(rows) + 0.9), squeeze=False,
                             layout="constrained")
    for r, (layer, p) in enumerate(rows):
        for h in range(heads):
            ax = axes[r, h]
            m = p[h].detach().cpu().numpy()
            # the 99th percentile of |logit|, not the max: a few extreme entries (the [CLS] row) would wash out
            # the bands that carry the pattern
            v = float(np.quantile(np.abs(m), 0.99)) or float(np.abs(m).max()) or 1.0
            ax.imshow(m, cmap="RdBu_r", vmin=-v, vmax=v, interpolation="nearest")
            for b in marks or []:
                ax.axhline(b - 0.5, color="k", lw=0.6, ls=":")
                ax.axvline(b - 0.5, color="k", lw=0.6, ls=":")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {layer}\nquery i", fontsize=8)
            if r == len(rows) - 1:
                ax.set_xlabel("key j", fontsize=8)
    fig.suptitle(f"{title}\n(red > 0 > blue; each panel scaled to its own 99th percentile of |{label}|)", fontsize=9)
    return _save(fig, path)


def plot_offset_profiles(offsets: Tensor, values: Tensor, path: str | Path, title: str, ylabel: str) -> Path:
    """Curves of a value per relative offset i - j, one panel per layer, one line per head. values (L, H, M)."""
    layers, heads, _ = values.shape
    cols = min(layers, 4)
    rows = -(-layers // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False, sharex=True,
                             layout="constrained")
    x = offsets.cpu().numpy()
    for layer in range(rows * cols):
        ax = axes[layer // cols, layer % cols]
        if layer >= layers:
            ax.axis("off")
            continue
        for h in range(heads):
            ax.plot(x, values[layer, h].detach().cpu().numpy(), lw=1, label=f"head {h}")
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("offset i - j (query - key)", fontsize=8)
        if layer % cols == 0:
            ax.set_ylabel(ylabel, fontsize=8)
    if heads <= 12:
        axes[0, 0].legend(fontsize=6, ncol=2)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_cosine(similarity: Tensor, pairs: Tensor, path: str | Path, title: str) -> Path:
    """DIET Fig. 5: the histogram of cos(p_i, p_j) over pairs i < j, next to the (n, n) similarity matrix."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    ax1.hist(pairs.cpu().numpy(), bins=50, range=(-1, 1), color="tab:blue")
    ax1.set_xlabel("cosine similarity of position pairs (i < j)")
    ax1.set_ylabel("pairs")
    ax1.set_title(f"mean {float(pairs.mean()):.3f}, std {float(pairs.std()):.3f}", fontsize=9)
    im = ax2.imshow(similarity.cpu().numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
    ax2.set_xlabel("position j")
    ax2.set_ylabel("position i")
    fig.colorbar(im, ax=ax2, shrink=0.8)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_segments(position: list[Tensor | None], segment: list[Tensor], segment_ids: Tensor, path: str | Path,
                  title: str) -> Path:
    """DIET Fig. 6: per layer and head, the position + segment logits (no token-to-token term) for a two-segment
    input; the dotted lines mark where the second segment starts."""
    combined = [s + (p if p is not None else 0) for s, p in zip(segment, position)]
    starts = [i for i in range(1, len(segment_ids)) if segment_ids[i] != segment_ids[i - 1]]
    return plot_patterns(combined, path, title, marks=starts)


def plot_correlations(terms: dict[str, Tensor], path: str | Path, title: str) -> Path:
    """TUPE Fig. 2: one (L, L) heatmap per correlation (word-to-word, word-to-position, position-to-word,
    position-to-position) on one shared colour scale, so that a uniform term shows as a flat panel."""
    names = list(terms)
    mats = [terms[n].detach().float().cpu().numpy() for n in names]
    v = max(float(np.quantile(np.abs(m), 0.99)) for m in mats) or 1.0
    fig, axes = plt.subplots(1, len(names), figsize=(3.0 * len(names), 3.4), squeeze=False, layout="constrained")
    for ax, name, m in zip(axes[0], names, mats):
        im = ax.imshow(m, cmap="RdBu_r", vmin=-v, vmax=v, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("key j", fontsize=8)
        ax.set_ylabel("query i", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="logit")
    fig.suptitle(f"{title}\n(one colour scale: the 99th percentile of |logit| over the four)", fontsize=9)
    return _save(fig, path)
