"""A look inside one model: the numbers behind DIET (Chen et al. 2021) Fig. 2, 4-8 and TUPE (Ke et al. 2021)
Fig. 6, computed by `analyze`, drawn and indexed by `report`.

    analyze(model, batch)                 -> Analysis (ranks, patterns, profiles, segments, cosine similarities)
    report(model, tokenizer_or_batch, out_dir, data=...) -> out_dir / "index.md" (+ PNGs and summary.json)

`dietpe analyze CHECKPOINT --data FILE` and `dietpe compare` both call `report`.
"""

from __future__ import annotations

import contextlib

import json
import math
import os
import random
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from dietpe.analysis import plots
from dietpe.analysis import correlations
from dietpe.analysis.logits import attention_logits, encoder_of
from dietpe.analysis.patterns import (
    cosine_similarity_matrix,
    offset_profile,
    position_cosine_similarity,
    position_embeddings,
    position_pattern,
    segment_pattern,
    toeplitz_deviation,
    two_segments,
)
from dietpe.analysis.rank import FLOAT32_EPS, default_rtol, numerical_rank
from dietpe.data.corpus import read_file
from dietpe.errors import DataError, InputError
from dietpe.positions.registry import REGISTRY

# ---------------------------------------------------------------------------------------------------
# the sampled batch
# ---------------------------------------------------------------------------------------------------


def sample_batch(tokenizer, data: str | Path | list[str], batch_size: int = 8, length: int = 128,
                 seed: int = 0) -> dict[str, Tensor]:
    """`batch_size` windows of exactly `length` tokens, `[CLS] ... [SEP]`, cut from the tokenised text of randomly
    chosen documents of `data` (a text file, one paragraph per line, or a list of texts). No padding, so every
    logit matrix is a full length × length matrix. Shorter text gives a shorter or smaller batch."""
    for name, value, least in (("batch_size", batch_size, 1), ("length", length, 3)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"{name}={value!r} must be an integer >= {least}"
                             + (" ([CLS], a token, [SEP])" if name == "length" else ""))
    if isinstance(data, (str, Path)):
        docs = read_file(data)  # DataError naming the file when it is missing
        where = str(data)
    else:
        docs = [[t] for t in data]
        where = "the given texts"
    docs = [d for d in docs if d]
    if not docs:
        raise DataError(f"{where}: no text to sample a batch from")
    rng = random.Random(seed)
    rng.shuffle(docs)
    specials = [t for t in (tokenizer.cls_token_id, tokenizer.sep_token_id) if t is not None]
    room = length - len(specials)
    stream: list[int] = []
    for doc in docs:  # tokenise only as much as the batch needs (WikiText's train file is 10 MB)
        for ids in tokenizer(doc, add_special_tokens=False)["input_ids"]:
            stream.extend(ids)
        if len(stream) >= 2 * batch_size * room:
            break
    if not stream:
        raise DataError(f"{where}: the text tokenises to nothing")
    room = min(room, len(stream))
    starts = list(range(0, len(stream) - room + 1, room))
    starts = sorted(rng.sample(starts, min(batch_size, len(starts))))
    head = [tokenizer.cls_token_id] if tokenizer.cls_token_id is not None else []
    tail = [tokenizer.sep_token_id] if tokenizer.sep_token_id is not None else []
    ids = torch.tensor([head + stream[s:s + room] + tail for s in starts])  # (B, L)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


# ---------------------------------------------------------------------------------------------------
# the numbers
# ---------------------------------------------------------------------------------------------------


