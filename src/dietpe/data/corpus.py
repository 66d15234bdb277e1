"""Pre-training text: read a corpus from local files or a Hugging Face dataset name into documents of sentences.

The papers pre-train BERT on documents split into sentences and packed into full-length blocks (RoBERTa's
FULL-SENTENCES, no next-sentence task). Here a corpus is `list[Document]`, a document is `list[str]` of
sentences. Local layouts:

* `*.txt`: one paragraph per line, a blank line ends a document (in WikiText, whose headings stand between
  blank lines, a document is a section or a heading, not an article);
* `*.jsonl`: one JSON object per line, its `text` field one document;
* `*.tsv`: a header row with a `text` (or `sentence`) column, each row one document (GLUE's plain TSV: no
  quoting, so a quote is text and a field holds no tab or line break);
* a directory: `train.*` and `valid.*` / `validation.*` / `dev.*`, or the same with a name in front
  (`ptb.train.txt`, WikiText's `wiki.train.tokens` / `wiki.valid.raw`, `name-train.txt`), or such a directory
  as its only sub-directory (an unpacked archive).

Files are UTF-8 (a leading byte-order mark is dropped); an invalid byte is reported with its file and line.

Anything else that looks like `owner/name[:config]` is loaded with `datasets.load_dataset`; without a
network that fails with a message saying so. Its rows are documents where the first row with text holds
several lines (Wikipedia, C4), else paragraphs, a blank row ending a document (WikiText); `rows_mode`.
"""

from __future__ import annotations

from collections.abc import Iterable

import json
import os
import re
from pathlib import Path

from dietpe.data.text import iter_lines
from dietpe.errors import DataError, first_line

Document = list[str]

SPLIT_NAMES = {
    "train": ("train",),
    "validation": ("valid", "validation", "dev", "val"),
    "test": ("test",),
}
EXTENSIONS = (".txt", ".jsonl", ".tsv", ".tokens", ".raw")
# Sentence ends: ., ! or ? then space (WikiText writes " . " between tokens, plain text ". ").
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_NAMED_SPLIT = re.compile(r"^.+[._-](?P<split>[a-z]+)(?P<ext>\.[a-z]+)$")
_HF_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?(:[\w.\-]+)?$")


def split_sentences(paragraph: str) -> list[str]:
    """Split a paragraph at sentence-final punctuation; empty pieces are dropped."""
    return [s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip()]


def group_documents(paragraphs: Iterable[str | None]) -> list[Document]:
    """Paragraphs -> documents of sentences; a blank paragraph ends a document."""
    docs: list[Document] = []
    current: Document = []
    for text in paragraphs:
        text = (text or "").strip()
        if not text:
            if current:
                docs.append(current)
                current = []
            continue
        current.extend(split_sentences(text))
    if current:
        docs.append(current)
    return docs


def file_kind(path: Path) -> str:
    """How a local file's records are read: `jsonl`, `tsv`, or `txt` for any other extension."""
    return path.suffix[1:] if path.suffix in (".jsonl", ".tsv") else "txt"


