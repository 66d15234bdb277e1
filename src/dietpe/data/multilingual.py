"""Multilingual pre-training corpora: one corpus per language, mixed with the exponent rule of multilingual BERT
and XLM, so that low-resource languages are seen more often than their share of the text.

With p_i the share of language i's training sentences, the mixture samples language i with probability

    q_i = p_i^α / Σ_j p_j^α                                 (Lample & Conneau 2019, §3.1; Conneau et al. 2020)

α = 1 keeps the corpus's own shares, α → 0 makes every language equally likely. multilingual BERT smooths with
α = 0.7, XLM-R with 0.3, XLM with 0.5. The DIET paper pre-trains on Wikipedia in 100 languages "similar to
(Lample and Conneau, 2019)", so `paper-multilingual` takes XLM's α = 0.5; `--language-alpha` sets another.

The mixture keeps the corpus's size in sentences: language i's training documents are emitted r_i = q_i S / s_i
times on average (S all training sentences, s_i language i's). A language seen less than its share is repeated:
whole passes over its documents, then a last pass keeping each document with probability frac(r_i); one seen
more keeps each document with probability r_i. Each keep is a pure function of (language, pass, document), so
the mixture is deterministic and streamed: documents are read in order, a few languages' files open at once,
never held whole. Languages are interleaved evenly (each language's k-th document at virtual time
(k + ½) / E_i, E_i its expected documents), so a held-out or truncated part of the stream holds every language.

Validation is each language's own validation split where it has one, else its first 1/20 of documents (held out
before sampling, so no validation document is ever trained on), interleaved the same way, not re-sampled.

A language is a corpus as `dietpe pretrain` reads one (`dietpe.data.corpus`): a file, a directory, or a
Hugging Face dataset name, streamed. The command line names the languages with `--languages en,de,...` and
the corpus as a template holding `{lang}` (`wikimedia/wikipedia:20231101.{lang}`, `data/{lang}.txt`) or as a
directory holding `<lang>.txt` / `<lang>.jsonl` / `<lang>.tsv` files or `<lang>/` corpus folders. The mixture
travels through the pipeline as a corpus string (`mix:` and its JSON), so shards, caches and run records key on
it like any corpus.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from dietpe.data.corpus import EXTENSIONS, chunk_documents, is_hf_name, iter_chunks, resolve_source
from dietpe.errors import ConfigError, DataError

PREFIX = "mix:"
DEFAULT_ALPHA = 0.5   # XLM's (Lample & Conneau 2019), whose set-up the DIET paper follows
HOLDOUT = 20          # without a validation split, a language's first 1/20 of documents are held out
_LANGUAGE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Mixture:
    """Languages (code, corpus source) sampled with exponent `alpha`."""

    languages: tuple[tuple[str, str], ...]
    alpha: float = DEFAULT_ALPHA

    def __post_init__(self):
        if not (0 < self.alpha <= 1):
            raise ConfigError(f"--language-alpha {self.alpha} must lie in (0, 1] (1: the corpus's own shares; "
                              f"XLM 0.5, mBERT 0.7, XLM-R 0.3)")
        codes = [code for code, _ in self.languages]
        if len(codes) < 1 or len(set(codes)) != len(codes):
            raise ConfigError(f"--languages {','.join(codes)}: give each language once")

    def source(self) -> str:
        """The corpus string the pipeline carries: `mix:` and canonical JSON."""
        return PREFIX + json.dumps(dict(alpha=self.alpha, languages=dict(self.languages)), sort_keys=True)

    @classmethod
    def parse(cls, source: str) -> Mixture:
        try:
            data = json.loads(source[len(PREFIX):])
            return cls(tuple(sorted(data["languages"].items())), float(data["alpha"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DataError(f"{source[:60]}...: not a multilingual corpus description") from None


def is_mixture(source: str) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def language_sources(corpus: str, languages: list[str]) -> list[tuple[str, str]]:
    """(code, source) per language: `corpus` with `{lang}` replaced, or the language's entry of a directory."""
    bad = [code for code in languages if not _LANGUAGE.match(code)]
    if bad:
        raise ConfigError(f"--languages: {bad[0]!r} is not a language code (letters, digits, _ . -)")
    if "{lang}" in corpus:
        out = [(code, corpus.replace("{lang}", code)) for code in languages]
        missing = [s for _, s in out if not Path(s).exists() and not is_hf_name(s)]
        if missing:
            raise DataError(f"{missing[0]}: no such file or directory (from the corpus template {corpus})")
        return out
    folder = Path(corpus)
    if not folder.is_dir():
        raise ConfigError(f"--languages needs the corpus as a template holding {{lang}} (e.g. "
                          f"wikimedia/wikipedia:20231101.{{lang}}, data/{{lang}}.txt) or a directory of "
                          f"per-language files; {corpus} is neither")
    out = []
    for code in languages:
        found = [p for p in [folder / code] + [folder / f"{code}{ext}" for ext in EXTENSIONS] if p.exists()]
        if not found:
            raise DataError(f"{folder}: no corpus for language {code!r} (looked for {code}/, "
                            + ", ".join(f"{code}{ext}" for ext in EXTENSIONS) + ")")
        out.append((code, str(found[0].resolve())))
    return out