@dataclass
class Analysis:
    """Everything the pictures show. Ranks are (layers, heads) arrays, NaN where a layer has no such term."""

    position: str
    segment: str
    head_size: int
    position_rank: int | None  # d_p of DIET-ABS
    length: int  # of the sampled batch (the rank matrices are length × length)
    batch_size: int
    rtol: float
    ranks: dict[str, np.ndarray] = field(default_factory=dict)
    patterns: list[Tensor | None] = field(default_factory=list)  # per layer (H, n, n), position-only
    offsets: Tensor | None = None
    profiles: Tensor | None = None  # (layers with a pattern, H, 2n-1): mean of each diagonal
    pattern_layers: list[int] = field(default_factory=list)
    toeplitz: np.ndarray | None = None  # (layers with a pattern, H): max spread along a diagonal / range
    segment_ids: Tensor | None = None
    segments: list[Tensor] | None = None  # per layer (H, n, n) segment term for `segment_ids`
    segment_positions: list[Tensor | None] | None = None  # the position pattern at the same length
    segment_tables: np.ndarray | None = None  # (layers, H, k, k)
    embeddings: Tensor | None = None  # (n, D) position embeddings, if any
    cosine_pairs: Tensor | None = None
    correlations: dict[str, Tensor] | None = None  # TUPE Fig. 2: term -> (L, L), first sequence, mean over heads
    correlation_spread: dict[str, dict[str, float]] | None = None  # term -> mean, std over pairs

    def summary(self) -> dict:
        """The numbers as JSON-ready values (what `summary.json` holds and `dietpe compare` may tabulate)."""
        out = {"position": self.position, "segment": self.segment, "head_size": self.head_size,
               "position_rank": self.position_rank, "length": self.length, "batch_size": self.batch_size,
               "rtol": self.rtol,
               "ranks": {k: np.where(np.isnan(v), None, np.round(v, 2)).tolist() for k, v in self.ranks.items()}}
        if self.toeplitz is not None:
            out["toeplitz_deviation"] = {str(l): np.round(t, 4).tolist()
                                         for l, t in zip(self.pattern_layers, self.toeplitz)}
        if self.segment_tables is not None:
            out["segment_tables"] = np.round(self.segment_tables, 4).tolist()
        if self.cosine_pairs is not None:
            out["cosine_similarity"] = {"mean": float(self.cosine_pairs.mean()),
                                        "std": float(self.cosine_pairs.std()),
                                        "min": float(self.cosine_pairs.min())}
        if self.correlation_spread is not None:
            out["correlations"] = self.correlation_spread
        return out


def host(x: Tensor) -> Tensor:
    """`x` detached and in host memory: NumPy, the plots and JSON read nothing else (a GPU tensor refuses)."""
    return x.detach().cpu()


def _to_host(a: Analysis) -> Analysis:
    """`a` with every tensor, and every tensor in a list, on the CPU (the model may sit on a GPU)."""
    for f in fields(a):
        value = getattr(a, f.name)
        if isinstance(value, Tensor):
            setattr(a, f.name, host(value))
        elif isinstance(value, list):
            setattr(a, f.name, [host(v) if isinstance(v, Tensor) else v for v in value])
    return a


def _mean_rank(term: Tensor | None, heads: int, rtol: float) -> np.ndarray:
    """(B|1, H|1, L, L) -> (H,) rank averaged over the batch; NaN for a missing term."""
    if term is None:
        return np.full(heads, np.nan)
    r = numerical_rank(term, rtol).double().mean(0)  # (H|1,)
    return host(r.expand(heads)).numpy()


def _check_analysable(config, batch: dict[str, Tensor]) -> None:
    """The ranks are of each sequence's whole L × L logits, as DIET's Theorem 1 and Fig. 2 take an encoder's."""
    if getattr(config, "causal", False):
        raise InputError(f"position={config.position!r} in a causal LM: its softmax sees each query's earlier keys "
                         f"only, and its text has no [CLS] or [SEP]; analyze reads encoders (a `dietpe pretrain` "
                         f"model, a translation model's encoder)")
    mask = batch.get("attention_mask")
    if mask is not None and bool((mask == 0).any()):
        raise InputError("the batch holds padding (attention_mask has zeros): the ranks are of each sequence's "
                         "whole L × L logits, so give sequences of one length without padding (sample_batch "
                         "makes such a batch)")


