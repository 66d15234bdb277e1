"""Length generalisation beside the peers: one training loop, one AdamW and one learning rate (as a user's own
code has), character-level text, perplexity per character at L, 2L, 4L, 8L (Press et al. 2022's protocol).

    python -m dietpe.bench.lengths --data ../shared/data/wikitext-2 -o runs/lengths [--steps 600]
        [--methods none,rotary,alibi,t5,diet-rel,kerple] [--peers diet,llama,x-transformers,hf-llama]

Every model is trained by `dietpe.tasks.lm.train_lm` on the same batches from the same seed and scored by
`length_perplexities` on the same held-out characters. The models (same width, depth, heads):

    diet             diet's own causal LM with the method (`dietpe lm --arch diet`)
    llama            transformers' LlamaForCausalLM, its RoPE replaced by the method (`dietpe.attach`)
    x-transformers   `TransformerWrapper(Decoder(...))` with its own option for the method: `rotary_pos_emb`,
                     `alibi_pos_bias`, `rel_pos_bias` (T5), or no positions (`pip install 'dietpe[bench]'`)
    hf-llama         transformers' LlamaForCausalLM with its own RoPE (rotary only)

A peer without a method leaves its cell empty. Writes lengths.csv and lengths.json (every length) and
lengths.md (L and 8L per model) after every run; each finished run is kept in runs/ with its settings, so a
stopped table resumes where it stopped, and a run with other settings is trained again.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from dietpe.data.text import write_text_atomic
from dietpe.errors import ConfigError, DataError, DietError

PEERS = ("diet", "llama", "x-transformers", "hf-llama")
#: the default rows; --methods takes any registered method a causal LM can hold
METHODS = ("none", "rotary", "alibi", "t5", "diet-rel", "kerple")
TITLES = {"diet": "diet's model", "llama": "Llama + attach", "x-transformers": "x-transformers",
          "hf-llama": "transformers Llama"}
# each peer's own option for a method (x-transformers' Decoder keywords); a method absent here is ours only
X_OPTIONS = {"none": {}, "rotary": {"rotary_pos_emb": True}, "alibi": {"alibi_pos_bias": True},
             "t5": {"rel_pos_bias": True}}
HF_LLAMA = ("rotary",)
MULTIPLES = (1, 2, 4, 8)


# ------------------------------------------------------------------------------------------------ text
def char_streams(folder: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(train ids, held-out ids, vocabulary size) of a folder's train.txt and valid.txt, one id per
    character; id 0 is every character the training text lacks (and padding)."""
    root = Path(folder)
    texts = []
    for name in ("train.txt", "valid.txt"):
        if not (root / name).is_file():
            raise DataError(f"{root / name}: not found (--data names a folder with train.txt and valid.txt)")
        texts.append((root / name).read_text(encoding="utf-8"))
    chars = sorted(set(texts[0]))
    if not chars:
        raise DataError(f"{root / 'train.txt'}: no text")
    index = {c: i + 1 for i, c in enumerate(chars)}
    ids = [np.fromiter((index.get(c, 0) for c in t), dtype=np.int32, count=len(t)) for t in texts]
    return ids[0], ids[1], len(chars) + 1


# ------------------------------------------------------------------------------------------------ models
class PeerLM(nn.Module):
    """A peer library's causal LM behind the interface `train_lm` and `length_perplexities` use:
    `model(ids, labels=ids)` gives `.loss` (next-token cross-entropy) and `.logits`, and `config` names the
    method (a registry name, for `beyond_table`) and says it is causal."""

    def __init__(self, inner: nn.Module, method: str, hf: bool):
        super().__init__()
        self.inner, self.hf = inner, hf
        self.config = SimpleNamespace(position=method, causal=True)

    @property
    def base_model(self):
        return self

    @property
    def device(self):
        return next(self.parameters()).device

    def forward(self, ids, labels=None):
        if self.hf:
            return self.inner(ids, labels=labels)
        logits = self.inner(ids)  # (B, L, V)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                               labels[:, 1:].reshape(-1))
        return SimpleNamespace(loss=loss, logits=logits)


