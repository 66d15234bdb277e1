"""WordPiece training and loading."""

import pytest

from dietpe.data.tokenizer import load_tokenizer, train_wordpiece
from dietpe.errors import DataError

TEXT = ["the cat sat on the mat .", "the dog sat on the log .", "a cat and a dog ."] * 5


def test_trained_tokenizer_has_bert_special_tokens_and_pairs():
    tok = train_wordpiece(TEXT, vocab_size=200)
    assert tok.pad_token_id == 0
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    enc = tok("the cat", "a dog")
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert tokens == ["[CLS]", "the", "cat", "[SEP]", "a", "dog", "[SEP]"]
    assert enc["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]


def test_save_and_load_round_trip(tmp_path):
    tok = train_wordpiece(TEXT, vocab_size=200)
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again("the dog sat")["input_ids"] == tok("the dog sat")["input_ids"]
    assert len(again) == len(tok)


def test_loading_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match=str(bad)):
        load_tokenizer(bad)


def test_empty_text_is_refused():
    with pytest.raises(DataError, match="empty"):
        train_wordpiece([], vocab_size=100)


# -- determinism and quality of the trainer (dietpe.data.vocab) ------------------------------------------------

def zipf_text(n_lines: int, seed: int) -> list[str]:
    """Lines of made-up words with Zipfian frequencies: many ties between equal pair counts."""
    import random
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "si", "po", "qua", "ex", "zy", "bo", "é", "ün"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(600)]
    weights = [1 / (i + 1) for i in range(len(words))]
    return [" ".join(rng.choices(words, weights, k=rng.randint(4, 14))) + rng.choice([" .", " ,", "!"])
            for _ in range(n_lines)]


_LEARN_IN_A_PROCESS = """
import hashlib, importlib.util, json, sys
from tokenizers import normalizers, pre_tokenizers
spec = importlib.util.spec_from_file_location("vocab", {vocab!r})  # without the package: no torch import
vocab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vocab)
text = json.loads(sys.stdin.read())
for norm, pre, prefix in ((normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer(), "##"),
                          (normalizers.NFKC(), pre_tokenizers.Metaspace(), "")):
    learned = vocab.learn_subwords(vocab.count_words(text, norm, pre), 300, ["[PAD]"], 2, prefix)
    print(hashlib.sha256(json.dumps(learned).encode()).hexdigest())
"""


def test_training_is_byte_identical_across_processes():
    """`tokenizers`' own trainers give other ids in every process (hash-map order); ours may not."""
    import json
    import os
    import subprocess
    import sys

    import dietpe.data.vocab

    text = zipf_text(800, 0)
    outputs = []
    for hash_seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", _LEARN_IN_A_PROCESS.format(vocab=dietpe.data.vocab.__file__)],
                              input=json.dumps(text), env={**os.environ, "PYTHONHASHSEED": hash_seed},
                              capture_output=True, text=True, check=True, timeout=60)
        outputs.append(done.stdout.split())
    assert len(outputs[0]) == 2 and outputs[0] == outputs[1]
    first = train_wordpiece(text, vocab_size=300)
    assert first.backend_tokenizer.to_str() == train_wordpiece(text, vocab_size=300).backend_tokenizer.to_str()
    assert first.backend_tokenizer.to_str() == \
        train_wordpiece(list(reversed(text)), vocab_size=300).backend_tokenizer.to_str()  # counts, not order


def test_merges_follow_counts_and_break_ties_by_the_pair_strings():
    from dietpe.data.vocab import learn_subwords
    tokens, merges = learn_subwords({"abab": 3, "cd": 3, "xy": 1}, 100, ["<pad>"], min_frequency=2)
    # a b occurs 6 times, then ab ab 3 and c d 3 tie: "ab" < "c" decides; x y (once) is under min_frequency
    assert merges == [("a", "b"), ("ab", "ab"), ("c", "d")]
    assert tokens == ["<pad>", "a", "b", "c", "d", "x", "y", "ab", "abab", "cd"]
    # WordPiece: abab -> a ##b ##a ##b; every pair occurs 3 times, so the strings decide ("#" sorts before "a")
    tokens, merges = learn_subwords({"abab": 3, "cd": 3}, 9, [], min_frequency=1, prefix="##")
    assert tokens == ["a", "b", "c", "d", "##a", "##b", "##d", "##ab", "##bab"]  # stops at vocab_size
    assert merges == [("##a", "##b"), ("##b", "##ab")]


def test_wordpiece_round_trips_words_and_keeps_special_ids():
    text = zipf_text(800, 0)
    tok = train_wordpiece(text, vocab_size=400)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    held_out = zipf_text(50, 1)
    backend = tok.backend_tokenizer
    for line in held_out:
        ids = tok(line)["input_ids"]
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and tok.unk_token_id not in ids
        enc = backend.encode(line, add_special_tokens=False)
        pieces: dict[int, str] = {}
        for token, word in zip(enc.tokens, enc.word_ids):
            pieces[word] = pieces.get(word, "") + token.removeprefix("##")
        words = [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(line))]
        assert list(pieces.values()) == words
    assert len(tok) == 400


def test_quality_matches_the_tokenizers_trainer():
    """Tokens per word on held-out text within 2% of `tokenizers`' WordPieceTrainer and BpeTrainer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from dietpe.data.parallel import train_joint_bpe
    from dietpe.data.tokenizer import SPECIAL_TOKENS

    text, held_out = zipf_text(1500, 0), zipf_text(300, 1)
    ours = train_wordpiece(text, vocab_size=250)
    hf = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    hf.normalizer = normalizers.BertNormalizer(lowercase=True)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.train_from_iterator(text, trainers.WordPieceTrainer(vocab_size=250, special_tokens=list(SPECIAL_TOKENS),
                                                           show_progress=False))
    words = sum(len(line.split()) for line in held_out)

    def per_word(tokenizer):
        return sum(len(e.ids) for e in tokenizer.encode_batch(held_out, add_special_tokens=False)) / words

    assert per_word(ours.backend_tokenizer) == pytest.approx(per_word(hf), rel=0.02)
    bpe = train_joint_bpe(text, vocab_size=250)
    hf_bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    hf_bpe.normalizer = normalizers.NFKC()
    hf_bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    hf_bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=250, special_tokens=["<pad>", "<s>", "</s>",
                                                                                          "<unk>"],
                                                         show_progress=False))
    assert per_word(bpe.backend_tokenizer) == pytest.approx(per_word(hf_bpe), rel=0.02)
