"""Perplexity by length: train at length L, measure perplexity at L, 2L, 4L, 8L (ALiBi, Press et al. 2022;
KERPLE, Chi et al. 2022; NoPE, Kazemnejad et al. 2023). The evaluation and table that `dietpe lm`
(`dietpe.tasks.lm`) and `dietpe lengths` (`dietpe.tasks.lengths`) share.

The held-out text is one token stream (documents end with [SEP]); at each length n the same first T tokens are
cut into windows of n tokens. Causal: next-token cross-entropy over every token of every window but its first;
masked LM: the stream is masked once with a fixed seed (15 %, 80/10/10, as in pre-training), each window is
[CLS] + n - 2 tokens + [SEP], and the loss is over the masked tokens, so every length and method scores the
same tokens (up to the windows that fit). Learned tables cannot go past max_position_embeddings: such a cell
reads "n/a" (beyond the table), never a crash or a silent clip.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

import torch

from dietpe.errors import ConfigError, DataError
from dietpe.positions.registry import REGISTRY

MASK_SEED = 1234


# ------------------------------------------------------------------------------------------------ data
def token_stream(docs, tokenizer) -> list[int]:
    """All sentences' token ids in order, [SEP] after each document."""
    flat = [s for d in docs for s in d]
    ids = [e.ids for e in tokenizer.backend_tokenizer.encode_batch(flat, add_special_tokens=False)]
    out, i = [], 0
    for d in docs:
        for sentence in ids[i:i + len(d)]:
            out.extend(sentence)
        out.append(tokenizer.sep_token_id)
        i += len(d)
    return out


def read_stream(source: str, tokenizer, split: str = "train", max_documents: int | None = None) -> list[int]:
    from dietpe.data.corpus import read_corpus

    docs, origin = read_corpus(source, split)
    if max_documents:
        docs = docs[:max_documents]
    stream = token_stream(docs, tokenizer)
    if len(stream) < 2:
        raise DataError(f"{origin}: no text")
    return stream


# ------------------------------------------------------------------------------------------------ evaluation
def position_config(model):
    """The config naming a model's position method and its limits: diet's own, or the `DietConfig` of a
    method attached to a Hugging Face model (`dietpe.attach`)."""
    attached = getattr(model.base_model, "diet_positions", None)
    return attached.config if attached is not None else model.config


def window_text(length: int, causal: bool) -> int:
    """Tokens of the text one window of `length` holds: a masked LM's window adds [CLS] and [SEP]."""
    return length if causal else length - 2


def _of_text(length: int, need: int) -> str:
    return "" if need == length else f" ({need} of text, besides [CLS] and [SEP])"


def check_windows(train_length: int, multiples, causal: bool, tokens: int | None = None,
                  text: int | None = None) -> None:
    """Refuse, before any work, an --eval-tokens (`tokens`) or a held-out text (`text` tokens long) without
    one window of the longest length, which every length must score."""
    longest = max(multiples)
    length = longest * train_length
    need = window_text(length, causal)
    if tokens is not None and tokens < need:
        raise ConfigError(f"--eval-tokens {tokens} is fewer than one window of the longest length, {longest}L = "
                          f"{length} tokens{_of_text(length, need)}; give --eval-tokens {need} or more")
    if text is not None and text < need:
        raise DataError(f"the held-out text has {text} tokens, fewer than one window of the longest length, "
                        f"{longest}L = {length} tokens{_of_text(length, need)}; give more held-out text, or smaller "
                        f"--lengths")


def beyond_table(config, length: int) -> bool:
    """A learned position table (the method's, the registry's `learned_table`, or BERT's input table kept
    beside a per-head method, `input_positions`) cannot serve `length` positions."""
    learned = REGISTRY[config.position].learned_table or bool(getattr(config, "input_positions", False))
    return learned and length > config.max_position_embeddings


#: windows scored in one forward
SCORING_BATCH = 8


@torch.no_grad()
def causal_loss(model, stream: list[int], length: int, tokens: int, batch_size: int = SCORING_BATCH) -> float | None:
    """Mean next-token cross-entropy over windows of `length` tokens covering the first `tokens` of `stream`;
    None beyond a learned table."""
    if beyond_table(position_config(model), length):
        return None
    n = min(tokens, len(stream)) // length
    if n < 1:
        raise DataError(f"the evaluation text has {len(stream)} tokens, fewer than one window of {length}")
    windows = torch.tensor(stream[:n * length], dtype=torch.long).view(n, length).to(model.device)
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        ids = windows[i:i + batch_size]
        logits = model(ids).logits[:, :-1]
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                   ids[:, 1:].reshape(-1), reduction="sum").item()
        count += ids[:, 1:].numel()
    return total / count


