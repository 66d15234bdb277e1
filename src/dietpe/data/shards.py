"""Prepare a pre-training corpus once into memory-mapped token shards, and read blocks back from them.

The corpus is streamed a chunk at a time (`dietpe.data.sources`: a corpus, or a multilingual mixture); worker processes split chunks into
documents and sentences, count words (for the tokenizer) and encode sentences with the fast tokenizer; the main
process packs the sentences into blocks (`dietpe.data.mlm.iter_blocks`, the papers' FULL-SENTENCES rule or
`documents`) and appends them to the shard files. Memory is a few chunks and the word counts, whatever the size
of the corpus; results are in corpus order, so they do not depend on the number of processes.

Format: per split, a flat token array and an index, as Megatron-LM's indexed dataset and nanoGPT's `train.bin`:

* `<split>.tokens`: every block's ids back to back, uint16 when the vocabulary fits (else uint32);
* `<split>.blocks`: int64 offsets, block i is `tokens[blocks[i]:blocks[i+1]]`;
* with `packing="stream"` (`dietpe lm`) an item is a document and `<split>.tokens` is the token stream itself;
* `<split>.starts` / `<split>.starts_index` (`documents` packing only): the in-block offsets where documents
  start (uint32), and int64 offsets of each block's run of starts.

Why not Arrow (`datasets`)? Blocks of varying length are one `np.memmap` slice here: no schema, no per-row
objects, opened in microseconds, and the files are checksummed byte for byte. Arrow would add a list column and
a cache keyed by `datasets`' own fingerprints, where ours must key on the corpus, tokenizer, length and packing.

A `manifest.json` written last records that key and each file's size and SHA-256. A preparation writes into a
temporary folder renamed into place when complete (atomic on one file system), so a killed run or a full disk
leaves nothing trusted, and the next run prepares again. A folder whose manifest names another key, or whose
files have other sizes or checksums, is refused with one line naming the file; it is never read as data.

The cache (`--cache-dir`, default `$XDG_CACHE_HOME/dietpe` or `~/.cache/dietpe`) holds `tokenizers/<key>/` and
`shards/<key>/`; every method and seed of `dietpe compare`, later runs and `dietpe lm` reuse them.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dietpe.data.corpus import chunk_documents
from dietpe.data.sources import chunks as iter_chunks
from dietpe.data.sources import resolve as resolve_source
from dietpe.errors import DataError

FORMAT = 2  # 2: special tokens' names in the text are encoded as text
TYPE_NAMES = {"wordpiece": "WordPiece", "unigram": "Unigram (SentencePiece-style)", "bpe": "BPE"}
HOLDOUT = 20  # without a validation split, the first 1/20 of the documents (at least one) are held out


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dietpe"


def cache_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir) if cache_dir else default_cache_dir()


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(_identity(obj), sort_keys=True).encode()).hexdigest()[:20]


def _identity(obj):
    """A key without the paths as typed: a local file is its content (sha256, bytes), whichever path or working
    folder it is read from (the manifest keeps the path, for messages)."""
    if isinstance(obj, dict):
        return {k: _identity(v) for k, v in obj.items() if not (k == "origin" and "sha256" in obj)}
    if isinstance(obj, list):
        return [_identity(v) for v in obj]
    return obj


_HASHED: dict[tuple, str] = {}  # (path, inode, size, mtime, ctime) -> SHA-256, this process's


def file_sha256(path: Path) -> str:
    """The file's SHA-256, read once a process for a file unchanged since (a run records its corpus's, then
    prepares it: one pass over a large corpus, not two, nor one per method of a comparison)."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)  # ctime: any write
    if key not in _HASHED:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        _HASHED[key] = h.hexdigest()
    return _HASHED[key]


def fingerprint(source: str, split: str = "train") -> dict | None:
    """What a split's content is: the SHA-256 of a local file, the name of a dataset streamed by name."""
    resolved = resolve_source(source, split)
    if resolved is None:
        return None
    kind, where, origin = resolved
    if kind == "hf":  # streamed, never downloaded whole: the name and split are its identity
        return dict(kind=kind, name=where, split=split, origin=origin)
    if kind == "mix":  # each language's fingerprint, and the sampling
        from dietpe.data.multilingual import Mixture
        mix = Mixture.parse(where)
        return dict(kind=kind, alpha=mix.alpha, split=split, origin=origin,
                    languages={code: fingerprint(src, "train") for code, src in mix.languages})
    return dict(kind=kind, sha256=file_sha256(Path(where)), bytes=os.path.getsize(where), origin=origin)