def x_transformers_lm(method: str, sizes: dict, vocab_size: int, max_length: int) -> PeerLM:
    from dietpe.extras import need

    xt = need("x_transformers")
    d, h = sizes["hidden_size"], sizes["num_attention_heads"]
    decoder = xt.Decoder(dim=d, depth=sizes["num_hidden_layers"], heads=h, attn_dim_head=d // h,
                         ff_mult=sizes["intermediate_size"] // d, **X_OPTIONS[method])
    # no absolute table: the position is the method's alone (and any length can be read)
    return PeerLM(xt.TransformerWrapper(num_tokens=vocab_size, max_seq_len=max_length, attn_layers=decoder,
                                        use_abs_pos_emb=False), method, hf=False)


def hf_llama_lm(method: str, sizes: dict, vocab_size: int, max_length: int) -> PeerLM:
    """transformers' LlamaForCausalLM as it comes (its own RoPE), of the sizes given."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=sizes["hidden_size"],
                         intermediate_size=sizes["intermediate_size"],
                         num_hidden_layers=sizes["num_hidden_layers"],
                         num_attention_heads=sizes["num_attention_heads"],
                         num_key_value_heads=sizes["num_attention_heads"], max_position_embeddings=max_length,
                         pad_token_id=0, bos_token_id=None, eos_token_id=None, tie_word_embeddings=True)
    return PeerLM(LlamaForCausalLM(config), method, hf=True)


def offers(peer: str, method: str) -> bool:
    """Whether `peer` has `method` of its own (diet and the attached Llama have every method)."""
    return {"x-transformers": method in X_OPTIONS, "hf-llama": method in HF_LLAMA}.get(peer, True)


# ------------------------------------------------------------------------------------------------ runs
def run_one(peer: str, method: str, train, valid, vocab_size: int, args, log) -> dict:
    from dietpe.tasks.lm import causal_config, length_perplexities, train_lm

    sizes = model_sizes(args)
    config = causal_config(method, sizes, vocab_size, args.length, 0)
    build = {"x-transformers": lambda: x_transformers_lm(method, sizes, vocab_size, args.length),
             "hf-llama": lambda: hf_llama_lm(method, sizes, vocab_size, args.length)}.get(peer)
    model, seconds, losses = train_lm(config, train, args.steps, args.batch_size, args.length, args.lr,
                                      args.seed, log=log, arch="llama" if peer == "llama" else "diet",
                                      spec=method, build=build)
    start = time.time()
    ppl = length_perplexities(model, None, valid, args.length, MULTIPLES, args.eval_tokens)
    return dict(peer=peer, method=method, steps=args.steps, batch_size=args.batch_size, settings=settings(args),
                train_seconds=round(seconds, 1), eval_seconds=round(time.time() - start, 1),
                final_train_loss=sum(losses[-20:]) / len(losses[-20:]), ppl={str(m): ppl[m] for m in MULTIPLES})


def table_markdown(results: list[dict], peers, methods, length: int) -> str:
    """Rows: methods; columns: each model's perplexity at L and 8L (– where the peer lacks the method)."""
    cell = {(r["peer"], r["method"]): r["ppl"] for r in results}
    head = ["method"] + [f"{TITLES[p]}: {m}" for p in peers for m in ("L", "8L")]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " --: |" * (len(head) - 1)]
    for method in methods:
        row = [method]
        for p in peers:
            ppl = cell.get((p, method))
            row += ["–", "–"] if ppl is None else [_ppl(ppl['1']), _ppl(ppl['8'])]
        lines.append("| " + " | ".join(row) + " |")
    return f"Perplexity per character, trained at L = {length}.\n\n" + "\n".join(lines) + "\n"


def _ppl(value: float | None, digits: int = 2) -> str:
    """A perplexity, or n/a where the length is beyond the method's learned table."""
    return "n/a (beyond the table)" if value is None else f"{value:.{digits}f}"


def table_csv(results: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", "method", "steps", "batch_size", "train_seconds"] + [f"ppl_{m}L" for m in MULTIPLES])
    for r in results:
        w.writerow([r["peer"], r["method"], r["steps"], r["batch_size"], r["train_seconds"]]
                   + ["" if r["ppl"][str(m)] is None else f"{r['ppl'][str(m)]:.4f}" for m in MULTIPLES])
    return buf.getvalue()


def _names(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n.split(":")[0] not in allowed]
    if bad or not names:
        raise ConfigError(f"{option} {text!r}: {', '.join(bad) or 'nothing'} is not one of {', '.join(allowed)}")
    return names


def model_sizes(args) -> dict:
    return dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                intermediate_size=4 * args.hidden)