@torch.no_grad()
def masked_loss(model, tokenizer, stream: list[int], length: int, tokens: int, batch_size: int = SCORING_BATCH,
                seed: int = MASK_SEED) -> float | None:
    """Mean masked-token cross-entropy: the first `tokens` of `stream` masked once (fixed seed), windows
    [CLS] + length - 2 tokens + [SEP]; None beyond a learned table."""
    from dietpe.data.mlm import mask_tokens, word_ids

    if beyond_table(position_config(model), length):
        return None
    ids = torch.tensor(stream[:tokens], dtype=torch.long)[None]
    special = torch.isin(ids, torch.tensor(sorted(set(tokenizer.all_special_ids))))
    first_word = word_ids(tokenizer)
    masked, labels = mask_tokens(ids, special, tokenizer.mask_token_id, first_word, len(tokenizer), 0.15,
                                 torch.Generator().manual_seed(seed))
    inner = length - 2
    n = masked.shape[1] // inner
    if n < 1:
        raise DataError(f"the evaluation text has {masked.shape[1]} tokens, fewer than one window of {length}")
    cls = torch.full((n, 1), tokenizer.cls_token_id)
    sep = torch.full((n, 1), tokenizer.sep_token_id)
    none = torch.full((n, 1), -100)
    x = torch.cat((cls, masked[0, :n * inner].view(n, inner), sep), 1).to(model.device)
    y = torch.cat((none, labels[0, :n * inner].view(n, inner), none), 1).to(model.device)
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        logits = model(x[i:i + batch_size]).logits
        keep = y[i:i + batch_size] != -100
        total += torch.nn.functional.cross_entropy(logits[keep].float(), y[i:i + batch_size][keep],
                                                   reduction="sum").item()
        count += int(keep.sum())
    return total / count if count else None


def length_perplexities(model, tokenizer, stream: list[int], train_length: int, multiples=(1, 2, 4, 8),
                        tokens: int | None = None) -> dict[int, float | None]:
    """{multiple: perplexity at multiple × train_length, or None beyond a learned table}; causal LMs by next
    token, masked LMs by masked token. `tokens`: how much of the stream every length scores (default: 8
    windows of the longest length), cut to whole windows of the longest length, so that a causal LM scores
    the same text at every length whose windows divide the longest one."""
    causal = bool(getattr(position_config(model), "causal", False))
    check_windows(train_length, multiples, causal, tokens, len(stream))  # before scoring any length
    longest = window_text(max(multiples) * train_length, causal)
    tokens = min(tokens or 8 * max(multiples) * train_length, len(stream)) // longest * longest
    out = {}
    for m in multiples:
        n = m * train_length
        loss = causal_loss(model, stream, n, tokens) if causal else masked_loss(model, tokenizer, stream, n, tokens)
        out[m] = None if loss is None else math.exp(min(loss, 50))
    return out


# ------------------------------------------------------------------------------------------------ report
def table_markdown(rows: list[dict], multiples, title: str = "") -> str:
    """rows: {method, kind, train_length, ppl: {multiple: value or None}}."""
    head = ["method", "objective"] + [f"{m}L" for m in multiples]
    lines = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(head) + " |",
                                                       "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["method"], r["kind"]] + ["n/a (beyond the table)" if r["ppl"][m] is None else f"{r['ppl'][m]:.2f}"
                                            for m in multiples]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table_csv(rows: list[dict], multiples) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["method", "objective", "train_length"] + [f"ppl_{m}L" for m in multiples])
    for r in rows:
        w.writerow([r["method"], r["kind"], r["train_length"]] + ["" if r["ppl"][m] is None else f"{r['ppl'][m]:.4f}"
                                                                  for m in multiples])
    return buf.getvalue()


def plot(rows: list[dict], multiples, path: Path, title: str) -> None:
    """Perplexity against evaluation length, one colour and marker per method (log scales)."""
    from dietpe.extras import need

    need("matplotlib").use("Agg")
    import matplotlib.pyplot as plt

    markers = "osD^v<>pPX*hH8d"
    colours = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(rows):
        xs = [m for m in multiples if r["ppl"][m] is not None]
        label = f"{r['method']} ({r['kind']})" if len({x["kind"] for x in rows}) > 1 else r["method"]
        ax.plot(xs, [r["ppl"][m] for m in xs], marker=markers[i % len(markers)], color=colours[i % len(colours)],
                label=label if xs else f"{label}: n/a (beyond the table)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(multiples), [f"{m}L" for m in multiples])
    ax.set_xlabel(f"evaluation length (L = {rows[0]['train_length']} tokens, the training length)")
    ax.set_ylabel("perplexity")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows: list[dict], multiples, out: Path, title: str, command: str = "lm",
                 notes: list[str] = ()) -> str:
    """lengths.md, .csv, .json and .png in `out`; without a single perplexity (every cell n/a) there is nothing
    to plot on log scales: no .png (an old one removed, so none misleads), and a note says why. `notes`: lines
    under the table."""
    out.mkdir(parents=True, exist_ok=True)
    md = table_markdown(rows, multiples, title) + "".join(f"\n- {note}" for note in notes) + ("\n" if notes else "")
    drawn = any(r["ppl"][m] is not None for r in rows for m in multiples)
    (out / "lengths.md").write_text(md + ("\n![perplexity by length](lengths.png)\n" if drawn else ""),
                                    encoding="utf-8")
    (out / "lengths.csv").write_text(table_csv(rows, multiples), encoding="utf-8")
    (out / "lengths.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    if drawn:
        plot(rows, multiples, out / "lengths.png", title)
    else:
        (out / "lengths.png").unlink(missing_ok=True)
        log(f"no plot: every perplexity is n/a (beyond a learned position table), so {out / 'lengths.png'} "
            f"is not drawn", command)
    return md


def log(message: str, command: str = "lm") -> None:
    print(f"[{command}] {message}", file=sys.stderr)