# -- workers -------------------------------------------------------------------------------------------------

_TOKENIZER = None


def _init_worker(tokenizer_json: str | None) -> None:
    global _TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    if tokenizer_json is not None:
        from tokenizers import Tokenizer
        _TOKENIZER = Tokenizer.from_str(tokenizer_json)
        _TOKENIZER.encode_special_tokens = True  # "[SEP]" or "<mask>" in the text is text, not a special id


def _select(task):
    mode, strings, lo, hi = task
    return chunk_documents(mode, strings)[lo:hi]


def _count_documents(task) -> int:
    return len(_select(task))


def _count_words(task) -> collections.Counter:
    from dietpe.data.tokenizer import word_splitter
    from dietpe.data.vocab import count_words
    normalizer, pre_tokenizer = word_splitter(*task[4])  # (lowercase, kind)
    return count_words((s for d in _select(task[:4]) for s in d), normalizer, pre_tokenizer)


def _encode(task):
    """(sentences per document, tokens per sentence, all ids) of a chunk's documents."""
    docs = _select(task)
    sentences = [s for d in docs for s in d]
    encodings = _TOKENIZER.encode_batch_fast(sentences, add_special_tokens=False) if sentences else []
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    ids = np.fromiter((t for e in encodings for t in e.ids), dtype=np.uint32, count=int(lengths.sum()))
    return np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs)), lengths, ids


class _Pool:
    """Ordered map over chunks with a bounded number in flight (Pool.imap would read the whole corpus ahead)."""

    def __init__(self, processes: int, tokenizer_json: str | None = None):
        self.processes = max(1, processes)
        self.tokenizer_json = tokenizer_json
        self.pool = None

    def __enter__(self):
        if self.processes > 1:
            import multiprocessing
            self.pool = multiprocessing.get_context("fork").Pool(self.processes, _init_worker, (self.tokenizer_json,))
        else:
            _init_worker(self.tokenizer_json)
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def map(self, fn, tasks):
        if self.pool is None:
            yield from map(fn, tasks)
            return
        pending = collections.deque()
        for task in tasks:
            pending.append(self.pool.apply_async(fn, (task,)))
            if len(pending) >= 2 * self.processes:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


@dataclass(frozen=True)
class Split:
    """Where a split's documents come from: a source split, and the range [lo, hi) of its documents."""
    source: str
    split: str
    lo: int = 0
    hi: int | None = None

    def tasks(self, counts: list[int] | None, extra=()):
        """(mode, strings, lo, hi, *extra) per chunk; `counts` (documents per chunk) lets a range cut chunks."""
        kind, where, _ = resolve_source(self.source, self.split)
        start = 0
        for k, (mode, strings) in enumerate(iter_chunks(kind, where, self.split)):
            if counts is None:
                yield (mode, strings, None, None, *extra)
                continue
            n = counts[k]
            lo, hi = max(self.lo - start, 0), n if self.hi is None else min(self.hi - start, n)
            start += n
            if hi > lo:
                yield (mode, strings, lo, hi, *extra)
            if self.hi is not None and start >= self.hi:
                return


@dataclass
class Plan:
    """The documents of training, validation and tokenizer training, worked out from the sources."""
    train: Split
    validation: Split
    tokenizer: Split
    counts: dict  # source split -> documents per chunk (only where a range needs them)
    key: dict     # what the documents are: fingerprints and ranges


def content(fp: dict | None):
    """A fingerprint without where it was read: what the text is."""
    if isinstance(fp, dict):
        return {k: content(v) for k, v in fp.items() if k != "origin"}
    return [content(v) for v in fp] if isinstance(fp, list) else fp


def sources(corpus: str, validation: str | None) -> tuple[dict, tuple[dict | None, str, str]]:
    """(fingerprint of the training text, (fingerprint or None, source, split) of the validation text): the
    corpus's validation split, or --validation (a file, a dataset's split, or a folder's validation file: its
    train file is no held-out text). Validation that is the training text is refused."""
    train_fp = fingerprint(corpus, "train")
    val_source, val_split = (validation, "validation" if Path(validation).is_dir() else "train") if validation \
        else (corpus, "validation")
    val_fp = fingerprint(val_source, val_split)
    if validation and val_fp is None:
        raise DataError(f"--validation {validation}: the folder has no validation file (valid.txt, "
                        f"<name>.valid.txt, wiki.valid.tokens, ...); name the file itself")
    if val_fp is not None and content(val_fp) == content(train_fp):
        raise DataError(f"--validation {val_fp['origin']}: the same text as the training corpus "
                        f"{train_fp['origin']}; validation must be held-out text")
    return train_fp, (val_fp, val_source, val_split)