def settings(args) -> dict:
    """What a run's figures depend on besides its peer and method: a kept run is reused only if they match."""
    return {k: getattr(args, k) for k in ("steps", "batch_size", "length", "hidden", "layers", "heads", "lr",
                                          "seed", "eval_tokens", "data")}


def write_tables(out: Path, results: list[dict], peers, methods, length: int) -> str:
    md = table_markdown(results, peers, methods, length)
    for name, text in (("lengths.md", md), ("lengths.csv", table_csv(results)),
                       ("lengths.json", json.dumps(results, indent=1))):
        write_text_atomic(out / name, text)
    return md


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dietpe.bench.lengths", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a folder with train.txt and valid.txt (e.g. wikitext-2)")
    p.add_argument("-o", "--output-dir", required=True,
                   help="where lengths.md, lengths.csv and lengths.json go (written after every run)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="method specs, any registered method a causal LM takes (default: %(default)s)")
    p.add_argument("--peers", default=",".join(PEERS),
                   help="the models to train, each with every method it has: diet (diet's causal LM), llama "
                        "(transformers' Llama with the method attached), x-transformers (its own option for "
                        "the method; pip install 'dietpe[bench]'), hf-llama (transformers' Llama with its own "
                        "RoPE, for rotary) (default: %(default)s)")
    p.add_argument("--steps", type=int, default=600, help="optimizer steps per model (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per step (default: %(default)s)")
    p.add_argument("--length", type=int, default=128, help="the training length L in characters (default: "
                                                             "%(default)s)")
    p.add_argument("--hidden", type=int, default=128, help="hidden size, FFN 4x (default: %(default)s)")
    p.add_argument("--layers", type=int, default=4, help="(default: %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="(default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="the one learning rate of the one AdamW, warm-up 6%% "
                                                           "and linear decay (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="initialisation and batch order (default: %(default)s)")
    p.add_argument("--eval-tokens", type=int, default=16384,
                   help="held-out characters scored at every length (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per run (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except DietError as e:  # includes a missing x-transformers (MissingExtra)
        print(f"{parser().prog}: error: {e}", file=sys.stderr)
        return 2


def run(args) -> int:
    from dietpe.positions.registry import names

    methods = _names(args.methods, names(causal_ok=True), "--methods")
    peers = _names(args.peers, PEERS, "--peers")
    if min(args.steps, args.batch_size, args.length, args.hidden, args.layers, args.heads, args.threads) < 1 \
            or args.hidden % args.heads:
        raise ConfigError("--steps, --batch-size, --length, --hidden, --layers, --heads and --threads must be "
                          f">= 1, and --hidden ({args.hidden}) a multiple of --heads ({args.heads})")
    if "x-transformers" in peers:
        from dietpe.extras import need

        need("x_transformers")  # refused before any training
    from dietpe.tasks.lm import causal_config

    for method in methods:  # each spec's fields checked before any output exists
        causal_config(method, model_sizes(args), 8, args.length, 0)
    torch.set_num_threads(args.threads)
    train, valid, vocab_size = char_streams(args.data)
    out = Path(args.output_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    results = []
    for peer in peers:
        for method in methods:
            if not offers(peer, method):
                continue
            done = out / "runs" / f"{peer}-{method.replace(':', '_')}.json"
            if done.is_file():  # finished earlier with the same settings: kept
                kept = json.loads(done.read_text())
                if kept.get("settings") == settings(args):
                    results.append(kept)
                    continue
            result = run_one(peer, method, train, valid, vocab_size, args,
                             lambda m, p=peer, n=method: print(f"[lengths] {p} {n}: {m}", file=sys.stderr))
            write_text_atomic(done, json.dumps(result, indent=1))
            print(f"[lengths] {peer} {method}: {result['train_seconds']:.0f}+{result['eval_seconds']:.0f}s; "
                  + ", ".join(f"{m}L {_ppl(v)}" for m, v in result["ppl"].items()), file=sys.stderr)
            results.append(result)
            write_tables(out, results, peers, methods, args.length)
    md = write_tables(out, results, peers, methods, args.length)
    print(md)
    return 0


if __name__ == "__main__":
    from dietpe.errors import module_main

    sys.exit(module_main(main, "python -m dietpe.bench.lengths"))
