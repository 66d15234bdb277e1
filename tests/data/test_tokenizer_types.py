"""WordPiece, Unigram and BPE tokenizers: trained, saved, reloaded with the same ids, deterministic across
processes, special tokens by role under any names; the Unigram trainer's pieces against its equations."""

import math
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer

from dietpe.data import unigram
from dietpe.data.tokenizer import (
    BERT_TOKENS,
    SENTENCEPIECE_TOKENS,
    SpecialTokens,
    TokenizerSpec,
    load_tokenizer,
    train_tokenizer,
)
from dietpe.errors import DataError

TEXT = ["the cat sat on the mat .", "der Hund schläft auf der Matte .", "le chat dort sur le tapis .",
        "a dog and a cat , ein Hund und eine Katze ."] * 6
TYPES = ("wordpiece", "unigram", "bpe")


@pytest.mark.parametrize("kind", TYPES)
def test_each_type_trains_saves_reloads_and_gives_the_same_ids_twice(kind, tmp_path):
    spec = TokenizerSpec(kind, 120, min_frequency=1)
    tok = train_tokenizer(TEXT, spec)
    again = train_tokenizer(TEXT, spec)
    assert tok.backend_tokenizer.to_str() == again.backend_tokenizer.to_str()  # the same text, the same bytes
    names = spec.special.names()
    assert tok.convert_ids_to_tokens(list(range(len(names)))) == list(names)  # specials first, pad = 0
    assert tok.pad_token_id == 0 and tok.mask_token == spec.special.mask
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    sample = ["der Hund sat on le tapis", "a cat"]
    assert loaded(sample)["input_ids"] == tok(sample)["input_ids"]
    assert loaded("le chat", "der Hund")["token_type_ids"] == tok("le chat", "der Hund")["token_type_ids"]
    enc = loaded("le chat", "der Hund")
    ids, types = enc["input_ids"], enc["token_type_ids"]
    assert ids[0] == loaded.cls_token_id and ids[-1] == loaded.sep_token_id and ids.count(loaded.sep_token_id) == 2
    assert types[0] == 0 and types[-1] == 1  # two segments, BERT's way, whatever the names
    assert (loaded.cls_token, loaded.sep_token, loaded.unk_token) == (spec.special.cls, spec.special.sep,
                                                                      spec.special.unk)


def test_unigram_and_bpe_keep_case_and_decode_exactly():
    for kind in ("unigram", "bpe"):
        tok = train_tokenizer(TEXT, TokenizerSpec(kind, 150, min_frequency=1))
        text = "der Hund schläft auf der Matte ."
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    wp = train_tokenizer(TEXT, TokenizerSpec("wordpiece", 150, min_frequency=1))
    assert wp.decode(wp("Der Hund", add_special_tokens=False)["input_ids"]) == "der hund"  # BERT uncased


def test_special_tokens_take_any_names_and_keep_their_roles(tmp_path):
    special = SpecialTokens.parse("cls=<cls>,sep=<sep>,mask=<M>", SENTENCEPIECE_TOKENS)
    tok = train_tokenizer(TEXT, TokenizerSpec("unigram", 120, special=special))
    assert tok.convert_ids_to_tokens(list(range(6))) == ["<pad>", "<unk>", "<cls>", "<sep>", "<M>", "<s>"]
    assert (tok.cls_token, tok.sep_token, tok.mask_token, tok.bos_token, tok.eos_token) == (
        "<cls>", "<sep>", "<M>", "<s>", "</s>")
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)  # the roles come back from tokenizer_config.json
    assert (loaded.cls_token, loaded.mask_token) == ("<cls>", "<M>")
    assert loaded("le chat")["input_ids"][0] == loaded.convert_tokens_to_ids("<cls>")
    for bad, what in (("cls", "role=name"), ("colour=<c>", "role=name"), ("cls=<a>,cls=<b>", "named twice")):
        with pytest.raises(DataError, match=what):
            SpecialTokens.parse(bad, BERT_TOKENS)


def test_a_bare_tokenizer_json_is_read_by_its_token_names_and_a_missing_role_is_named(tmp_path):
    tok = train_tokenizer(TEXT, TokenizerSpec("bpe", 120, min_frequency=1))
    bare = tmp_path / "bare.json"
    tok.backend_tokenizer.save(str(bare))
    loaded = load_tokenizer(bare)  # no tokenizer_config.json: SentencePiece's names are recognised
    assert (loaded.pad_token, loaded.cls_token, loaded.sep_token, loaded.mask_token) == ("<pad>", "<s>", "</s>",
                                                                                         "<mask>")
    raw = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    data = raw.to_str().replace('"<mask>"', '"<hidden>"')
    (tmp_path / "nomask.json").write_text(data)
    with pytest.raises(DataError, match=r"lacks the special tokens \['mask'\].*<mask>"):
        load_tokenizer(tmp_path / "nomask.json")


def test_vocabulary_sizes_beyond_120k_are_refused(capsys):
    with pytest.raises(DataError, match="at most 120,000"):
        TokenizerSpec("unigram", 120_001)
    from dietpe.cli import main
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "corpus", "--vocab-size", "200000"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--vocab-size" in err and "120,000" in err and len(err.strip().splitlines()) == 1


