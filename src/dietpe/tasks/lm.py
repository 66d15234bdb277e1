"""`dietpe lm` and `dietpe lengths`: causal language models with every position method, and length generalisation.

Most position-encoding research today asks what happens beyond the training length (ALiBi, Press et al. 2022;
KERPLE, Chi et al. 2022; NoPE, Kazemnejad et al. 2023): train at length L, measure perplexity at L, 2L, 4L, 8L.

    dietpe lm CORPUS --methods none,rotary,alibi,kerple -o runs/lm      train a small causal LM per method at
                                                                      length L, then the table and plot below
    dietpe lengths RUN [RUN ...] --data valid.txt -o lengths            the same evaluation for saved runs: any
                                                                      `dietpe lm` run (causal) or `dietpe pretrain`
                                                                      run (masked LM) of the same tokenizer

Evaluation (`length_perplexities`): the held-out text is one token stream (documents end with [SEP]); at each
length n the same first T tokens are cut into windows of n tokens. Causal: next-token cross-entropy over every
token of every window but its first; masked LM: the stream is masked once with a fixed seed (15 %, 80/10/10,
as in pre-training), each window is [CLS] + n - 2 tokens + [SEP], and the loss is over the masked tokens, so
every length and method scores the same tokens (up to the windows that fit). Learned tables cannot go past
max_position_embeddings: such a cell reads "n/a" (beyond the table), never a crash or a silent clip.

Training (`train_lm`) is a plain loop, deterministic in its seed: random windows of L tokens from the training
stream, AdamW with linear warm-up and decay, gradient clipping, no dropout (a few hundred steps on one CPU
thread; see docs/causal.md for the measured tables).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dietpe.config import PRESETS
from dietpe.errors import ConfigError, DataError
from dietpe.positions.registry import REGISTRY
from dietpe.tasks.runtime import resolve_device

SIZES = {"toy": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256), **PRESETS}
RESULT = "lm_result.json"
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


# ------------------------------------------------------------------------------------------------ training
def causal_config(position_spec: str, size: str | dict, vocab_size: int, max_length: int, pad_token_id: int):
    """A `DietCausalConfig` from a method spec (`alibi`, `diet-rel:sharing=layer`) and a size (a name of SIZES,
    or its fields: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size)."""
    from dietpe.methods import parse_method
    from dietpe.models.causal import DietCausalConfig

    if not isinstance(size, dict) and size not in SIZES:
        raise ConfigError(f"--size {size!r} is not one of {', '.join(SIZES)}")
    method = parse_method(position_spec, DietCausalConfig, segment="none")
    sizes = size if isinstance(size, dict) else SIZES[size]
    return DietCausalConfig(**{**sizes, **method.config_fields(), "vocab_size": vocab_size,
                               "max_position_embeddings": max_length, "pad_token_id": pad_token_id,
                               "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})


def llama_lm(config, spec: str):
    """transformers' LlamaForCausalLM (pre-norm, RMSNorm, SwiGLU) of the sizes of a `DietCausalConfig`, its
    RoPE replaced by the method `spec` through `dietpe.attach`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from dietpe.integrations import attach

    llama = LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
                        num_attention_heads=config.num_attention_heads,
                        num_key_value_heads=config.num_attention_heads,
                        max_position_embeddings=config.max_position_embeddings,
                        initializer_range=config.initializer_range, pad_token_id=config.pad_token_id,
                        bos_token_id=None, eos_token_id=None, tie_word_embeddings=True)
    return attach(LlamaForCausalLM(llama), spec)


def position_config(model):
    """The config naming a model's position method and its limits: diet's own, or the `DietConfig` of a
    method attached to a Hugging Face model (`dietpe.attach`)."""
    attached = getattr(model.base_model, "diet_positions", None)
    return attached.config if attached is not None else model.config