def read_file(path: str | Path) -> list[Document]:
    """Read one local corpus file whole, by its extension (`.jsonl`, `.tsv`; anything else is text): the same
    records and checks as the streamed chunks of `iter_chunks`, for inputs small enough to hold."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file")
    records = list(_records(file_kind(path), str(path), "train"))
    return chunk_documents(records[0][0], [text for _, text in records]) if records else []


def find_split_file(directory: Path, split: str, depth: int = 1) -> Path | None:
    """The file of `split` in a corpus directory: `train.txt`, `valid.jsonl`, ..., or one with a name in front
    (`ptb.train.txt`, `wiki.valid.tokens`, `corpus-dev.txt`); else the same in its only sub-directory."""
    for name in SPLIT_NAMES[split]:
        formats = [directory / f"{name}{ext}" for ext in (".txt", ".jsonl", ".tsv")]
        if sum(p.is_file() for p in formats) > 1:  # the same split in two formats: which one is meant?
            raise DataError(f"{directory}: several {split} files ({', '.join(p.name for p in formats if p.is_file())});"
                            f" pass the one to use as a file")
        for ext in EXTENSIONS:
            for candidate in (directory / f"{name}{ext}", directory / f"wiki.{name}{ext}"):
                if candidate.is_file():
                    return candidate
    entries = sorted(directory.iterdir())
    named = [p for p in entries if p.is_file() and (m := _NAMED_SPLIT.match(p.name))
             and m["split"] in SPLIT_NAMES[split] and m["ext"] in EXTENSIONS]
    if len(named) > 1:
        raise DataError(f"{directory}: several {split} files ({', '.join(p.name for p in named)}); pass the one "
                        f"to use as a file")
    if named:
        return named[0]
    subdirs = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
    if depth > 0 and len(subdirs) == 1 and not any(p.is_file() for p in entries):
        return find_split_file(subdirs[0], split, depth - 1)
    return None


def folder_listing(directory: Path) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    if not names:
        return "the folder is empty"
    return "the folder holds " + ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")


def is_hf_name(source: str) -> bool:
    """`owner/name[:config]` that is no local path: not a file's extension, and not under a local folder of
    that name (`data/x` beside a folder `data` is a mistyped path, not a dataset)."""
    owner = source.split("/", 1)[0]
    return not os.path.exists(source) and bool(_HF_NAME.match(source)) and not Path(source).suffix in EXTENSIONS \
        and not ("/" in source and os.path.isdir(owner))


def read_corpus(source: str, split: str = "train") -> tuple[list[Document], str]:
    """Documents of `split` from a file, a directory or a Hugging Face dataset name, and where they came from.

    A file is the train split; for another split of a file, returns ([], ...) so the caller can hold out part.
    """
    path = Path(source)
    if path.is_dir():
        found = find_split_file(path, split)
        if found is None:
            if split == "train":
                raise DataError(f"{path}: no {split} file found (looked for train.txt, <name>.train.txt, "
                                f"wiki.train.tokens and the extensions {', '.join(EXTENSIONS)}); "
                                f"{folder_listing(path)}")
            return [], f"{path} (no {split} file)"
        docs, origin = read_file(found), str(found)
    elif path.is_file():
        if split != "train":
            return [], str(path)
        docs, origin = read_file(path), str(path)
    elif is_hf_name(source):
        docs, origin = read_hf_corpus(source, split), f"huggingface:{source}[{split}]"
    else:
        raise DataError(f"{source}: no such file or directory")
    if split == "train" and not docs:
        raise DataError(f"{origin}: the corpus is empty (no non-blank lines)")
    return docs, origin


def rows_mode(text: str) -> str:
    """How a dataset's rows are read, from its first row with text: a row of several lines is a document
    (Wikipedia, C4), one line a paragraph, a blank row ending a document (WikiText)."""
    return "documents" if "\n" in text.strip() else "paragraphs"


def read_hf_corpus(name: str, split: str) -> list[Document]:
    """`owner/name[:config]` through `datasets`, its rows read as `rows_mode` says."""
    rows = load_hf_dataset(name, split)
    column = next((c for c in ("text", "sentence", "content") if c in rows.column_names), None)
    if column is None:
        raise DataError(f"huggingface:{name}: no text column (has {rows.column_names}); expected 'text'")
    texts = rows[column]
    first = next((t for t in texts if (t or "").strip()), "")
    return chunk_documents(rows_mode(first), [t or "" for t in texts])


def load_hf_dataset(name: str, split: str):
    """Load `owner/name[:config]`'s split, with a clear message when there is no network or no such split; a
    missing split other than train is empty (a corpus then holds out part of train)."""
    loaded = load_hf_splits(name)
    names = [split] + [s for s in SPLIT_NAMES.get(split, ()) if s != split]
    for candidate in names:
        if candidate in loaded:
            return loaded[candidate]
    if split == "train":
        raise DataError(f"huggingface:{name}: no {split} split (has {', '.join(loaded)})")
    return loaded[list(loaded)[0]].select([])


def load_hf_splits(name: str):
    """`owner/name[:config]` as a `DatasetDict`, with a clear message when there is no network."""
    from dietpe.extras import need

    datasets = need("datasets")
    dataset, _, config = name.partition(":")
    try:
        loaded = datasets.load_dataset(dataset, config or None)
    except Exception as e:  # datasets raises many kinds; all mean "cannot get it here"
        offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
        text = first_line(e)
        network = isinstance(e, (ConnectionError, TimeoutError)) or any(
            w in text.lower() for w in ("connection", "offline", "network", "resolve", "reach", "internet"))
        if offline or network:
            raise DataError(f"{name}: cannot load this Hugging Face dataset: no network here ({text}). Download "
                            f"it where a network exists, or pass a local file or directory instead") from None
        raise DataError(f"{name}: cannot load this Hugging Face dataset ({text})") from None
    return loaded


# -- streaming: the same documents, read a chunk at a time -----------------------------------------------------
# A chunk is (mode, strings): mode "paragraphs" (a blank string ends a document, `group_documents`) or
# "documents" (each string one document, its lines paragraphs). Chunks of paragraphs end at a blank line, so
# documents never straddle two chunks and `chunk_documents` of every chunk, in order, is `read_corpus`'s list.
CHUNK_CHARS = 1 << 20


def chunk_documents(mode: str, strings: list[str]) -> list[Document]:
    """The documents of one chunk (run in worker processes)."""
    if mode == "paragraphs":
        return group_documents(strings)
    docs = []
    for text in strings:
        sentences = [s for para in text.splitlines() for s in split_sentences(para)]
        if sentences:
            docs.append(sentences)
    return docs


def resolve_source(source: str, split: str = "train") -> tuple[str, str, str] | None:
    """(kind, where, origin) of a corpus split without reading it: kind is txt/jsonl/tsv/hf; None when a
    non-train split does not exist (the caller holds out part of train)."""
    path = Path(source)
    if path.is_dir():
        found = find_split_file(path, split)
        if found is None:
            if split == "train":
                raise DataError(f"{path}: no {split} file found (looked for train.txt, <name>.train.txt, "
                                f"wiki.train.tokens and the extensions {', '.join(EXTENSIONS)}); "
                                f"{folder_listing(path)}")
            return None
        path = found
    elif path.is_file():
        if split != "train":
            return None
    elif is_hf_name(source):
        if split != "train" and stream_hf_dataset(source, split, missing_ok=True) is None:
            return None
        return "hf", source, f"huggingface:{source}[{split}]"
    else:
        raise DataError(f"{source}: no such file or directory")
    return file_kind(path), str(path), str(path)


def _records(kind: str, where: str, split: str):
    """(mode, string) per record of a split, checked as `read_corpus` checks it."""
    path = Path(where)
    if kind == "txt":
        for line in iter_lines(path):
            yield "paragraphs", line
    elif kind == "jsonl":
        for lineno, line in enumerate(iter_lines(path), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataError(f"{path}:{lineno}: expected an object with a string field 'text'")
            yield "documents", record["text"]
    elif kind == "tsv":
        lines = iter_lines(path)
        header = next(lines, "").rstrip("\r\n").split("\t")
        column = next((c for c in ("text", "sentence") if c in header), None)
        if column is None:
            raise DataError(f"{path}:1: the header needs a 'text' or 'sentence' column, found {header}")
        index = header.index(column)
        for lineno, line in enumerate(lines, 2):
            cells = line.rstrip("\r\n").split("\t")
            if not line.strip():
                continue
            if len(cells) <= index or len(cells) > len(header):  # more: a tab in a text, cut there silently
                hint = " (a tab inside a text?)" if len(cells) > len(header) else ""
                raise DataError(f"{path}:{lineno}: {len(cells)} columns, the header names {len(header)}{hint}")
            yield "documents", cells[index]
    else:
        column, mode, first = None, None, []  # the rows up to the first with text, which decides the mode
        for row in stream_hf_dataset(where, split):
            if column is None:
                column = next((c for c in ("text", "sentence", "content") if c in row), None)
                if column is None:
                    raise DataError(f"huggingface:{where}: no text column (has {sorted(row)}); expected 'text'")
            if mode is None:
                first.append(row[column])
                if (row[column] or "").strip():
                    mode = rows_mode(row[column])
                    yield from ((mode, text) for text in first)
                continue
            yield mode, row[column]
        yield from (("paragraphs", text) for text in (first if mode is None else ()))


def iter_chunks(kind: str, where: str, split: str = "train", chunk_chars: int | None = None):
    """Chunks `(mode, strings)` of about `chunk_chars` characters, in corpus order; memory is one chunk."""
    return chunk_records(_records(kind, where, split), chunk_chars)


def chunk_records(records, chunk_chars: int | None = None):
    """Records `(mode, string)` gathered into chunks of about `chunk_chars` characters that end where a document
    does."""
    chunk_chars = chunk_chars or CHUNK_CHARS
    strings: list[str] = []
    size, mode = 0, "paragraphs"
    for mode, text in records:
        text = text or ""
        strings.append(text)
        size += len(text)
        if size >= chunk_chars and (mode == "documents" or not text.strip()):
            yield mode, strings
            strings, size = [], 0
    if strings:
        yield mode, strings


def stream_hf_dataset(name: str, split: str, missing_ok: bool = False):
    """`owner/name[:config]`'s split as an iterable of rows, streamed (`streaming=True`): never held whole."""
    from dietpe.extras import need

    datasets = need("datasets")  # the 'data' extra: a corpus named on the Hub
    dataset, _, config = name.partition(":")
    try:
        loaded = datasets.load_dataset(dataset, config or None, streaming=True)
    except Exception as e:  # datasets raises many kinds; all mean "cannot get it here"
        text = first_line(e)
        raise DataError(f"{name}: cannot stream this Hugging Face dataset ({text}); pass a local file or "
                        f"directory instead") from None
    for candidate in [split] + [s for s in SPLIT_NAMES.get(split, ()) if s != split]:
        if candidate in loaded:
            return loaded[candidate]
    if missing_ok:
        return None
    raise DataError(f"huggingface:{name}: no {split} split (has {', '.join(loaded)})")