_UNIGRAM_IN_A_PROCESS = """
import hashlib, importlib.util, json, sys, types
from tokenizers import normalizers, pre_tokenizers
sys.modules["dietpe"] = types.ModuleType("dietpe")  # the two modules alone: no torch import
for name, path in (("dietpe.errors", {errors!r}), ("unigram", {unigram!r})):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
from collections import Counter
counts = Counter()
for line in json.loads(sys.stdin.read()):
    counts.update(w for w, _ in pre_tokenizers.Metaspace().pre_tokenize_str(normalizers.NFKC().normalize_str(line)))
print(hashlib.sha256(json.dumps(module.learn_unigram(counts, 300)).encode()).hexdigest())
"""


def test_unigram_training_is_the_same_in_another_process_whatever_its_hash_seed():
    """`tokenizers`' own UnigramTrainer gives another vocabulary in every process (three trainings on the same
    XNLI text gave three `tokenizer.json`); ours must not."""
    import json
    import os

    import dietpe.errors
    from tests.data.test_tokenizer import zipf_text

    code = _UNIGRAM_IN_A_PROCESS.format(errors=dietpe.errors.__file__, unigram=unigram.__file__)
    digests = set()
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(zipf_text(600, 0)), capture_output=True,
                             text=True, check=True, timeout=120, env=dict(os.environ, PYTHONHASHSEED=seed))
        digests.add(out.stdout.strip())
    assert len(digests) == 1 and len(next(iter(digests))) == 64


# -- the Unigram trainer against its equations ------------------------------------------------------------------

def segmentations(word: str, pieces: set[str]):
    """Every segmentation of `word` into `pieces`, by brute force."""
    if not word:
        yield []
        return
    for j in range(1, len(word) + 1):
        if word[:j] in pieces:
            for rest in segmentations(word[j:], pieces):
                yield [word[:j]] + rest


def test_forward_backward_equals_the_sum_over_every_segmentation():
    words = ["▁abab", "▁ba", "▁aab"]
    scores = {"▁": -2.0, "a": -1.0, "b": -1.5, "ab": -1.2, "▁a": -1.7, "ba": -2.4, "aab": -3.1, "▁ab": -2.2}
    names = list(scores)
    ids = {p: i for i, p in enumerate(names)}
    lat = unigram.Lattices.of(words, ids, max_len=16)
    s = np.array([scores[p] for p in names])
    z, marginal = lat.forward_backward(s, unk=-99.0)
    viterbi, word_of, piece_of = lat.viterbi(s, unk=-99.0)
    for k, w in enumerate(words):
        segs = list(segmentations(w, set(names)))
        logp = [sum(scores[p] for p in seg) for seg in segs]
        assert z[k] == pytest.approx(math.log(sum(math.exp(x) for x in logp)), abs=1e-12)
        assert viterbi[k] == pytest.approx(max(logp), abs=1e-12)
        best = segs[int(np.argmax(logp))]
        assert sorted(names[p] for p in piece_of[word_of == k]) == sorted(best)
        # expected count of each piece in w = Σ_seg P(seg) · count(piece in seg)
        expected = {p: 0.0 for p in names}
        for seg, lp in zip(segs, logp):
            for p in seg:
                expected[p] += math.exp(lp - z[k])
        got = {p: 0.0 for p in names}
        for e in np.flatnonzero(lat.word == k):
            got[names[lat.piece[e]]] += marginal[e]
        assert got == pytest.approx(expected, abs=1e-12)


def test_digamma_matches_scipy():
    from scipy.special import digamma
    x = np.array([0.5, 1.0, 2.5, 7.0, 30.0, 1e4])
    assert unigram.digamma(x) == pytest.approx(digamma(x), rel=1e-9)


def test_unigram_vocabulary_has_its_size_every_required_character_and_valid_pieces():
    from collections import Counter
    counts = Counter({"▁" + w: n for w, n in zip(("the", "then", "there", "cat", "catalog", "dog", "zebra"),
                                                  (50, 20, 20, 30, 5, 30, 1))})
    pieces = unigram.learn_unigram(counts, 16)
    names = [p for p, _ in pieces]
    assert len(names) == 16 == len(set(names))
    assert set("▁thencarlogdzb") <= set(names)
    assert all(unigram.valid_piece(p) for p in names)
    scores = [s for _, s in pieces]
    assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
    assert "▁the" in names  # the most frequent word becomes a piece
    with pytest.raises(DataError, match="smaller than the .* characters"):
        unigram.learn_unigram(counts, 5)


def test_rare_characters_are_left_out_by_the_coverage():
    from collections import Counter
    counts = Counter({"▁aaaa": 10_000, "▁bbb": 10_000, "▁x": 1})
    names = [p for p, _ in unigram.learn_unigram(counts, 10, character_coverage=0.9999)]
    assert "x" not in names and "▁x" not in names and {"a", "b", "▁"} <= set(names)
