"""Subword tokenizers for pre-training: WordPiece (Wu et al. 2016, BERT and the DIET paper's English models),
and SentencePiece-style Unigram (Kudo 2018, the DIET paper's multilingual models: "Sentence Piece ... with
120,000 token vocabulary") or BPE (Sennrich et al. 2016).

The vocabularies are learned by diet's own trainers, pure functions of the word counts (`dietpe.data.vocab`
for WordPiece and BPE merges, `dietpe.data.unigram` for Unigram): the same text gives a byte-identical
`tokenizer.json`, and counts streamed from a corpus in chunks (and summed) give the tokenizer the whole text
gives. Normalisation, pre-tokenisation, encoding and decoding are `tokenizers`'. WordPiece splits words BERT's
way (lower-cased by default); Unigram and BPE work as SentencePiece does: NFKC, then words marked by a leading
`▁` (Metaspace), case kept, so decoding is exact.

Special tokens have roles (pad, unk, cls, sep, mask, and optionally bos and eos, `SpecialTokens`), whatever
their names: BERT's `[PAD] [UNK] [CLS] [SEP] [MASK]` by default for WordPiece, SentencePiece's
`<pad> <unk> <s> </s> <mask>` for the others, or any names given. They come first in the vocabulary (pad is
id 0, the models' `pad_token_id`). Sentence pairs are encoded BERT's way, `cls A sep B sep` with token types 0
and 1 (the models' segments).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from dietpe.data.vocab import MAX_VOCAB_SIZE, TOKENIZER_TYPES, count_words, learn_subwords
from dietpe.errors import DataError


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens' names by role; roles sharing a name (bos = cls) are one token."""

    pad: str
    unk: str
    cls: str
    sep: str
    mask: str
    bos: str | None = None
    eos: str | None = None

    def names(self) -> tuple[str, ...]:
        """The distinct names in role order: their ids in the vocabulary."""
        return tuple(dict.fromkeys(n for n in asdict(self).values() if n))

    def hf_kwargs(self) -> dict[str, str]:
        return {f"{role}_token": name for role, name in asdict(self).items() if name}

    @classmethod
    def parse(cls, text: str, base: SpecialTokens) -> SpecialTokens:
        """`cls=<s>,sep=</s>` over `base`: a role named twice, an unknown role or an empty name refused."""
        roles = {f.name for f in fields(cls)}
        given: dict[str, str] = {}
        for item in filter(None, (x.strip() for x in text.split(","))):
            role, eq, name = item.partition("=")
            role = role.strip()
            if not eq or role not in roles or not name.strip():
                raise DataError(f"special tokens {text!r}: {item!r} is not role=name with a role among "
                                f"{', '.join(sorted(roles))} (e.g. cls=<s>,sep=</s>)")
            if role in given:
                raise DataError(f"special tokens {text!r}: the role {role} is named twice")
            given[role] = name.strip()
        return cls(**{**asdict(base), **given})


BERT_TOKENS = SpecialTokens("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SENTENCEPIECE_TOKENS = SpecialTokens("<pad>", "<unk>", "<s>", "</s>", "<mask>", bos="<s>", eos="</s>")
DEFAULT_TOKENS = {"wordpiece": BERT_TOKENS, "unigram": SENTENCEPIECE_TOKENS, "bpe": SENTENCEPIECE_TOKENS}
SPECIAL_TOKENS = BERT_TOKENS.names()
# names each role is recognised by in a tokenizer that does not say (a bare tokenizer.json)
ROLE_NAMES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<s>", "<cls>"),
              "sep": ("[SEP]", "</s>", "<sep>"), "mask": ("[MASK]", "<mask>"), "bos": ("<s>",), "eos": ("</s>",)}
REQUIRED_ROLES = ("pad", "unk", "cls", "sep", "mask")


