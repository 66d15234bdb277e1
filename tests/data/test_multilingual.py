"""Multilingual corpora: the exponent rule's probabilities against its formula, the mixture's per-language shares,
held-out validation, determinism, and the shards keyed on the sampling."""

import collections

import pytest

from dietpe.data import multilingual as ML
from dietpe.data import shards
from dietpe.errors import ConfigError, DataError


def test_probabilities_follow_q_proportional_to_p_to_the_alpha():
    sizes = {"en": 8000, "de": 1500, "sw": 100, "zh": 400}
    total = sum(sizes.values())
    for alpha in (0.3, 0.5, 0.7, 1.0):
        q = ML.sampling_probabilities(sizes, alpha)
        norm = sum((n / total) ** alpha for n in sizes.values())
        for code, n in sizes.items():
            assert q[code] == pytest.approx((n / total) ** alpha / norm, rel=1e-12)
        assert sum(q.values()) == pytest.approx(1.0)
        rates = ML.sampling_rates(sizes, alpha)
        assert sum(rates[c] * n for c, n in sizes.items()) == pytest.approx(total)  # the size is kept
    q1 = ML.sampling_probabilities(sizes, 1.0)
    assert q1 == pytest.approx({c: n / total for c, n in sizes.items()})  # alpha 1: the corpus's own shares
    q3 = ML.sampling_probabilities(sizes, 0.3)
    assert q3["sw"] > q1["sw"] and q3["en"] < q1["en"]  # smoothing lifts low-resource languages


def write_languages(folder, sizes: dict[str, int]):
    """A file per language: documents of two sentences, each naming its language and document."""
    folder.mkdir(parents=True, exist_ok=True)
    for code, n in sizes.items():
        docs = [f"{code} document {k} begins here. {code} document {k} ends here." for k in range(n)]
        (folder / f"{code}.txt").write_text("\n\n".join(docs) + "\n")
    return folder


def languages_of(records):
    return collections.Counter(r.split(" ", 1)[0] for r in records)


def test_the_mixture_samples_each_language_by_the_rule_deterministically(tmp_path):
    sizes = {"en": 2000, "de": 400, "sw": 40}
    folder = write_languages(tmp_path / "corpus", sizes)
    source = ML.corpus_source(str(folder), "en,de,sw", 0.5)
    records = list(ML.mixture_records(source, "train"))
    assert records == list(ML.mixture_records(source, "train"))  # the same stream twice
    info = ML.describe(source)
    held = {c: max(1, n // 20) for c, n in sizes.items()}
    counts = languages_of(records)
    total = sum(2 * (n - held[c]) for c, n in sizes.items())  # training sentences
    for code in sizes:
        share = 2 * counts[code] / total
        assert share == pytest.approx(info[code]["q"], abs=0.03)
    assert counts["sw"] > 2 * (40 - held["sw"])  # the low-resource language is repeated
    assert counts["en"] < 2000 - held["en"]     # the large one subsampled
    first = languages_of(records[:60])
    assert set(first) == set(sizes)  # interleaved: any prefix holds every language
    validation = list(ML.mixture_records(source, "validation"))
    assert languages_of(validation) == held
    assert not set(validation) & set(records)  # held out before sampling: never trained on


def test_alpha_one_keeps_every_document_once(tmp_path):
    folder = write_languages(tmp_path / "c", {"en": 60, "fr": 20})
    records = list(ML.mixture_records(ML.corpus_source(str(folder), "en,fr", 1.0), "train"))
    assert len(records) == len(set(records)) == (60 - 3) + (20 - 1)


def test_templates_and_errors_name_the_language_and_path(tmp_path):
    folder = write_languages(tmp_path / "c", {"en": 30, "de": 30})
    source = ML.corpus_source(str(folder / "{lang}.txt"), "en,de", None)
    assert ML.Mixture.parse(source).alpha == ML.DEFAULT_ALPHA == 0.5
    with pytest.raises(DataError, match="fr.txt: no such file"):
        ML.corpus_source(str(folder / "{lang}.txt"), "en,fr", None)
    with pytest.raises(DataError, match="no corpus for language 'xx'"):
        ML.corpus_source(str(folder), "en,xx", None)
    with pytest.raises(ConfigError, match="give --languages too"):
        ML.corpus_source(str(folder / "en.txt"), None, 0.5)
    with pytest.raises(ConfigError, match="must lie in"):
        ML.corpus_source(str(folder), "en,de", 1.5)
    with pytest.raises(ConfigError, match="each language once"):
        ML.corpus_source(str(folder), "en,en", None)


def test_shards_of_a_mixture_key_on_the_sampling(tmp_path):
    folder = write_languages(tmp_path / "c", {"en": 80, "de": 30, "fr": 10})
    common = dict(vocab_size=80, max_length=16, cache_dir=tmp_path / "cache", processes=1, log=lambda m: None,
                  tokenizer_type="unigram")
    a = shards.prepare(ML.corpus_source(str(folder), "en,de,fr", 0.5), **common)
    again = shards.prepare(ML.corpus_source(str(folder), "en,de,fr", 0.5), **common)
    b = shards.prepare(ML.corpus_source(str(folder), "en,de,fr", 0.3), **common)
    assert a.folder == again.folder and a.folder != b.folder
    assert a.manifest["key"]["data"]["train"]["alpha"] == 0.5
    assert len(a.train) and len(a.validation)
    assert type(a.tokenizer.backend_tokenizer.model).__name__ == "Unigram"