def train_lm(config, stream: list[int], steps: int, batch_size: int, length: int, lr: float, seed: int,
             warmup: float = 0.06, log=print, device: str | None = "cpu", precision: str = "fp32",
             deterministic: bool = False, arch: str = "diet", spec: str | None = None, build=None):
    """Train a causal LM on random windows of `length` tokens; returns (model, seconds, losses). arch: `diet`
    (`DietForCausalLM` of `config`) or `llama` (transformers' Llama of its sizes with the method `spec`
    attached); `build`: a function returning another model to train instead (a peer library's, called under
    the same seed; it takes `model(ids, labels=ids).loss`)."""
    from dietpe.models.causal import DietForCausalLM
    from dietpe.tasks.runtime import autocast, resolve_device, set_determinism

    dev = resolve_device(device)
    set_determinism(dev, deterministic)

    if len(stream) <= length:
        raise DataError(f"the training text has {len(stream)} tokens, fewer than one window of {length}")
    torch.manual_seed(seed)
    # initialised on the CPU: the same weights on every device
    model = (build() if build is not None else DietForCausalLM(config) if arch == "diet"
             else llama_lm(config, spec or config.position)).to(dev)
    model.train()
    g = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 and "positions" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() > 1 and "positions" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98), eps=1e-6)
    warm = max(1, int(warmup * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (steps - s) / max(1, steps - warm)))
    losses, start = [], time.time()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - length, (batch_size,), generator=g)
        # windows read from the stream (a memory-mapped shard: only the batch is in memory)
        ids = torch.stack([torch.from_numpy(np.asarray(stream[s:s + length], dtype=np.int64))
                           for s in starts.tolist()]).to(dev)
        with autocast(dev, precision):
            loss = model(ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.detach())  # read at the log lines only: no host sync per step
        if (step + 1) % max(1, steps // 5) == 0:
            log(f"step {step + 1}/{steps}: loss {torch.stack(losses[-20:]).float().mean().item():.3f}")
    return model.eval(), time.time() - start, torch.stack(losses).float().tolist()


# ------------------------------------------------------------------------------------------------ evaluation
def beyond_table(config, length: int) -> bool:
    """A learned position table (the registry's `learned_table`) cannot serve `length` positions."""
    return REGISTRY[config.position].learned_table and length > config.max_position_embeddings


@torch.no_grad()
def causal_loss(model, stream: list[int], length: int, tokens: int, batch_size: int = 8) -> float | None:
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
def masked_loss(model, tokenizer, stream: list[int], length: int, tokens: int, batch_size: int = 8,
                seed: int = MASK_SEED) -> float | None:
    """Mean masked-token cross-entropy: the first `tokens` of `stream` masked once (fixed seed), windows
    [CLS] + length - 2 tokens + [SEP]; None beyond a learned table."""
    from dietpe.data.mlm import mask_tokens

    if beyond_table(position_config(model), length):
        return None
    ids = torch.tensor(stream[:tokens], dtype=torch.long)[None]
    special = torch.isin(ids, torch.tensor(sorted(set(tokenizer.all_special_ids))))
    first_word = max(tokenizer.all_special_ids) + 1
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
    windows of the longest length)."""
    tokens = tokens or 8 * max(multiples) * train_length
    causal = bool(getattr(position_config(model), "causal", False))
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
        ax.plot(xs, [r["ppl"][m] for m in xs], marker=markers[i % len(markers)], color=colours[i % len(colours)],
                label=f"{r['method']} ({r['kind']})" if len({x["kind"] for x in rows}) > 1 else r["method"])
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


def write_report(rows: list[dict], multiples, out: Path, title: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    md = table_markdown(rows, multiples, title)
    (out / "lengths.md").write_text(md + "\n![perplexity by length](lengths.png)\n", encoding="utf-8")
    (out / "lengths.csv").write_text(table_csv(rows, multiples), encoding="utf-8")
    (out / "lengths.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    plot(rows, multiples, out / "lengths.png", title)
    return md


def _log(message: str) -> None:
    print(f"[lm] {message}", file=sys.stderr)


def main_lm(args) -> int:
    from dietpe.data import shards
    from dietpe.data.tokenizer import load_tokenizer, save_tokenizer

    torch.set_num_threads(args.threads)
    resolve_device(args.device)  # a missing CUDA is refused before any work
    out = Path(args.output_dir)
    specs = [s.strip() for s in args.methods.split(",") if s.strip()]
    if not specs:
        raise ConfigError(f"--methods {args.methods!r} names no method; e.g. --methods alibi,rotary")
    for spec in specs:  # refuse a bad spec before reading any data
        causal_config(spec, args.size, 100, args.max_length, 0)
    tok_dir = out / "tokenizer"
    # the token streams from the shared cache (`dietpe.data.shards`), memory-mapped
    tokenizer = load_tokenizer(tok_dir) if (tok_dir / "tokenizer.json").is_file() else None
    prepared = shards.prepare(args.corpus, tokenizer=tokenizer, vocab_size=args.vocab_size, max_length=0,
                              packing="stream", max_documents=args.max_documents, cache_dir=args.cache_dir,
                              log=_log)
    if tokenizer is None:
        tokenizer = prepared.tokenizer
        tokenizer.save_pretrained(tok_dir)
    train, valid = prepared.train.tokens, prepared.validation.tokens
    _log(f"{len(train):,} training tokens, {len(valid):,} held-out tokens, vocabulary {len(tokenizer):,}")
    rows = []
    for spec in specs:
        run = out / ((f"{args.arch}-" if args.arch != "diet" else "") + spec.replace(":", "_"))
        done = run / RESULT
        if done.is_file():
            result = json.loads(done.read_text())
            _log(f"{spec}: finished earlier, reusing it")
        else:
            config = causal_config(spec, args.size, len(tokenizer), args.max_length, tokenizer.pad_token_id)
            model, seconds, losses = train_lm(config, train, args.steps, args.batch_size, args.max_length, args.lr,
                                              args.seed, log=lambda m, s=spec: _log(f"{s}: {m}"), device=args.device,
                                              precision=args.precision, deterministic=args.deterministic,
                                              arch=args.arch, spec=spec)
            ppl = length_perplexities(model, tokenizer, valid, args.max_length, args.lengths, args.eval_tokens)
            model.save_pretrained(run / "model")
            save_tokenizer(tokenizer, run / "model")
            result = dict(method=spec if args.arch == "diet" else f"{spec} ({args.arch})", kind="causal",
                          train_length=args.max_length, steps=args.steps,
                          seconds=seconds, final_train_loss=sum(losses[-20:]) / len(losses[-20:]),
                          ppl={str(m): v for m, v in ppl.items()})
            done.write_text(json.dumps(result, indent=1))
            _log(f"{spec}: {seconds:.0f}s; perplexity " + ", ".join(
                f"{m}L {'n/a' if v is None else f'{v:.2f}'}" for m, v in ppl.items()))
        rows.append(dict(method=result["method"], kind="causal", train_length=result["train_length"],
                         ppl={m: result["ppl"].get(str(m)) for m in args.lengths}))
    print(write_report(rows, args.lengths, out, f"causal LM, trained at L = {args.max_length}"))
    return 0


def _run_info(path: Path, train_length: int | None) -> tuple[Path, str, int]:
    """(model folder, method name, training length) of a `dietpe lm` or `dietpe pretrain` run folder."""
    model_dir = path / "model" if (path / "model" / "config.json").is_file() else path
    if not (model_dir / "config.json").is_file():
        raise DataError(f"{path}: no model (config.json) found")
    for name, read in ((RESULT, lambda r: (r["method"], r["train_length"])),
                       ("pretrain_results.json", lambda r: (r["method"], r["settings"]["max_length"]))):
        for folder in (path, model_dir.parent):
            if (folder / name).is_file():
                method, length = read(json.loads((folder / name).read_text()))
                return model_dir, method, train_length or length
    if train_length is None:
        raise ConfigError(f"{path}: the run does not record its training length; give --train-length")
    config = json.loads((model_dir / "config.json").read_text())
    return model_dir, config.get("position", path.name), train_length


def main_lengths(args) -> int:
    from transformers import AutoConfig

    from dietpe.data.tokenizer import load_tokenizer
    from dietpe.models.causal import DietForCausalLM
    from dietpe.models.modeling import DietForMaskedLM

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    rows, lengths = [], set()
    for run in args.runs:
        model_dir, method, length = _run_info(Path(run), args.train_length)
        config = AutoConfig.from_pretrained(model_dir)
        if getattr(config, "dietpe", None):  # a Hugging Face model with a method attached (`--arch llama`)
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model_dir).eval().to(device)  # re-attached on load
            causal = bool(position_config(model).causal)
        else:
            causal = bool(getattr(config, "causal", False))
            model = (DietForCausalLM if causal else DietForMaskedLM).from_pretrained(model_dir).eval().to(device)
        tokenizer = load_tokenizer(model_dir)
        # --data names held-out text: a file is that text itself; a folder gives its validation split
        stream = read_stream(args.data, tokenizer, "train" if Path(args.data).is_file() else "validation")
        ppl = length_perplexities(model, tokenizer, stream, length, args.lengths, args.eval_tokens)
        rows.append(dict(method=method, kind="causal" if causal else "masked", train_length=length, ppl=ppl))
        lengths.add(length)
        _log(f"{run}: " + ", ".join(f"{m}L {'n/a' if v is None else f'{v:.2f}'}" for m, v in ppl.items()))
    title = f"trained at L = {', '.join(map(str, sorted(lengths)))}"
    print(write_report(rows, args.lengths, Path(args.output_dir), title))
    return 0