@dataclass(frozen=True)
class TokenizerSpec:
    """What tokenizer to learn: its type, vocabulary size, case and special tokens."""

    kind: str = "wordpiece"
    vocab_size: int = 30000
    lowercase: bool | None = None        # None: WordPiece lower-cases (BERT uncased), the others keep case
    special: SpecialTokens | None = None  # None: the type's default names
    min_frequency: int = 2               # WordPiece and BPE: the least count of a merged pair

    def __post_init__(self):
        if self.kind not in TOKENIZER_TYPES:
            raise DataError(f"tokenizer type {self.kind!r} is not one of {', '.join(TOKENIZER_TYPES)}")
        special = self.special or DEFAULT_TOKENS[self.kind]
        object.__setattr__(self, "special", special)
        if self.lowercase is None:
            object.__setattr__(self, "lowercase", self.kind == "wordpiece")
        if not len(special.names()) < self.vocab_size <= MAX_VOCAB_SIZE:
            raise DataError(f"vocab_size={self.vocab_size} must exceed the {len(special.names())} special tokens "
                            f"and be at most {MAX_VOCAB_SIZE:,} (the DIET paper's multilingual vocabulary)")

    def key(self) -> dict:
        """What identifies the tokenizer in a cache key; WordPiece's defaults as they always were."""
        key = dict(kind=self.kind, vocab_size=self.vocab_size)
        if self.kind != "wordpiece" or not self.lowercase:
            key["lowercase"] = self.lowercase
        if self.special != DEFAULT_TOKENS[self.kind]:
            key["special"] = asdict(self.special)
        return key


def tokenizer_spec(kind: str, vocab_size: int, special_tokens: str | None = None) -> TokenizerSpec:
    """A `TokenizerSpec` from the command line's words: `--tokenizer-type`, `--vocab-size`, `--special-tokens`."""
    if kind not in TOKENIZER_TYPES:
        raise DataError(f"tokenizer type {kind!r} is not one of {', '.join(TOKENIZER_TYPES)}")
    special = SpecialTokens.parse(special_tokens, DEFAULT_TOKENS[kind]) if special_tokens else None
    return TokenizerSpec(kind, vocab_size, special=special)


def word_splitter(lowercase: bool = True, kind: str = "wordpiece"):
    """(normalizer, pre-tokenizer): what a word is, for counting and for encoding. WordPiece: BERT's;
    Unigram and BPE: SentencePiece's NFKC and `▁`-marked words."""
    if kind == "wordpiece":
        normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None if lowercase else False,
                                                clean_text=True, handle_chinese_chars=True)
        return normalizer, pre_tokenizers.BertPreTokenizer()
    parts = [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
    normalizer = normalizers.Sequence(parts) if len(parts) > 1 else parts[0]
    return normalizer, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)


def train_tokenizer(texts: Iterable[str], spec: TokenizerSpec) -> PreTrainedTokenizerFast:
    """A tokenizer of `spec` learned on `texts` (an iterable of strings); deterministic."""
    normalizer, pre_tokenizer = word_splitter(spec.lowercase, spec.kind)
    return tokenizer_from_counts(count_words(texts, normalizer, pre_tokenizer), spec)


