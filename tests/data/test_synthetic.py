"""The built-in corpus and tasks: deterministic, and word order decides the order tasks' labels."""

from collections import Counter

from dietpe.data import synthetic as S
from dietpe.data.tasks import load_task


def test_files_are_deterministic_in_the_seed(tmp_path):
    a = S.write_builtin(tmp_path / "a", seed=3, documents=40, train=50, dev=20)
    b = S.write_builtin(tmp_path / "b", seed=3, documents=40, train=50, dev=20)
    c = S.write_builtin(tmp_path / "c", seed=4, documents=40, train=50, dev=20)
    for key in ("order", "pair-order", "topic"):
        assert (a[key] / "train.tsv").read_text() == (b[key] / "train.tsv").read_text()
        assert (a[key] / "train.tsv").read_text() != (c[key] / "train.tsv").read_text()
    assert (a["corpus"] / "train.txt").read_text() == (b["corpus"] / "train.txt").read_text()


def test_order_labels_follow_word_order_and_not_the_words(tmp_path):
    paths = S.write_builtin(tmp_path, seed=0, documents=20, train=400, dev=20)
    data = load_task(str(paths["order"]))
    labels = Counter()
    for ex in data.train:
        words = ex.text_a.split()
        animal = next(i for i, w in enumerate(words) if w in S.ANIMALS)
        fruit = next(i for i, w in enumerate(words) if w in S.FRUITS)
        assert data.spec.labels[ex.label] == ("animal-first" if animal < fruit else "fruit-first")
        labels[ex.label] += 1
    assert min(labels.values()) > 150  # balanced
    # The same words appear under both labels: a bag of words cannot tell them apart.
    by_label = [Counter(w for ex in data.train if ex.label == k for w in ex.text_a.split()) for k in (0, 1)]
    for word in S.ANIMALS + S.FRUITS:
        n0, n1 = by_label[0][word], by_label[1][word]
        assert abs(n0 - n1) <= 0.6 * max(n0, n1) + 5


def _animal_first(sentence):
    words = sentence.split()
    animal = next(i for i, w in enumerate(words) if w in S.ANIMALS)
    fruit = next(i for i, w in enumerate(words) if w in S.FRUITS)
    return animal < fruit


def test_pair_order_uses_two_segments_and_is_consistent(tmp_path):
    paths = S.write_builtin(tmp_path, seed=0, documents=20, train=200, dev=20)
    data = load_task(str(paths["pair-order"]))
    for ex in data.train:
        assert _animal_first(ex.text_a) != _animal_first(ex.text_b)  # exactly one puts the animal first
        assert data.spec.labels[ex.label] == ("first" if _animal_first(ex.text_a) else "second")
    assert 60 < sum(ex.label for ex in data.train) < 140


def test_topic_is_decided_by_the_words(tmp_path):
    paths = S.write_builtin(tmp_path, seed=0, documents=20, train=100, dev=20)
    data = load_task(str(paths["topic"]))
    for ex in data.train:
        counts = {c: sum(w in ws for w in ex.text_a.split()) for c, ws in S.CATEGORIES.items()}
        assert data.spec.labels[ex.label] == max(counts, key=counts.get)


def _index(words, vocabulary):
    return next(i for i, w in enumerate(words) if w in vocabulary)


def test_distance_and_start_labels_follow_positions_and_not_the_words(tmp_path):
    paths = S.write_builtin(tmp_path, seed=0, documents=20, train=400, dev=20)
    distance, start = load_task(str(paths["distance"])), load_task(str(paths["start"]))
    for ex in distance.train:
        words = ex.text_a.split()
        gap = abs(_index(words, S.ANIMALS) - _index(words, S.FRUITS))
        assert distance.spec.labels[ex.label] == ("near" if gap == 1 else "far") and (gap == 1 or gap >= 4)
    for ex in start.train:
        i = _index(ex.text_a.split(), S.ANIMALS)
        assert start.spec.labels[ex.label] == ("start" if i == 0 else "later") and (i == 0 or i >= 3)
    for data in (distance, start):
        assert 150 < sum(ex.label for ex in data.train) < 250  # balanced
        # the same kinds of words and lengths under both labels: no bag-of-words shortcut
        by_label = [Counter(w for ex in data.train if ex.label == k for w in ex.text_a.split()) for k in (0, 1)]
        for word in S.ANIMALS:
            n0, n1 = by_label[0][word], by_label[1][word]
            assert abs(n0 - n1) <= 0.6 * max(n0, n1) + 5