def plan(corpus: str, validation: str | None, max_documents: int | None, tokenizer_sample: int | None,
         processes: int) -> Plan:
    """Which documents go where, as `dietpe pretrain` always chose: the valid split (or `--validation`), else
    the first 1/20 of the (first `max_documents`) documents held out."""
    train_fp, (val_fp, val_source, val_split) = sources(corpus, validation)
    if val_fp is not None and val_fp["kind"] not in ("hf", "mix"):  # small: refused before any work
        text = False
        for _, strings in iter_chunks(val_fp["kind"], val_fp["origin"], val_split):
            text = text or any(s.strip() for s in strings)
        if not text:
            raise DataError(f"{val_fp['origin']}: the validation corpus is empty (no non-blank lines)")
    counts = {}
    needs_counts = val_fp is None or max_documents or tokenizer_sample
    if needs_counts:
        with _Pool(processes) as pool:
            counts["train"] = list(pool.map(_count_documents, (t for t in Split(corpus, "train").tasks(None))))
    total = sum(counts["train"]) if needs_counts else None
    if total == 0:
        raise DataError(f"{train_fp['origin']}: the corpus is empty (no non-blank lines)")
    n = min(total, max_documents) if max_documents else total
    if val_fp is None:
        if n < 2:
            # worded for every command that reaches here: lm, compare and xtreme have no --validation
            raise DataError(f"{train_fp['origin']}: " + (f"--max-documents {max_documents} leaves" if total > n else
                                                         "the corpus has") + " one document only, none to hold out "
                            "for validation; give more documents, a corpus folder with a valid file, or "
                            "--validation where the command has it")
        cut = max(1, n // HOLDOUT)
        train = Split(corpus, "train", cut, n)
        val = Split(corpus, "train", 0, cut)
        val_fp = dict(train_fp, held_out=[0, cut])
    else:  # a limit that covers every document reads as none: the same documents, the same key
        train = Split(corpus, "train", 0, None if n == total else n)
        val = Split(val_source, val_split)
    end = train.hi if train.hi is not None else total
    tok_hi = train.hi if not tokenizer_sample or end is not None and train.lo + tokenizer_sample >= end \
        else min(train.lo + tokenizer_sample, end if end is not None else 1 << 62)
    tok = Split(train.source, "train", train.lo, tok_hi)
    key = dict(train=dict(train_fp, documents=[train.lo, train.hi]), validation=val_fp,
               tokenizer_documents=[tok.lo, tok.hi])
    return Plan(train, val, tok, counts, key)


def _counts(p: Plan, split: Split):
    return p.counts.get("train") if split.source == p.train.source and split.split == "train" else None


# -- writing -------------------------------------------------------------------------------------------------

class _Writer:
    """One split's files, appended block by block; the index is flushed in pieces, so memory stays flat."""

    FLUSH = 1 << 16

    def __init__(self, folder: Path, name: str, dtype, packing: str):
        self.folder, self.name, self.dtype, self.packing = folder, name, dtype, packing
        self.tokens = open(folder / f"{name}.tokens", "wb")
        self.hash = hashlib.sha256()
        self.n_tokens, self.n_blocks, self.n_starts = 0, 0, 0
        self.index = {"blocks": (array("q", [0]), open(folder / f"{name}.blocks", "wb"))}
        if packing == "documents":
            self.index["starts"] = (array("I"), open(folder / f"{name}.starts", "wb"))
            self.index["starts_index"] = (array("q", [0]), open(folder / f"{name}.starts_index", "wb"))

    def add(self, parts, starts):
        block = np.concatenate([np.asarray(p, dtype=np.uint32) for p in parts])
        data = block.astype(self.dtype).tobytes()
        self.tokens.write(data)
        self.hash.update(data)
        self.n_tokens += len(block)
        self.n_blocks += 1
        self.index["blocks"][0].append(self.n_tokens)
        if self.packing == "documents":
            self.index["starts"][0].extend(starts)
            self.n_starts += len(starts)
            self.index["starts_index"][0].append(self.n_starts)
        if len(self.index["blocks"][0]) >= self.FLUSH:
            self.flush()

    def flush(self):
        for values, f in self.index.values():
            f.write(values.tobytes())
            del values[:]

    def close(self) -> dict:
        self.flush()
        self.tokens.close()
        files = {f"{self.name}.tokens": self.hash.hexdigest()}
        for _, f in self.index.values():
            f.close()
            files[Path(f.name).name] = file_sha256(Path(f.name))
        return dict(blocks=self.n_blocks, tokens=self.n_tokens,
                    files={n: dict(bytes=os.path.getsize(self.folder / n), sha256=h) for n, h in files.items()})


def train_tokenizer(p: Plan, spec, processes: int):
    """The tokenizer of `spec` (a `TokenizerSpec`) learned from word counts streamed over the tokenizer's
    documents (summed across chunks)."""
    from dietpe.data.tokenizer import tokenizer_from_counts
    counts: collections.Counter = collections.Counter()
    with _Pool(processes) as pool:
        for c in pool.map(_count_words, p.tokenizer.tasks(_counts(p, p.tokenizer), ((spec.lowercase, spec.kind),))):
            counts.update(c)
    return tokenizer_from_counts(counts, spec)


def write_split(folder: Path, name: str, split: Split, counts, tokenizer, max_length: int, packing: str,
                processes: int) -> dict:
    from dietpe.data.mlm import iter_blocks
    dtype = np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32
    writer = _Writer(folder, name, dtype, packing)

    def documents():
        with _Pool(processes, tokenizer.backend_tokenizer.to_str()) as pool:
            for per_doc, lengths, ids in pool.map(_encode, split.tasks(counts)):
                ends = np.cumsum(lengths)
                sentences = [ids[e - n:e] for e, n in zip(ends.tolist(), lengths.tolist())]
                i = 0
                for k in per_doc.tolist():
                    yield sentences[i:i + k]
                    i += k

    for parts, starts in iter_blocks(documents(), max_length, tokenizer.cls_token_id, tokenizer.sep_token_id,
                                     packing):
        writer.add(parts, starts)
    return dict(writer.close(), dtype=np.dtype(dtype).name)


# -- reading -------------------------------------------------------------------------------------------------

class Blocks:
    """One split's blocks, memory-mapped: `blocks[i]` is a list of ids; `example(i)` the training example."""

    def __init__(self, folder: Path, name: str, info: dict, limit: int | None = None):
        self.folder, self.name, self.info, self.limit = Path(folder), name, info, limit
        self._open()

    def _open(self):
        dtype = np.dtype(self.info["dtype"])
        path = self.folder / f"{self.name}.tokens"
        self.tokens = np.memmap(path, dtype=dtype, mode="r") if self.info["tokens"] else np.zeros(0, dtype)
        self.offsets = np.memmap(self.folder / f"{self.name}.blocks", dtype=np.int64, mode="r")
        starts = self.folder / f"{self.name}.starts"
        documents = (self.folder / f"{self.name}.starts_index").exists()
        self.starts = (np.memmap(starts, dtype=np.uint32, mode="r") if starts.stat().st_size
                       else np.zeros(0, np.uint32)) if documents else None
        self.starts_index = (np.memmap(self.folder / f"{self.name}.starts_index", dtype=np.int64, mode="r")
                             if documents else None)

    def __getstate__(self):  # reopened by path in worker processes, never pickled as data
        return dict(folder=self.folder, name=self.name, info=self.info, limit=self.limit)

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._open()

    def __len__(self):
        n = len(self.offsets) - 1
        return min(n, self.limit) if self.limit else n

    def __getitem__(self, i: int) -> list[int]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.tokens[self.offsets[i]:self.offsets[i + 1]].tolist()

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def example(self, i: int) -> dict:
        out = {"input_ids": self[i]}
        if self.starts is not None:
            out["doc_starts"] = self.starts[self.starts_index[i]:self.starts_index[i + 1]].tolist()
        return out

    def examples(self) -> "Examples":
        return Examples(self)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[len(self)])