def corpus_source(corpus: str, languages: str | None, alpha: float | None) -> str:
    """The corpus string for the command line's `corpus`, `--languages` and `--language-alpha`."""
    if not languages:
        if alpha is not None:
            raise ConfigError("--language-alpha applies to a multilingual corpus: give --languages too")
        return corpus
    codes = [c.strip() for c in languages.split(",") if c.strip()]
    if not codes:
        raise ConfigError(f"--languages {languages!r} names no language (e.g. --languages en,de,fr)")
    return Mixture(tuple(language_sources(corpus, codes)), DEFAULT_ALPHA if alpha is None else alpha).source()


def sampling_probabilities(sizes: dict[str, float], alpha: float) -> dict[str, float]:
    """q_i = p_i^α / Σ_j p_j^α with p_i = sizes[i] / Σ sizes (the exponent rule)."""
    total = sum(sizes.values())
    if total <= 0:
        raise DataError("the multilingual corpus is empty")
    weights = {code: (n / total) ** alpha if n > 0 else 0.0 for code, n in sizes.items()}
    norm = sum(weights.values())
    return {code: w / norm for code, w in weights.items()}


def sampling_rates(sizes: dict[str, float], alpha: float) -> dict[str, float]:
    """How many times each language's text is used on average, keeping the total: r_i = q_i Σ s / s_i."""
    q = sampling_probabilities(sizes, alpha)
    total = sum(sizes.values())
    return {code: q[code] * total / n if n > 0 else 0.0 for code, n in sizes.items()}


def uniform(*parts) -> float:
    """A number in [0, 1) that is a pure function of `parts` (blake2b), unlike Python's `hash`."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2 ** 64


# -- reading ---------------------------------------------------------------------------------------------------

def _documents(source: str, split: str) -> Iterator[list[str]]:
    resolved = resolve_source(source, split)
    if resolved is None:
        return
    kind, where, _ = resolved
    for mode, strings in iter_chunks(kind, where, split):
        yield from chunk_documents(mode, strings)


@dataclass(frozen=True)
class Language:
    """One language's documents: how many, how many sentences, and where training starts."""

    code: str
    source: str
    own_validation: bool   # its corpus has a validation split; else the first `held` documents are held out
    held: int
    documents: int         # training documents
    sentences: int         # training sentences
    validation: int        # validation documents


@lru_cache(maxsize=8)
def languages(source: str) -> tuple[Language, ...]:
    """Each language's counts (one streamed pass over each), kept for the process: every pass of the
    preparation (documents, tokenizer, shards) samples from the same numbers."""
    out = []
    for code, src in Mixture.parse(source).languages:
        own = resolve_source(src, "validation") is not None
        sizes = [len(d) for d in _documents(src, "train")]
        held = 0 if own else max(1, len(sizes) // HOLDOUT)
        if len(sizes) - held < 1:
            raise DataError(f"{src} (language {code}): {len(sizes)} document(s), too few to hold out validation "
                            f"and train; give the language a validation split or more text")
        validation = sum(1 for _ in _documents(src, "validation")) if own else held
        out.append(Language(code, src, own, held, len(sizes) - held, sum(sizes[held:]), validation))
    return tuple(out)


def _stream(lang: Language, index: int, split: str, rate: float) -> Iterator[tuple[float, int, list[str]]]:
    """(virtual time, language index, document) of one language's part of the mixture."""
    if split != "train":
        docs = (_documents(lang.source, "validation") if lang.own_validation
                else (d for _, d in zip(range(lang.held), _documents(lang.source, "train"))))
        for j, doc in enumerate(docs):
            yield (j + 0.5) / max(lang.validation, 1), index, doc
        return
    whole, part = int(math.floor(rate)), rate - math.floor(rate)
    expected, j = max(rate * lang.documents, 1e-9), 0
    for t in range(whole + (part > 0)):
        for k, doc in enumerate(_documents(lang.source, "train")):
            if k < lang.held or (t == whole and uniform(lang.code, t, k) >= part):
                continue
            yield (j + 0.5) / expected, index, doc
            j += 1


def mixture_records(source: str, split: str) -> Iterator[str]:
    """The mixture's documents of `split`, each one string of sentence lines (`dietpe.data.corpus` reads them
    as the `documents` records of a JSONL file)."""
    langs = languages(source)
    rates = sampling_rates({lang.code: lang.sentences for lang in langs}, Mixture.parse(source).alpha)
    streams = [_stream(lang, i, split, rates[lang.code]) for i, lang in enumerate(langs)]
    for _, _, doc in heapq.merge(*streams, key=lambda item: item[:2]):
        yield "\n".join(doc)


def describe(source: str) -> dict:
    """Per language: sentences, the corpus share p, the sampling probability q and the rate (for logs and
    reports)."""
    langs = languages(source)
    alpha = Mixture.parse(source).alpha
    sizes = {lang.code: lang.sentences for lang in langs}
    total = sum(sizes.values())
    q, r = sampling_probabilities(sizes, alpha), sampling_rates(sizes, alpha)
    return {code: dict(sentences=n, p=n / total, q=q[code], rate=r[code]) for code, n in sizes.items()}
