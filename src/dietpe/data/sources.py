"""Where pre-training text comes from: one corpus (`dietpe.data.corpus`: a file, a folder, a Hugging Face name)
or a multilingual mixture of them (`dietpe.data.multilingual`, a corpus string beginning `mix:`). The shards
(`dietpe.data.shards`) read every corpus through these two functions, so a mixture is prepared, cached and
keyed like any corpus.
"""

from __future__ import annotations

from dietpe.data import multilingual
from dietpe.data.corpus import chunk_records, iter_chunks, resolve_source


def resolve(source: str, split: str = "train") -> tuple[str, str, str] | None:
    """(kind, where, origin) of a split without reading it, as `corpus.resolve_source`, with kind `mix` for a
    mixture (which always has a validation split: each language's own, or held out)."""
    if multilingual.is_mixture(source):
        mix = multilingual.Mixture.parse(source)
        return "mix", source, (f"{len(mix.languages)} languages ({', '.join(c for c, _ in mix.languages)}; "
                               f"alpha {mix.alpha:g})[{split}]")
    return resolve_source(source, split)


def chunks(kind: str, where: str, split: str = "train", chunk_chars: int | None = None):
    """Chunks `(mode, strings)` of a resolved split, in order (`corpus.iter_chunks`; a mixture's documents in
    their interleaved order)."""
    if kind == "mix":
        return chunk_records((("documents", text) for text in multilingual.mixture_records(where, split)),
                             chunk_chars)
    return iter_chunks(kind, where, split, chunk_chars)