class Examples:
    """`Blocks` as a dataset of examples (dicts), indexable like a list (for `EpochExamples`)."""

    def __init__(self, blocks: Blocks):
        self.blocks = blocks

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return self.blocks.example(i)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def verify(folder: Path, key: dict) -> dict:
    """The manifest of a complete preparation with this key; one-line DataError for a stale or damaged one."""
    path = folder / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable manifest ({e}); delete {folder} to prepare the corpus again") from None
    if manifest.get("format") != FORMAT or _identity(manifest.get("key")) != _identity(key):
        raise DataError(f"{path}: stale manifest (it describes other data or another format than its folder "
                        f"name says); delete {folder} to prepare the corpus again")
    for split in ("train", "validation"):
        for name, f in manifest[split]["files"].items():
            file = folder / name
            size = file.stat().st_size if file.exists() else None
            if size != f["bytes"]:
                raise DataError(f"{file}: truncated or missing shard ({size} bytes, the manifest says "
                                f"{f['bytes']}); delete {folder} to prepare the corpus again")
            if file_sha256(file) != f["sha256"]:
                raise DataError(f"{file}: corrupt shard (its SHA-256 differs from the manifest's); delete {folder} "
                                f"to prepare the corpus again")
    return manifest


@dataclass
class Prepared:
    """A prepared corpus: the tokenizer and the train and validation blocks. Unpacks as a 3-tuple."""
    tokenizer: object
    train: Blocks
    validation: Blocks
    folder: Path
    manifest: dict

    def __iter__(self):
        return iter((self.tokenizer, self.train, self.validation))

    def __getitem__(self, i):
        return (self.tokenizer, self.train, self.validation)[i]


