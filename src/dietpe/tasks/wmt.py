"""`dietpe translate prepare`: parallel text into the line-aligned folder `dietpe translate train --data` reads
(`train.L1`/`train.L2`, `valid.*`, `test.*`), with a `prepare.json` of where each line came from.

The DIET paper trains on WMT18 (appendix A): Europarl v7, Common Crawl and News Commentary v13 for en-de,
de-en, en-cs and cs-en, tested on newstest2018 with SacreBLEU. Sources:

* Hugging Face by name (`--dataset wmt/wmt18 --pair de-en`, a network needed): its train, validation
  (newstest2017) and test (newstest2018) splits, streamed into the files. Its train split holds more corpora
  than the paper's (ParaCrawl v1 and Rapid for de-en, among others) and its rows do not say which: for the
  paper's exact data use the local files;
* local files (`--train SRC TGT`, repeatable, concatenated in order; `--valid`, `--test`): plain text, one
  sentence per line, or WMT's SGML test sets (`newstest2018-deen-src.de.sgm`: the `<seg>` elements in order);
* nothing: the built-in Multi30k de-en (train and val) from the shared data folder, the project's small
  default (docs/translation.md).

A newline inside a segment (possible in SGML or a dataset's row) would break line alignment: it becomes a
space, counted in `prepare.json`. Empty lines are kept (line numbers stay those of the sources; training skips
and counts them). Files are written to a temporary name and renamed when complete.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
from pathlib import Path

from dietpe import validate as V
from dietpe.data.text import iter_lines
from dietpe.errors import ConfigError, DataError

_SEG = re.compile(r"<seg[^>]*>(.*?)</seg>", re.IGNORECASE | re.DOTALL)
_PAIR = re.compile(r"^([a-z]{2,3})-([a-z]{2,3})$")


def read_segments(path: str | Path) -> list[str]:
    """A file's sentences: its lines, or for WMT's SGML (`.sgm`/`.xml`) the `<seg>` elements in order."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix.lower() in (".sgm", ".xml"):
        text = "".join(iter_lines(path))
        segs = [html.unescape(s) for s in _SEG.findall(text)]
        if not segs:
            raise DataError(f"{path}: no <seg> elements (expected WMT's SGML test-set layout)")
        return segs
    return [line.rstrip("\r\n") for line in iter_lines(path)]


class Writer:
    """One split's two files, written line by line to temporary names and renamed when complete."""

    def __init__(self, out: Path, split: str, langs: tuple[str, str]):
        self.final = [out / f"{split}.{lang}" for lang in langs]
        self.tmp = [p.with_name(f".{p.name}.tmp-{os.getpid()}") for p in self.final]
        self.files = [open(p, "w", encoding="utf-8") for p in self.tmp]
        self.lines, self.joined, self.empty = 0, 0, 0

    def add(self, source: str, target: str) -> None:
        for f, text in zip(self.files, (source, target)):
            clean = " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text
            self.joined += clean != text
            self.empty += not clean.strip()
            f.write(clean.strip() + "\n")
        self.lines += 1

    def close(self) -> dict:
        for f, tmp, final in zip(self.files, self.tmp, self.final):
            f.close()
            os.replace(tmp, final)
        return dict(pairs=self.lines, newlines_replaced=self.joined, empty_sides=self.empty,
                    files=[str(p) for p in self.final])

    def abort(self) -> None:
        for f, tmp in zip(self.files, self.tmp):
            f.close()
            tmp.unlink(missing_ok=True)


def local_pairs(pairs: list[list[str]], what: str):
    """Sentence pairs from (source file, target file) pairs, refusing files that do not align."""
    for src, tgt in pairs:
        a, b = read_segments(src), read_segments(tgt)
        if len(a) != len(b):
            raise DataError(f"{src} has {len(a)} {what} sentences but {tgt} has {len(b)}: parallel files must align")
        yield from zip(a, b)


