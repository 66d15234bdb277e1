"""Parallel text for translation: line-aligned source and target files (one sentence per line, as WMT and
Multi30k ship them, e.g. `train.de` / `train.en`), a joint subword vocabulary, and encoding into model inputs.

The vocabulary is BPE (Sennrich et al. 2016) over both languages at once, as the papers' WMT models share one
vocabulary between source and target (so the embedding and output projection can be tied). Words are split on
whitespace with SentencePiece's `▁` marker (Kudo & Richardson 2018), which makes decoding exact: the
detokenised output SacreBLEU wants is `tokenizer.decode(ids)`, no Moses detokeniser needed.

Bad input is never silently truncated:
* files whose line counts differ: DataError naming both files and counts;
* an empty (or blank) line on either side, or a pair longer than the length limit: with `bad="skip"` the pair
  is dropped and counted in a `PairReport` (the line numbers are kept), with `bad="error"` a DataError names
  the file, the line, and the limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from dietpe.data.text import read_text
from dietpe.data.tokenizer import read_tokenizer_json
from dietpe.data.vocab import count_words, learn_subwords
from dietpe.errors import DataError

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# Special tokens first, so ids match DietSeq2SeqConfig's defaults: pad 0, bos (decoder start) 1, eos 2.
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
SPLIT_NAMES = {"train": ("train",), "valid": ("val", "valid", "validation", "dev"), "test": ("test",)}


# -- reading -------------------------------------------------------------------------------------------------

def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, without line ends (`\\n` or `\\r\\n`), whitespace stripped.

    Splits on `\\n` only (not on Unicode line separators), so line numbers agree with `wc -l` and editors."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    lines = read_text(path).split("\n")  # invalid UTF-8: DataError naming file:line; a BOM is dropped
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.strip() for line in lines]


def read_parallel(source: str | Path, target: str | Path | None) -> tuple[list[str], list[str] | None]:
    """Source lines and (optionally) target lines, refusing files that do not pair up line by line."""
    src = read_lines(source)
    if not src:
        raise DataError(f"{source}: the file is empty")
    if target is None:
        return src, None
    tgt = read_lines(target)
    if len(src) != len(tgt):
        raise DataError(f"{source} has {len(src)} lines but {target} has {len(tgt)}: parallel files must be "
                        f"aligned line by line")
    return src, tgt


def find_split(data_dir: str | Path, split: str, lang: str) -> Path:
    """`DIR/train.de`, `DIR/val.en` (or valid/validation/dev) for a split and a language code."""
    data_dir = Path(data_dir)
    tried = [data_dir / f"{name}.{lang}" for name in SPLIT_NAMES[split]]
    for path in tried:
        if path.is_file():
            return path
    raise DataError(f"no {split} file for language {lang!r} in {data_dir}: tried {', '.join(p.name for p in tried)}")


# -- the joint vocabulary ------------------------------------------------------------------------------------

def train_joint_bpe(texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """BPE over source and target text together; encodes a sentence as its pieces followed by `</s>`.

    The merges are learned by `dietpe.data.vocab`, a pure function of the text (`tokenizers`' BpeTrainer breaks
    ties between equal counts in an order that changes from process to process)."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise DataError(f"vocab_size={vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens")
    normalizer = normalizers.NFKC()
    pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokens, merges = learn_subwords(count_words(texts, normalizer, pre_tokenizer), vocab_size, SPECIAL_TOKENS,
                                    min_frequency)
    if len(tokens) <= len(SPECIAL_TOKENS):
        raise DataError("the joint vocabulary learned nothing: the training text is empty")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, unk_token=UNK))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.post_processor = processors.TemplateProcessing(single=f"$A:0 {EOS}:0",
                                                       special_tokens=[(EOS, tok.token_to_id(EOS))])
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, model_input_names=["input_ids", "attention_mask"])


def load_joint_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A tokenizer saved next to a translation model (a directory holding tokenizer.json)."""
    file, tok = read_tokenizer_json(path, "a translation model directory holds tokenizer.json")
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise DataError(f"{file}: expected special token {name} at id {i}, the translation models' layout")
    return wrap(tok)


# -- encoding with counted skips -----------------------------------------------------------------------------

@dataclass
class PairReport:
    """What happened to each line pair: kept, or skipped and why (line numbers are 1-based)."""

    total: int = 0
    kept: int = 0
    empty: list[int] = field(default_factory=list)
    too_long: list[int] = field(default_factory=list)

    def summary(self, name: str) -> str:
        def lines(xs):
            return ", ".join(map(str, xs[:5])) + (", ..." if len(xs) > 5 else "")

        text = f"{name}: {self.kept} of {self.total} pairs kept"
        if self.empty:
            text += f"; {len(self.empty)} skipped for an empty line (lines {lines(self.empty)})"
        if self.too_long:
            text += f"; {len(self.too_long)} skipped as longer than the limit (lines {lines(self.too_long)})"
        return text

    def to_dict(self) -> dict:
        return dict(total=self.total, kept=self.kept, skipped_empty=len(self.empty),
                    skipped_too_long=len(self.too_long), empty_lines=self.empty, too_long_lines=self.too_long)


def _batches(items: list[str], size: int = 2048) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def encode_pairs(tokenizer: PreTrainedTokenizerFast, source: list[str], target: list[str],
                 max_source_length: int, max_target_length: int, bad: str = "skip",
                 files: tuple[str, str] = ("source", "target")) -> tuple[list[dict], PairReport]:
    """Token ids per pair: `input_ids` (source + </s>) and `labels` (target + </s>).

    Lengths count the `</s>`. A pair with an empty side or a side over its limit is skipped and counted
    (`bad="skip"`) or refused with the file and line (`bad="error"`)."""
    if bad not in ("skip", "error"):
        raise DataError(f"bad={bad!r} is not one of 'skip', 'error'")
    report = PairReport(total=len(source))
    src_ids = [ids for chunk in _batches(source) for ids in tokenizer(chunk)["input_ids"]]
    tgt_ids = [ids for chunk in _batches(target) for ids in tokenizer(chunk)["input_ids"]]
    out = []
    for n, (s, t, si, ti) in enumerate(zip(source, target, src_ids, tgt_ids), start=1):
        if not s or not t:
            if bad == "error":
                raise DataError(f"{files[0] if not s else files[1]}:{n}: empty line")
            report.empty.append(n)
            continue
        if len(si) > max_source_length or len(ti) > max_target_length:
            if bad == "error":
                which, length, limit = ((files[0], len(si), max_source_length) if len(si) > max_source_length
                                        else (files[1], len(ti), max_target_length))
                raise DataError(f"{which}:{n}: {length} tokens (with </s>) exceed the limit of {limit}; raise "
                                f"--max-length (within what the position method allows) or use --bad-lines skip")
            report.too_long.append(n)
            continue
        out.append({"input_ids": si, "labels": ti})
    report.kept = len(out)
    return out, report


def encode_sources(tokenizer: PreTrainedTokenizerFast, source: list[str], max_length: int | None,
                   file: str = "source") -> list[list[int]]:
    """Source ids for translation; an empty line or one longer than the model serves is refused by name."""
    ids = [x for chunk in _batches(source) for x in tokenizer(chunk)["input_ids"]]
    for n, (line, x) in enumerate(zip(source, ids), start=1):
        if not line:
            raise DataError(f"{file}:{n}: empty line; remove it (and its reference line) or put text there")
        if max_length is not None and len(x) > max_length:
            raise DataError(f"{file}:{n}: {len(x)} tokens (with </s>) exceed {max_length}, the longest source the "
                            f"model's position method serves (max_position_embeddings of a learned table)")
    return ids
