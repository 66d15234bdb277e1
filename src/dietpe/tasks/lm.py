"""`dietpe lm`: causal language models with every position method, then length generalisation.

Most position-encoding research today asks what happens beyond the training length (ALiBi, Press et al. 2022;
KERPLE, Chi et al. 2022; NoPE, Kazemnejad et al. 2023): train at length L, measure perplexity at L, 2L, 4L, 8L.

    dietpe lm CORPUS --methods none,rotary,alibi,kerple -o runs/lm      train a small causal LM per method at
                                                                      length L, then the table and plot
                                                                      (default: every method a causal LM takes)
    dietpe lengths RUN [RUN ...] --data valid.txt -o lengths            the same evaluation for saved runs
                                                                      (`dietpe.tasks.lengths`)

The evaluation (`length_perplexities`) and its table are in `dietpe.tasks.perplexity`, shared by both commands.

Training (`train_lm`) is a plain loop, deterministic in its seed: random windows of L tokens from the training
stream, AdamW with linear warm-up and decay, gradient clipping, no dropout (a few hundred steps on one CPU
thread; see docs/causal.md for the measured tables).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import torch

from dietpe.commands import ALL_CAUSAL
from dietpe.config import PRESETS
from dietpe.errors import ConfigError, DataError
from dietpe.methods import Method
from dietpe.positions.registry import names
from dietpe.tasks.perplexity import check_windows, length_perplexities, read_stream, token_stream, write_report
from dietpe.tasks.perplexity import log as _log
from dietpe.tasks.runtime import resolve_device

SIZES = {"toy": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256), **PRESETS}
RESULT = "lm_result.json"

# the evaluation, importable from here as well: `dietpe lm` trains and evaluates in one call
__all__ = ["SIZES", "RESULT", "causal_config", "llama_lm", "train_lm", "main_lm", "length_perplexities",
           "read_stream", "token_stream"]


def causal_config(position_spec: str | Method, size: str | dict, vocab_size: int, max_length: int,
                  pad_token_id: int):
    """A `DietCausalConfig` from a method spec (`alibi`, `diet-rel:sharing=layer`, or one parsed already) and
    a size (a name of SIZES, or its fields: hidden_size, num_hidden_layers, num_attention_heads,
    intermediate_size)."""
    from dietpe.methods import parse_method
    from dietpe.models.causal import DietCausalConfig

    if not isinstance(size, dict) and size not in SIZES:
        raise ConfigError(f"--size {size!r} is not one of {', '.join(SIZES)}")
    method = position_spec if isinstance(position_spec, Method) else \
        parse_method(position_spec, DietCausalConfig, segment="none")
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


# ------------------------------------------------------------------------------------------------ training
def train_lm(config, stream: list[int], steps: int, batch_size: int, length: int, lr: float, seed: int,
             warmup: float = 0.06, log=print, device: str | None = "cpu", precision: str = "fp32",
             deterministic: bool = False, arch: str = "diet", spec: str | None = None, build=None,
             compile: str | None = None):
    """Train a causal LM on random windows of `length` tokens; returns (model, seconds, losses). arch: `diet`
    (`DietForCausalLM` of `config`) or `llama` (transformers' Llama of its sizes with the method `spec`
    attached); `build`: a function returning another model to train instead (a peer library's, called under
    the same seed; it takes `model(ids, labels=ids).loss`); compile: the training steps' forward compiled
    (`runtime.compile_model`: an inductor mode or a code-free backend), the returned model eager."""
    from dietpe.models.causal import DietForCausalLM
    from dietpe.tasks.runtime import autocast, compile_model, resolve_device, set_determinism

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
    if compile:  # each method's model compiles from nothing: the 9th of one process met dynamo's recompile
        torch._dynamo.reset()  # limit (one forward code, a new method class each) and ran uncompiled unsaid
    forward, losses, start = compile_model(model, compile), [], time.time()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - length, (batch_size,), generator=g)
        # windows read from the stream (a memory-mapped shard: only the batch is in memory)
        ids = torch.stack([torch.from_numpy(np.asarray(stream[s:s + length], dtype=np.int64))
                           for s in starts.tolist()]).to(dev)
        with autocast(dev, precision):
            loss = forward(ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.detach())  # read at the log lines only: no host sync per step
        if (step + 1) % max(1, steps // 5) == 0:
            log(f"step {step + 1}/{steps}: loss {torch.stack(losses[-20:]).float().mean().item():.3f}")
    return model.eval(), time.time() - start, torch.stack(losses).float().tolist()


def method_specs(text: str) -> list[str]:
    """`--methods`: comma-separated specs; `all` stands for every registered method a causal LM takes. A method
    written twice (`absolute,absolute`, or two spellings of one spec) is refused, as `parse_methods` does."""
    from dietpe.methods import parse_method
    from dietpe.models.causal import DietCausalConfig

    def canonical(spec: str) -> str:
        return parse_method(spec, DietCausalConfig, segment="none").name

    specs = [s.strip() for s in text.split(",") if s.strip()]
    if ALL_CAUSAL in specs:  # in registry order, without the methods named beside it
        at = specs.index(ALL_CAUSAL)
        given = {canonical(s) for s in specs if s != ALL_CAUSAL}
        specs[at:at + 1] = [n for n in names(causal_ok=True) if canonical(n) not in given]
    if not specs:
        raise ConfigError(f"--methods {text!r} names no method; e.g. --methods alibi,rotary")
    seen, dupes = set(), set()
    for spec in specs:
        name = canonical(spec)
        if name in seen:
            dupes.add(spec)  # as written: the canonical name spells out causal defaults (segment=none)
        seen.add(name)
    if dupes:
        raise ConfigError(f"methods listed twice: {sorted(dupes)}")
    return specs


def run_record(args) -> dict:
    """What every result in the output folder depends on, recorded there before any work (`check_run_settings`):
    a rerun with other settings is refused, one with the same reuses the methods it finished. --methods and
    --arch are not in it: each method (and arch) has its own folder, so a rerun may add methods."""
    from dietpe.data import shards
    from dietpe.tasks.checkpoints import local_path

    train, (validation, _, _) = shards.sources(args.corpus, None)  # what the text is, not only where
    return dict(task="lm", corpus=local_path(args.corpus), data=shards.content(dict(train=train,
                                                                                   validation=validation)),
                max_documents=args.max_documents,
                vocab_size=args.vocab_size, size=args.size, max_length=args.max_length, steps=args.steps,
                batch_size=args.batch_size, lr=args.lr, seed=args.seed, lengths=list(args.lengths),
                eval_tokens=args.eval_tokens, precision=args.precision, compile=args.compile)


def main_lm(args) -> int:
    from dietpe import validate as V
    from dietpe.extras import need

    need("matplotlib")  # the report's plot: refused before any training, not after it
    torch.set_num_threads(args.threads)
    resolve_device(args.device)  # a missing CUDA is refused before any work
    out = V.check_output_dir(args.output_dir, "-o")
    if args.cache_dir:
        V.check_output_dir(args.cache_dir, "--cache-dir")
    specs = method_specs(args.methods)
    # each spec parsed and its config built (so validated) once, before reading any data; the tokenizer then
    # sets the vocabulary and pad id
    configs = {spec: causal_config(spec, args.size, 100, args.max_length, 0) for spec in specs}
    check_windows(args.max_length, args.lengths, True, tokens=args.eval_tokens)
    if not args.ignore_memory_check:
        check_lm_memory(args, specs)
    if args.precision == "fp16":  # fp16's gradients underflow without a loss scaler, which this loop lacks
        raise ConfigError("--precision fp16: dietpe lm's training loop scales no loss; use bf16 or fp32")
    with V.created_only_on_success(out):
        return _main_lm(args, out, specs, configs)


def check_lm_memory(args, specs: list[str]) -> None:
    """Training at --batch-size x --max-length and scoring the longest length (windows of SCORING_BATCH), each
    refused before any work where its estimated memory exceeds what is available; at --vocab-size, the
    largest the tokenizer may give."""
    from dietpe.tasks.perplexity import SCORING_BATCH
    from dietpe.tasks.runtime import check_memory

    for spec in specs:
        config = causal_config(spec, args.size, args.vocab_size, args.max_length, 0)
        what = f"{spec} at size {args.size} (vocabulary {args.vocab_size})"
        check_memory(config, args.batch_size, args.max_length, args.device, what,
                     fix="lower --batch-size, --max-length or --size")
        longest = max(args.lengths) * args.max_length
        check_memory(config, SCORING_BATCH, longest, args.device, f"{what}, scored at {longest:,} tokens",
                     fix="lower --lengths, --max-length or --size", scoring=True)


def _main_lm(args, out: Path, specs: list[str], configs: dict) -> int:
    from dietpe.data import shards
    from dietpe.data.tokenizer import load_tokenizer
    from dietpe.tasks.checkpoints import check_run_settings, read_result

    check_run_settings(out, run_record(args), "another -o (or delete the folder)",
                       products=("tokenizer", "*/" + RESULT, "*/model", "lengths.*"), added=("data",))
    tok_dir = out / "tokenizer"
    # the token streams from the shared cache (`dietpe.data.shards`), memory-mapped
    tokenizer = load_tokenizer(tok_dir) if (tok_dir / "tokenizer.json").is_file() else None
    prepared = shards.prepare(args.corpus, tokenizer=tokenizer, vocab_size=args.vocab_size, max_length=0,
                              packing="stream", max_documents=args.max_documents, cache_dir=args.cache_dir,
                              log=_log)
    # the tokenizer given to prepare, else the one it trained
    tokenizer, train, valid = prepared.tokenizer, prepared.train.tokens, prepared.validation.tokens
    _log(f"{len(train):,} training tokens, {len(valid):,} held-out tokens, vocabulary {len(tokenizer):,}")
    # refused before anything is saved (the folder then goes again) and before training, not after
    if len(train) <= args.max_length:
        raise DataError(f"the training text has {len(train)} tokens, fewer than one window of --max-length "
                        f"{args.max_length}; give more text" + (", a larger --max-documents" if args.max_documents
                                                                else "") + " or a smaller --max-length")
    check_windows(args.max_length, args.lengths, True, text=len(valid))
    if not (tok_dir / "tokenizer.json").is_file():
        tokenizer.save_pretrained(tok_dir)
    rows = []
    for spec in specs:
        run = out / ((f"{args.arch}-" if args.arch != "diet" else "") + spec.replace(":", "_"))
        done = run / RESULT
        if done.is_file():
            result = read_result(done, ("method", "train_length", "ppl"))
            _log(f"{spec}: finished earlier, reusing it")
        else:
            result = _train_method(args, spec, configs[spec], tokenizer, train, valid, run)
        rows.append(dict(method=result["method"], kind="causal", train_length=result["train_length"],
                         ppl={m: result["ppl"].get(str(m)) for m in args.lengths}))
    print(write_report(rows, args.lengths, out, f"causal LM, trained at L = {args.max_length}"))
    return 0


def _train_method(args, spec: str, config, tokenizer, train, valid, run: Path) -> dict:
    """Train and evaluate one method, save its model and write its result (last: it marks the method done)."""
    from dietpe.data.tokenizer import save_tokenizer
    from dietpe.tasks.checkpoints import write_json_atomic

    config = copy.deepcopy(config)
    config.vocab_size, config.pad_token_id = len(tokenizer), tokenizer.pad_token_id
    model, seconds, losses = train_lm(config, train, args.steps, args.batch_size, args.max_length, args.lr,
                                      args.seed, log=lambda m, s=spec: _log(f"{s}: {m}"), device=args.device,
                                      precision=args.precision, deterministic=args.deterministic,
                                      arch=args.arch, spec=spec, compile=args.compile)
    ppl = length_perplexities(model, tokenizer, valid, args.max_length, args.lengths, args.eval_tokens)
    model.save_pretrained(run / "model")
    save_tokenizer(tokenizer, run / "model")
    result = dict(method=spec if args.arch == "diet" else f"{spec} ({args.arch})", kind="causal",
                  train_length=args.max_length, steps=args.steps,
                  seconds=seconds, final_train_loss=sum(losses[-20:]) / len(losses[-20:]),
                  ppl={str(m): v for m, v in ppl.items()}, compile=args.compile)
    write_json_atomic(run / RESULT, result)  # whole or absent: a killed run never leaves half a result
    _log(f"{spec}: {seconds:.0f}s; perplexity " + ", ".join(
        f"{m}L {'n/a' if v is None else f'{v:.2f}'}" for m, v in ppl.items()))
    return result