def train_wordpiece(texts: Iterable[str], vocab_size: int = 30000, lowercase: bool = True,
                    min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a BERT-style WordPiece tokenizer on `texts` (an iterable of strings); deterministic."""
    return train_tokenizer(texts, TokenizerSpec("wordpiece", vocab_size, lowercase, min_frequency=min_frequency))


def tokenizer_from_counts(word_counts, spec: TokenizerSpec) -> PreTrainedTokenizerFast:
    """The tokenizer of `spec` learned from word counts (`count_words` after `word_splitter`)."""
    names = spec.special.names()
    if spec.kind == "unigram":
        from dietpe.data.unigram import learn_unigram

        pieces = learn_unigram(word_counts, spec.vocab_size - len(names))
        vocab = [(n, 0.0) for n in names] + [(p, s) for p, s in pieces if p not in names]
        model = models.Unigram(vocab, unk_id=names.index(spec.special.unk), byte_fallback=False)
    else:
        prefix = "##" if spec.kind == "wordpiece" else ""
        tokens, merges = learn_subwords(word_counts, spec.vocab_size, names, spec.min_frequency, prefix=prefix)
        if len(tokens) <= len(names):
            raise DataError("the tokenizer learned no words: the training text is empty")
        vocab = {t: i for i, t in enumerate(tokens)}
        model = (models.WordPiece(vocab=vocab, unk_token=spec.special.unk, max_input_chars_per_word=100,
                                  continuing_subword_prefix="##") if prefix
                 else models.BPE(vocab=vocab, merges=merges, unk_token=spec.special.unk))
    tok = Tokenizer(model)
    tok.normalizer, tok.pre_tokenizer = word_splitter(spec.lowercase, spec.kind)
    tok.decoder = (decoders.WordPiece(prefix="##") if spec.kind == "wordpiece"
                   else decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True))
    tok.add_special_tokens(list(names))
    cls_, sep = spec.special.cls, spec.special.sep
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls_}:0 $A:0 {sep}:0", pair=f"{cls_}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls_, tok.token_to_id(cls_)), (sep, tok.token_to_id(sep))])
    return wrap(tok, spec.special)


def wordpiece_from_counts(word_counts, vocab_size: int = 30000, lowercase: bool = True,
                          min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """The WordPiece tokenizer learned from word counts (`count_words` after `word_splitter`); deterministic,
    so counts streamed from a corpus in chunks (and summed) give the tokenizer `train_wordpiece` gives."""
    return tokenizer_from_counts(word_counts, TokenizerSpec("wordpiece", vocab_size, lowercase,
                                                            min_frequency=min_frequency))


def wrap(tok: Tokenizer, special: SpecialTokens = BERT_TOKENS) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special.hf_kwargs(),
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: str | Path, max_length: int | None = None) -> None:
    """`save_pretrained`, recording `model_max_length` when the model has a length limit (a learned position
    table), so Hugging Face pipelines truncate to it instead of failing on longer inputs."""
    old = tokenizer.model_max_length
    if max_length:
        tokenizer.model_max_length = max_length
    try:
        tokenizer.save_pretrained(folder)
    finally:
        tokenizer.model_max_length = old


def read_tokenizer_json(path: str | Path, hint: str) -> tuple[Path, Tokenizer]:
    """(file, Tokenizer) from a `tokenizer.json` or a directory holding one; `hint` says what was expected."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"{file}: no tokenizer here ({hint})")
    try:
        return file, Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(f"{file}: not a tokenizers JSON file ({e})") from None


def saved_roles(file: Path) -> dict[str, str]:
    """The roles `save_pretrained` recorded next to a tokenizer.json (`tokenizer_config.json`), if any."""
    config = file.parent / "tokenizer_config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, ValueError):
        raise DataError(f"{config}: unreadable tokenizer config") from None
    roles = {}
    for role in ROLE_NAMES:
        value = data.get(f"{role}_token") if isinstance(data, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value:
            roles[role] = value
    return roles


def find_roles(file: Path, tok: Tokenizer) -> SpecialTokens:
    """Each role's token: as recorded by `save_pretrained`, else by the usual names (BERT's, SentencePiece's)."""
    roles = {r: n for r, n in saved_roles(file).items() if tok.token_to_id(n) is not None}
    for role, candidates in ROLE_NAMES.items():
        if role not in roles:
            found = next((n for n in candidates if tok.token_to_id(n) is not None), None)
            if found is not None:
                roles[role] = found
    missing = [r for r in REQUIRED_ROLES if r not in roles]
    if missing:
        looked = "; ".join(f"{r}: {' or '.join(ROLE_NAMES[r])}" for r in missing)
        raise DataError(f"{file}: the vocabulary lacks the special tokens {missing}, needed for BERT-style masking "
                        f"and pairs (looked for {looked}); name them in tokenizer_config.json ({missing[0]}_token) "
                        f"or train with --special-tokens")
    return SpecialTokens(**roles)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A tokenizer saved by `save_pretrained` (a directory) or a `tokenizer.json` file, any type, with its
    special tokens' roles."""
    file, tok = read_tokenizer_json(path, "expected a tokenizer.json or a directory holding one")
    return wrap(tok, find_roles(file, tok))