def hf_pairs(name: str, pair: tuple[str, str], split: str, limit: int | None):
    """A Hugging Face translation dataset's rows (`translation: {L1: .., L2: ..}`), streamed."""
    from dietpe.data.corpus import stream_hf_dataset

    config = f"{pair[0]}-{pair[1]}"
    rows = stream_hf_dataset(f"{name}:{config}", split, missing_ok=split != "train")
    if rows is None:
        return
    for i, row in enumerate(rows):
        if limit is not None and i >= limit:
            return
        t = row.get("translation") if isinstance(row, dict) else None
        if not isinstance(t, dict) or pair[0] not in t or pair[1] not in t:
            raise DataError(f"huggingface:{name}:{config}[{split}] row {i}: expected a 'translation' with "
                            f"{pair[0]!r} and {pair[1]!r}, found {sorted(row)[:6] if isinstance(row, dict) else row}")
        yield t[pair[0]], t[pair[1]]


def sources(args) -> tuple[tuple[str, str], dict, str]:
    """(language pair, split -> iterable of pairs, what they are)."""
    local = {k: getattr(args, k) for k in ("train", "valid", "test") if getattr(args, k)}
    if args.dataset and local:
        raise ConfigError("give --dataset (Hugging Face) or local files (--train/--valid/--test), not both")
    if args.dataset or local:
        if not args.pair or not _PAIR.match(args.pair):
            raise ConfigError(f"--pair {args.pair!r}: give the language pair as L1-L2 (e.g. de-en, cs-en): the "
                              f"first language's files are L1, the second's L2")
        pair = tuple(args.pair.split("-"))
        if args.dataset:
            return pair, {split: hf_pairs(args.dataset, pair, hf, args.max_train_pairs if split == "train" else None)
                          for split, hf in (("train", "train"), ("valid", "validation"), ("test", "test"))}, \
                f"huggingface:{args.dataset}:{args.pair}"
        if "train" not in local:
            raise ConfigError("local files need --train SRC TGT (and --valid, --test if there are any)")
        for files in local.values():
            for f in (x for p in files for x in p):
                if not Path(f).is_file():
                    raise DataError(f"{f}: no such file")
        return pair, {split: local_pairs(files, split) for split, files in local.items()}, "local files"
    from dietpe.data.xtreme import find_data_dir

    V.refuse_unused(args, {"pair": "--pair"}, "to the built-in Multi30k, which is de-en (give it with --dataset or "
                    "--train files)")
    folder = find_data_dir(args.data_dir, ("multi30k",), "or give --dataset or --train files") / "multi30k"
    pair = ("de", "en")
    return pair, {"train": local_pairs([[folder / "train.de", folder / "train.en"]], "train"),
                  "valid": local_pairs([[folder / "val.de", folder / "val.en"]], "valid")}, f"Multi30k ({folder})"


def main(args) -> int:
    out = V.check_output_dir(args.output_dir, "-o")
    pair, splits, what = sources(args)
    with V.created_only_on_success(out):
        out.mkdir(parents=True, exist_ok=True)
        report = dict(source=what, pair="-".join(pair), splits={})
        for split, rows in splits.items():
            writer = Writer(out, split, pair)
            try:
                for n, (a, b) in enumerate(rows):
                    if split == "train" and args.max_train_pairs and n >= args.max_train_pairs:
                        break
                    writer.add(a, b)
            except BaseException:
                writer.abort()
                raise
            info = writer.close()
            if info["pairs"] == 0 and split != "train":  # a split the source does not have
                for f in writer.final:
                    f.unlink()
                continue
            if info["pairs"] == 0:
                raise DataError(f"{what}: no training pairs")
            report["splits"][split] = info
            print(f"dietpe translate prepare: {split}: {info['pairs']:,} pairs"
                  + (f" ({info['newlines_replaced']} newlines inside segments replaced)" if info["newlines_replaced"]
                     else ""), file=sys.stderr)
        (out / "prepare.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"{out}: train with `dietpe translate train --data {out} --source {pair[0]} --target {pair[1]}` "
          f"(or the reverse direction)")
    return 0
