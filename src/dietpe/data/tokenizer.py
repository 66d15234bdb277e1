"""WordPiece tokenizer (Wu et al. 2016, as in BERT and the DIET paper's English models).

The vocabulary is learned by `dietpe.data.vocab` (the merges `tokenizers`' WordPieceTrainer makes, but a pure
function of the text: the same text gives a byte-identical `tokenizer.json`); normalisation, pre-tokenisation,
encoding and decoding are `tokenizers`'. The special tokens come first so that `[PAD]` is id 0, the models'
`pad_token_id`. Sentence pairs are encoded BERT's way, `[CLS] A [SEP] B [SEP]` with token types 0 and 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from dietpe.data.vocab import count_words, learn_subwords
from dietpe.errors import DataError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def train_wordpiece(texts: Iterable[str], vocab_size: int = 30000, lowercase: bool = True,
                    min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a BERT-style WordPiece tokenizer on `texts` (an iterable of strings); deterministic."""
    normalizer, pre_tokenizer = word_splitter(lowercase)
    return wordpiece_from_counts(count_words(texts, normalizer, pre_tokenizer), vocab_size, lowercase,
                                 min_frequency)


def word_splitter(lowercase: bool = True):
    """(normalizer, pre-tokenizer) of BERT's WordPiece: what a word is, for counting and for encoding."""
    normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None if lowercase else False,
                                            clean_text=True, handle_chinese_chars=True)
    return normalizer, pre_tokenizers.BertPreTokenizer()


def wordpiece_from_counts(word_counts, vocab_size: int = 30000, lowercase: bool = True,
                          min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """The WordPiece tokenizer learned from word counts (`count_words` after `word_splitter`); deterministic,
    so counts streamed from a corpus in chunks (and summed) give the tokenizer `train_wordpiece` gives."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise DataError(f"vocab_size={vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens")
    normalizer, pre_tokenizer = word_splitter(lowercase)
    tokens, _ = learn_subwords(word_counts, vocab_size, SPECIAL_TOKENS, min_frequency, prefix="##")
    if len(tokens) <= len(SPECIAL_TOKENS):
        raise DataError("the tokenizer learned no words: the training text is empty")
    tok = Tokenizer(models.WordPiece(vocab={t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
                                     max_input_chars_per_word=100, continuing_subword_prefix="##"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_input_names=["input_ids", "token_type_ids", "attention_mask"])


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


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A tokenizer saved by `save_pretrained` (a directory) or a `tokenizer.json` file."""
    file, tok = read_tokenizer_json(path, "expected a tokenizer.json or a directory holding one")
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise DataError(f"{file}: the vocabulary lacks the special tokens {missing}, needed for BERT-style "
                        f"masking and pairs")
    return wrap(tok)
