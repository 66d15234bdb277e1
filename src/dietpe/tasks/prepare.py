"""`dietpe prepare`: stream a pre-training corpus once into memory-mapped token shards in the cache
(`dietpe.data.shards`), which `dietpe pretrain`, every run of `dietpe compare` and `dietpe lm` then reuse.

The defaults (vocabulary, block length) are the recipe's, as in `dietpe pretrain`, so the same options there
find these shards instead of preparing again.
"""

from __future__ import annotations

import argparse
import sys

from dietpe import validate as V
from dietpe.tasks.recipes import PRETRAIN_RECIPES


def register(subparsers) -> None:
    from dietpe.tasks.pretrain import add_data_options

    p = subparsers.add_parser("prepare", help="prepare a corpus once into token shards (reused by pretrain, "
                                              "compare, lm)", description=__doc__)
    p.add_argument("corpus", help="text file(s) directory (train.txt, valid.txt), a .txt/.jsonl/.tsv file, or a "
                                  "Hugging Face dataset name (streamed), such as wikitext:wikitext-2-raw-v1")
    p.add_argument("--validation", help="validation corpus (default: the corpus's valid file, else 5%% of the "
                                        "documents held out)")
    p.add_argument("--recipe", choices=sorted(PRETRAIN_RECIPES), default="cpu",
                   help="the pre-training recipe whose vocabulary size and block length are the defaults")
    p.add_argument("--tokenizer", help="an existing tokenizer (directory or tokenizer.json); default: train "
                                       "WordPiece on the corpus")
    p.add_argument("--vocab-size", type=V.int_at_least(6, ": 5 special tokens and a word"),
                   help="WordPiece vocabulary size when training one (default: the recipe's)")
    p.add_argument("--max-length", type=V.int_at_least(3, ": [CLS], a token and [SEP]"),
                   help="block length in tokens (default: the recipe's)")
    p.add_argument("--max-documents", type=V.positive_int, help="use only the first N documents of the corpus")
    p.add_argument("--processes", type=V.positive_int, help="worker processes (default: the cores, at most 8)")
    add_data_options(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from dietpe.data import shards
    from dietpe.data.tokenizer import load_tokenizer

    r = PRETRAIN_RECIPES[args.recipe]
    if args.cache_dir:
        V.check_output_dir(args.cache_dir, "--cache-dir")
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    if args.tokenizer:
        V.refuse_unused(args, {"tokenizer_sample": "--tokenizer-sample", "vocab_size": "--vocab-size"},
                        "with --tokenizer: no tokenizer is trained")
    log = lambda m: print(f"[prepare] {m}", file=sys.stderr)  # noqa: E731
    p = shards.prepare(args.corpus, validation=args.validation, tokenizer=tokenizer,
                       vocab_size=args.vocab_size or r.vocab_size, max_length=args.max_length or r.max_length,
                       packing=args.packing, max_documents=args.max_documents,
                       tokenizer_sample=args.tokenizer_sample, cache_dir=args.cache_dir,
                       processes=args.processes, log=log)
    m = p.manifest
    print(f"{p.folder}: {m['train']['blocks']:,} training blocks ({m['train']['tokens']:,} tokens), "
          f"{m['validation']['blocks']:,} validation blocks; vocabulary {len(p.tokenizer):,}")
    return 0