@contextlib.contextmanager
def _exact(model: nn.Module):
    """The model's floating-point weights in float64 for the analysis, then as they were (float64 holds every
    bfloat16, float16 and float32 value exactly, so the round trip changes no bit): the ranks' tolerance is
    float32's rounding, which a bfloat16 or float16 model's logits exceed (every head then reads full rank), and
    a float32 sum of cancelling terms can too."""
    tensors = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    dtypes = [t.dtype for t in tensors]
    try:
        for t in tensors:
            t.data = t.data.to(torch.float64)
        yield model
    finally:
        for t, dtype in zip(tensors, dtypes):
            t.data = t.data.to(dtype)


@torch.no_grad()
def analyze(model: nn.Module, batch: dict[str, Tensor] | Tensor, pattern_length: int | None = None,
            rtol: float | None = None) -> Analysis:
    """Compute every number of the report for `model` (its encoder, for a seq2seq model) on `batch`, on the
    model's device; the Analysis holds them on the CPU."""
    if isinstance(batch, Tensor):
        batch = {"input_ids": batch}
    encoder = encoder_of(model)
    config = encoder.config
    _check_analysable(config, batch)
    with _exact(model):
        return _analyze(model, encoder, batch, pattern_length, rtol)


def _analyze(model: nn.Module, encoder: nn.Module, batch: dict[str, Tensor], pattern_length: int | None,
             rtol: float | None) -> Analysis:
    config = encoder.config
    pe = encoder.positions
    heads = config.num_attention_heads
    b, length = batch["input_ids"].shape
    rtol = default_rtol(length, length) if rtol is None else rtol
    a = Analysis(position=config.position, segment=config.segment, head_size=config.head_size,
                 position_rank=config.rank if REGISTRY[config.position].uses("position_rank") else None, length=length,
                 batch_size=b, rtol=rtol)

    # ranks (Fig. 2 and 8) on the batch
    logits = attention_logits(model, batch)
    n = pattern_length or length
    if pe.max_length is not None:
        n = min(n, pe.max_length)
    a.patterns = position_pattern(model, n)
    # input-additive methods have no position term in the logits: their position-only pattern stands in
    batch_patterns = a.patterns if n == length else position_pattern(model, length)
    a.ranks = {
        "token-to-token q·kᵀ": np.stack([_mean_rank(x.content, heads, rtol) for x in logits]),
        "position term": np.stack([
            _mean_rank(x.position if x.position is not None else
                       (p[None] if p is not None else None), heads, rtol)
            for x, p in zip(logits, batch_patterns)]),
        "full logits": np.stack([_mean_rank(x.full, heads, rtol) for x in logits]),
    }

    # position-only patterns (Fig. 4, 7; TUPE Fig. 6) and their offset profiles
    a.pattern_layers = [i for i, p in enumerate(a.patterns) if p is not None]
    if a.pattern_layers:
        stacked = torch.stack([a.patterns[i] for i in a.pattern_layers])  # (layers, H, n, n)
        a.offsets, a.profiles = offset_profile(stacked)
        spread = (stacked.amax((-1, -2)) - stacked.amin((-1, -2))).clamp_min(1e-12)
        a.toeplitz = host(toeplitz_deviation(stacked) / spread).numpy()

    # segment attention (Fig. 6): length 32, the second segment from 16, as in the paper
    if pe.head_segments is not None:
        seg_len = min(32, pe.max_length or 32)
        a.segment_ids = two_segments(seg_len, seg_len // 2)
        a.segments = segment_pattern(model, a.segment_ids)
        a.segment_positions = position_pattern(model, seg_len)
        table = pe.head_segments.logit("table").detach().float()  # effective Ŝ, (layers|1, H|1, k, k)
        a.segment_tables = host(table.expand(config.num_hidden_layers, heads, -1, -1)).numpy()

    # the four correlations of the first layer (TUPE Fig. 2), for positions added at the input
    if correlations.has_input_positions(model):
        terms = correlations.four_correlations(model, batch)
        a.correlations = {k: t[0].mean(0) for k, t in terms.items()}
        a.correlation_spread = correlations.spread(terms)

    # cosine similarity of position embeddings (Fig. 5)
    a.embeddings = position_embeddings(model, n)
    if a.embeddings is not None:
        a.cosine_pairs = position_cosine_similarity(a.embeddings)
    return _to_host(a)


# ---------------------------------------------------------------------------------------------------
# pictures and the index
# ---------------------------------------------------------------------------------------------------

PAPER = {
    "ranks": "DIET Fig. 2 compares the rank of the first layer's attention logits of BERT-base with input "
             "position embeddings against DIET-ABS on a sampled batch: the input-additive model's heads sit at or "
             "below d_h (Theorem 1), DIET-ABS's reach higher (up to d_h + d_p). Fig. 8 does the same for the "
             "position-only matrices (P W_Q W_Kᵀ Pᵀ against P_Q P_Kᵀ): lower rank for the input-additive model.",
    "patterns": "DIET Fig. 4 and 7: DIET-ABS's learned P_Q P_Kᵀ shows shifting (near-Toeplitz) bands — heads "
                "attending to forward neighbours or to previous tokens, some to long context — and a special "
                "row/column for index 0 ([CLS]). TUPE Fig. 6: TUPE-A's positional correlation is also mostly "
                "diagonal bands, while BERT's input-additive positions give a blurrier picture.",
    "profiles": "For DIET-REL the curve is the learned R_{i-j} itself (its pattern is exactly Toeplitz); for "
                "absolute methods it is the average over each diagonal, a summary of the shifting pattern.",
    "segments": "DIET Fig. 6 (DIET-REL, length 32, second segment from index 16, no token-to-token term): some "
                "heads attend to one segment, others down-weight the relative position pattern across segments.",
    "correlations": "TUPE Fig. 2 (a pre-trained BERT): the word-to-position and position-to-word terms look "
                    "uniform across positions — words and absolute positions hardly correlate — so TUPE drops them. "
                    "The standard deviation over pairs says how much each term can move attention between keys.",
    "cosine": "DIET Fig. 5: BERT's input position embeddings are spread out (low cosine similarity between far "
              "positions); when DIET-ABS per-head positions are added, the input embeddings collapse — all "
              "pairs become similar, carrying almost no information.",
}


def _rank_table(a: Analysis) -> list[str]:
    names = list(a.ranks)
    lines = ["| layer | " + " | ".join(f"{n}: mean (min–max over heads)" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for layer in range(next(iter(a.ranks.values())).shape[0]):
        cells = []
        for n in names:
            r = a.ranks[n][layer]
            cells.append("—" if np.isnan(r).all() else
                         f"{np.nanmean(r):.1f} ({np.nanmin(r):.1f}–{np.nanmax(r):.1f})")
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return lines


def _observations(a: Analysis) -> list[str]:
    """Plain statements read off the numbers (no interpretation beyond the theorem's bound)."""
    out = []
    full, content = a.ranks["full logits"], a.ranks["token-to-token q·kᵀ"]
    above = int(np.sum(full > a.head_size + 0.5))
    out.append(f"- {above} of {full.size} heads have full-logit rank above d_h = {a.head_size} "
               f"(mean rank {np.nanmean(full):.1f} on {a.length} × {a.length} matrices; the token-to-token term "
               f"alone: {np.nanmean(content):.1f}, at most {np.nanmax(content):.1f}).")
    pos = a.ranks["position term"]
    if not np.isnan(pos).all():
        extra = f" (d_p = {a.position_rank})" if a.position_rank else ""
        out.append(f"- Position term rank{extra}: mean {np.nanmean(pos):.1f}, range "
                   f"{np.nanmin(pos):.1f}–{np.nanmax(pos):.1f}.")
    if a.toeplitz is not None:
        out.append(f"- Toeplitz deviation (largest spread along a diagonal / range of the pattern): median "
                   f"{np.median(a.toeplitz):.3f}, max {np.max(a.toeplitz):.3f} — 0 means the pattern depends on "
                   f"i - j only.")
    if a.cosine_pairs is not None:
        c = a.cosine_pairs
        out.append(f"- Position-embedding cosine similarity over pairs i < j: mean {float(c.mean()):.3f}, "
                   f"std {float(c.std()):.3f}.")
    return out


def _correlation_section(a: Analysis, out: Path, title: str) -> list[str]:
    plots.plot_correlations(a.correlations, out / "correlations.png",
                            f"{title}: the first layer's four correlations (TUPE eq. 6), first sequence, mean over heads")
    return ["## Word and position correlations (TUPE Fig. 2)", "", "![correlations](correlations.png)", "",
            "| term | mean | std over pairs (i, j) |", "|---|--:|--:|",
            *[f"| {k} | {v['mean']:.3f} | {v['std']:.3f} |" for k, v in a.correlation_spread.items()], "",
            f"*Paper:* {PAPER['correlations']}", ""]


def write_report(a: Analysis, out_dir: str | Path, title: str, source: str = "") -> Path:
    """Draw the PNGs of `a` into `out_dir` and write `index.md` (and `summary.json`) listing them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dp = f", d_p = {a.position_rank}" if a.position_rank else ""
    tol = (f"numerical rank = #{{σ_i > rtol · σ_max}}, rtol = {a.rtol:.2e}"
           + (" = max(M, N) · ε_float32" if math.isclose(a.rtol, default_rtol(a.length, a.length)) else ""))
    md = [f"# Look inside: {title}", "",
          f"position = `{a.position}`, segment = `{a.segment}`, d_h = {a.head_size}{dp}. "
          f"Batch: {a.batch_size} sequences of {a.length} tokens{(' from ' + source) if source else ''}.", "",
          "## What the numbers say", "", *_observations(a), ""]

    plots.plot_ranks(a.ranks, out / "ranks.png",
                     f"{title}: rank of {a.length}×{a.length} attention logits per layer and head "
                     f"(mean over {a.batch_size} sequences)\n{tol}; d_h = {a.head_size}{dp}", limit=a.length)
    md += ["## Rank of the attention logits (DIET Fig. 2 and 8)", "", "![ranks](ranks.png)", "",
           f"Tolerance: {tol} (ε = {FLOAT32_EPS:.3g}; numpy's `matrix_rank` default for float32). "
           "`token-to-token` is (q·kᵀ)·scale of the hidden states entering the layer (for input-additive methods "
           "position is inside it); `position term` is the sum of the layer's position logit terms (for "
           "input-additive methods: the first layer's logits of the position embeddings alone, see "
           "docs/analysis.md); `full` is what the softmax sees.", "", *_rank_table(a), "",
           f"*Paper:* {PAPER['ranks']}", ""]

    if a.pattern_layers:
        plots.plot_patterns(a.patterns, out / "position_patterns.png",
                            f"{title}: position-only attention logits, {a.patterns[a.pattern_layers[0]].shape[-1]} "
                            f"positions")
        plots.plot_offset_profiles(a.offsets, a.profiles, out / "offset_profiles.png",
                                   f"{title}: position logit per offset (mean of each diagonal)",
                                   REGISTRY[a.position].method.profile_name)
        md += ["## Position-only attention (DIET Fig. 4 and 7, TUPE Fig. 6)", "",
               "![position patterns](position_patterns.png)", "", "![offset profiles](offset_profiles.png)", "",
               "Toeplitz deviation per head (0 = depends on i - j only):", "",
               "| layer | " + " | ".join(f"head {h}" for h in range(a.toeplitz.shape[1])) + " |",
               "|---|" + "---|" * a.toeplitz.shape[1],
               *[f"| {l} | " + " | ".join(f"{v:.3f}" for v in row) + " |"
                 for l, row in zip(a.pattern_layers, a.toeplitz)], "",
               f"*Paper:* {PAPER['patterns']} {PAPER['profiles']}", ""]
    else:
        md += ["## Position-only attention", "", f"`{a.position}` has no position-only attention pattern "
               "(position enters through q and k only, or not at all).", ""]

    if a.segments is not None:
        plots.plot_segments(a.segment_positions, a.segments, a.segment_ids, out / "segment_attention.png",
                            f"{title}: position + per-head segment logits, two segments (second from index "
                            f"{len(a.segment_ids) // 2})")
        md += ["## Segment attention (DIET Fig. 6)", "", "![segment attention](segment_attention.png)", "",
               "Per-head segment tables Ŝ[S(i), S(j)] (rows: query segment):", ""]
        for l, layer in enumerate(a.segment_tables):
            md.append(f"- layer {l}: " + "; ".join(
                f"head {h} " + str(np.round(t, 3).tolist()) for h, t in enumerate(layer)))
        md += ["", f"*Paper:* {PAPER['segments']}", ""]

    if a.embeddings is not None:
        kind = REGISTRY[a.position].method.table_name
        plots.plot_cosine(cosine_similarity_matrix(a.embeddings), a.cosine_pairs, out / "cosine_similarity.png",
                          f"{title}: cosine similarity of {kind}")
        md += ["## Cosine similarity of position embeddings (DIET Fig. 5)", "",
               "![cosine similarity](cosine_similarity.png)", "", f"*Paper:* {PAPER['cosine']}", ""]

    if a.correlations is not None:
        md += _correlation_section(a, out, title)

    (out / "summary.json").write_text(json.dumps(a.summary(), indent=1) + "\n")
    index = out / "index.md"
    index.write_text("\n".join(md))
    return index


def report(model: nn.Module, tokenizer_or_batch, out_dir: str | Path, *, data: str | Path | list[str] | None = None,
           title: str | None = None, batch_size: int = 8, length: int = 128, seed: int = 0,
           rtol: float | None = None) -> Path:
    """Analyse `model` and write PNGs, `summary.json` and `index.md` into `out_dir`; returns the index's path.

    tokenizer_or_batch: a batch (dict with input_ids (B, L), or an input_ids tensor), or a tokenizer, with
    `data` (a text file or a list of texts) to sample `batch_size` windows of `length` tokens from. With a batch,
    `data` only names where the batch came from.
    """
    encoder = encoder_of(model)
    source = "" if data is None else f"`{data}`" if isinstance(data, (str, Path)) else "the given texts"
    if isinstance(tokenizer_or_batch, (dict, Tensor)):
        batch = tokenizer_or_batch
    else:
        if data is None:
            raise DataError("report() was given a tokenizer but no data to sample a batch from; pass data=FILE")
        limit = encoder.positions.max_length
        batch = sample_batch(tokenizer_or_batch, data, batch_size, min(length, limit or length), seed)
    if isinstance(batch, Tensor):
        batch = {"input_ids": batch}
    device = next(encoder.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items()}
    a = analyze(model, batch, rtol=rtol)
    return write_report(a, out_dir, title or encoder.config.position, source)


PICTURES = [("ranks.png", "rank (Fig. 2/8)"), ("position_patterns.png", "position-only attention (Fig. 4/7)"),
            ("offset_profiles.png", "logit per offset i − j"),
            ("segment_attention.png", "segment attention (Fig. 6)"),
            ("cosine_similarity.png", "position-embedding cosine (Fig. 5)"),
            ("correlations.png", "word and position correlations (TUPE Fig. 2)")]


def compare_section(indexes: dict[str, str | Path], base: str | Path) -> str:
    """Markdown for a comparison report at `base`: per method (name -> the index.md `report` returned), its
    pictures under one heading per kind, linked relative to `base`, plus a link to each full index."""
    base = Path(base)

    def rel(p: Path) -> str:
        return Path(os.path.relpath(p, base)).as_posix()

    md = ["## Look inside (dietpe analyze)", ""]
    for png, caption in PICTURES:
        shown = [(name, Path(i).parent / png) for name, i in indexes.items() if (Path(i).parent / png).is_file()]
        if shown:
            md += [f"### {caption}", ""] + [f"**{name}**\n\n![{name}: {caption}]({rel(p)})\n" for name, p in shown]
    md += ["Full reports: " + ", ".join(f"[{name}]({rel(Path(i))})" for name, i in indexes.items()), ""]
    return "\n".join(md)
