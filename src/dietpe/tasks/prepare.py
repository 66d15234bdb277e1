"""`dietpe prepare`: stream a pre-training corpus once into memory-mapped token shards in the cache
(`dietpe.data.shards`), which `dietpe pretrain`, every run of `dietpe compare` and `dietpe lm` then reuse.

The defaults (vocabulary, block length) are the recipe's, as in `dietpe pretrain`, so the same options there
find these shards instead of preparing again.
"""

from __future__ import annotations

import sys

from dietpe import validate as V
from dietpe.tasks.recipes import PRETRAIN_RECIPES


def main(args) -> int:
    from dietpe.data import shards
    from dietpe.data.tokenizer import load_tokenizer

    r = PRETRAIN_RECIPES[args.recipe]
    if args.cache_dir:
        V.check_output_dir(args.cache_dir, "--cache-dir")
    from dietpe.data.multilingual import corpus_source

    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    if args.tokenizer:
        V.refuse_unused(args, {"tokenizer_sample": "--tokenizer-sample", "vocab_size": "--vocab-size",
                               "tokenizer_type": "--tokenizer-type", "special_tokens": "--special-tokens"},
                        "with --tokenizer: no tokenizer is trained")
    corpus = corpus_source(args.corpus, args.languages, args.language_alpha)
    log = lambda m: print(f"[prepare] {m}", file=sys.stderr)  # noqa: E731
    p = shards.prepare(corpus, validation=args.validation, tokenizer=tokenizer,
                       vocab_size=args.vocab_size or r.vocab_size, max_length=args.max_length or r.max_length,
                       packing=args.packing, max_documents=args.max_documents,
                       tokenizer_sample=args.tokenizer_sample, cache_dir=args.cache_dir,
                       processes=args.processes, log=log,
                       tokenizer_type=args.tokenizer_type or r.tokenizer_type, special_tokens=args.special_tokens)
    m = p.manifest
    print(f"{p.folder}: {m['train']['blocks']:,} training blocks ({m['train']['tokens']:,} tokens), "
          f"{m['validation']['blocks']:,} validation blocks; vocabulary {len(p.tokenizer):,}")
    return 0