def _atomic_dir(final: Path, fill) -> None:
    """Fill a temporary folder and rename it to `final`; a half-written one is never at `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f"{final.name}.tmp-*"):  # left by a killed run whose process is gone
        pid = stale.name.rsplit("-", 1)[-1]
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fill(tmp)
        try:
            os.replace(tmp, final) if not final.exists() else shutil.rmtree(tmp)
        except OSError:  # another process renamed its complete folder into place first
            if not final.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prepare(corpus: str, *, validation: str | None = None, tokenizer=None, vocab_size: int = 30000,
            max_length: int = 128, packing: str = "full-sentences", max_documents: int | None = None,
            tokenizer_sample: int | None = None, cache_dir: str | Path | None = None,
            processes: int | None = None, log=print, tokenizer_type: str = "wordpiece",
            special_tokens: str | None = None) -> Prepared:
    """The corpus's shards, from the cache or prepared now: `tokenizer` is a loaded tokenizer (else one of
    `tokenizer_type` is trained on the training documents, or on the first `tokenizer_sample` of them, with
    `special_tokens` (`role=name,...`) or the type's default names)."""
    from dietpe.data.tokenizer import load_tokenizer, tokenizer_spec

    processes = processes or min(8, os.cpu_count() or 1)
    root = cache_root(cache_dir)
    spec = tokenizer_spec(tokenizer_type, vocab_size, special_tokens) if tokenizer is None else None
    p = plan(corpus, validation, max_documents, tokenizer_sample, processes)
    if tokenizer is None:
        tok_key = dict(format=FORMAT, **spec.key(), train=p.key["train"], documents=p.key["tokenizer_documents"])
        tok_dir = root / "tokenizers" / _digest(tok_key)
        if not (tok_dir / "tokenizer.json").is_file():
            log(f"training a {TYPE_NAMES[spec.kind]} tokenizer (vocabulary {vocab_size:,}) on the corpus")

            def fill(tmp):
                train_tokenizer(p, spec, processes).save_pretrained(tmp)
                (tmp / "key.json").write_text(json.dumps(tok_key, indent=1, sort_keys=True), encoding="utf-8")

            _atomic_dir(tok_dir, fill)
        tokenizer = load_tokenizer(tok_dir)
    vocabulary = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    key = dict(format=FORMAT, data=p.key, tokenizer_sha256=vocabulary, max_length=max_length, packing=packing)
    folder = root / "shards" / _digest(key)
    if not (folder / "manifest.json").is_file():
        log(f"preparing the corpus into {folder}")

        def fill(tmp):
            manifest = dict(format=FORMAT, key=key)
            for name, split in (("train", p.train), ("validation", p.validation)):
                manifest[name] = write_split(tmp, name, split, _counts(p, split), tokenizer, max_length, packing,
                                             processes)
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")

        _atomic_dir(folder, fill)
    manifest = verify(folder, key)
    train, val = (Blocks(folder, n, manifest[n]) for n in ("train", "validation"))
    if not len(train):
        raise DataError(f"{p.key['train']['origin']}: the corpus is empty (no text left after tokenisation)")
    if not len(val):
        raise DataError(f"{p.key['validation']['origin']}: the validation corpus is empty")
    return Prepared(tokenizer, train, val, folder, manifest)
