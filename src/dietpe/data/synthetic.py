"""The built-in data of `dietpe compare`: a generated toy-language corpus and three tasks, seeded, offline.

The corpus is sentences of a small grammar (subject-verb-object sentences, counting runs, lists), so masked-LM
pre-training has something to learn, some of it about order ("count four five [MASK] seven").
The tasks are written as GLUE-style TSVs and go through the same readers as real data:

* `order` (one segment): which of two named items, an animal and a fruit hidden among filler words, comes
  first. Both labels have the same bag of words, so a model without position information is at chance.
* `pair-order` (two segments): two `order` sentences of which exactly one puts the animal first; which one,
  `first` or `second`? Both segments hold the same kinds of words, so it takes the order within each
  segment and knowing which segment is which (segment information, or positions relative to [SEP]).
* `topic` (one segment, control): which category (animals, fruits, tools) most words belong to; word order is
  irrelevant, so every method, position-free included, should solve it.
* `distance` (one segment): an animal and a fruit among filler words, in either order; are they adjacent
  (`near`) or at least four words apart (`far`)? The answer is a relative distance; the bag of words is the
  same under both labels, so a position-free model is at chance.
* `start` (one segment): one animal among filler words; is it the first word, right after [CLS] (`start`), or
  the fourth word or later (`later`)? The answer is an absolute position near [CLS]; position-free: chance.
"""

from __future__ import annotations

import random
from pathlib import Path

from dietpe.data.taskspec import TaskSpec
from dietpe.data.text import write_text_atomic

ANIMALS = "cat dog fox owl bear wolf deer hare mole crow frog goat".split()
FRUITS = "apple pear plum fig lime kiwi grape peach melon mango lemon cherry".split()
TOOLS = "hammer saw drill wrench chisel spade rake axe clamp lever pliers ruler".split()
ADJECTIVES = "red big small old quiet quick green tall brown happy".split()
VERBS = "sees finds likes follows eats holds moves wants".split()
FILLER = "the a and then near with over under by from".split()
NUMBERS = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
           "sixteen seventeen eighteen nineteen twenty").split()
CATEGORIES = {"animal": ANIMALS, "fruit": FRUITS, "tool": TOOLS}

TASKS: dict[str, TaskSpec] = {
    "order": TaskSpec("order", "classification", ("accuracy",), ("animal-first", "fruit-first")),
    "pair-order": TaskSpec("pair-order", "classification", ("accuracy",), ("first", "second"),
                           text_a="sentence1", text_b="sentence2"),
    "topic": TaskSpec("topic", "classification", ("accuracy",), ("animal", "fruit", "tool")),
    "distance": TaskSpec("distance", "classification", ("accuracy",), ("near", "far")),
    "start": TaskSpec("start", "classification", ("accuracy",), ("start", "later")),
}


def _svo(rng: random.Random) -> str:
    subject = rng.choice(ANIMALS)
    obj = rng.choice(rng.choice([FRUITS, TOOLS, ANIMALS]))
    return f"the {rng.choice(ADJECTIVES)} {subject} {rng.choice(VERBS)} the {obj} ."


def _count(rng: random.Random) -> str:
    n = rng.randrange(3, 8)
    start = rng.randrange(0, len(NUMBERS) - n)
    return "count " + " ".join(NUMBERS[start:start + n]) + " ."


def _list(rng: random.Random) -> str:
    words = rng.sample(rng.choice(list(CATEGORIES.values())), 3)
    return f"{words[0]} , {words[1]} and {words[2]} are {rng.choice(ADJECTIVES)} ."


def _before(rng: random.Random) -> str:
    a, b = rng.choice(ANIMALS), rng.choice(FRUITS)
    a, b = (a, b) if rng.random() < 0.5 else (b, a)
    kind = "animal" if a in ANIMALS else "fruit"
    return f"first the {a} then the {b} , the {kind} comes first ."


def corpus(seed: int, documents: int) -> list[list[str]]:
    """`documents` documents of 4-12 generated sentences each."""
    rng = random.Random(seed)
    makers = (_svo, _svo, _count, _list, _before)
    return [[rng.choice(makers)(rng) for _ in range(rng.randrange(4, 13))] for _ in range(documents)]


def _filler(rng: random.Random, low: int, high: int) -> list[str]:
    return [rng.choice(FILLER + ADJECTIVES + VERBS) for _ in range(rng.randrange(low, high + 1))]


def _insert(rng: random.Random, words: list[str], items: list[str]) -> list[str]:
    """Insert `items` in their order at random positions of `words`."""
    slots = sorted(rng.sample(range(len(words) + len(items)), len(items)))
    out, it, wt = [], iter(items), iter(words)
    for i in range(len(words) + len(items)):
        out.append(next(it) if i in slots else next(wt))
    return out


def order_example(rng: random.Random) -> tuple[str, str]:
    animal, fruit = rng.choice(ANIMALS), rng.choice(FRUITS)
    animal_first = rng.random() < 0.5
    items = [animal, fruit] if animal_first else [fruit, animal]
    return " ".join(_insert(rng, _filler(rng, 3, 8), items)), "animal-first" if animal_first else "fruit-first"


def pair_order_example(rng: random.Random) -> tuple[str, str, str]:
    a, a_order = order_example(rng)
    while True:
        b, b_order = order_example(rng)
        if b_order != a_order:
            return a, b, "first" if a_order == "animal-first" else "second"


def topic_example(rng: random.Random) -> tuple[str, str]:
    label = rng.choice(list(CATEGORIES))
    others = [w for c, ws in CATEGORIES.items() if c != label for w in ws]
    items = rng.sample(CATEGORIES[label], 3) + [rng.choice(others)]
    rng.shuffle(items)
    return " ".join(_insert(rng, _filler(rng, 2, 6), items)), label


def distance_example(rng: random.Random) -> tuple[str, str]:
    words = _filler(rng, 6, 10)
    items = [rng.choice(ANIMALS), rng.choice(FRUITS)]
    rng.shuffle(items)
    near = rng.random() < 0.5
    gap = 1 if near else rng.randrange(4, len(words) + 1)  # j - i between the two items
    i = rng.randrange(0, len(words) + 2 - gap)
    out = list(words)
    out.insert(i, items[0])
    out.insert(i + gap, items[1])
    return " ".join(out), "near" if near else "far"


def start_example(rng: random.Random) -> tuple[str, str]:
    words = _filler(rng, 5, 9)
    first = rng.random() < 0.5
    i = 0 if first else rng.randrange(3, len(words) + 1)
    words.insert(i, rng.choice(ANIMALS))
    return " ".join(words), "start" if first else "later"


def write_builtin(root: str | Path, seed: int = 0, documents: int = 3000, train: int = 2000,
                  dev: int = 500) -> dict[str, Path]:
    """Write the corpus (`corpus/{train,valid}.txt`) and tasks (`<task>/{train,dev}.tsv`) under `root`.

    Deterministic in `seed`; returns {"corpus": dir, task: dir, ...}.
    """
    root = Path(root)
    paths = {"corpus": root / "corpus"}
    paths["corpus"].mkdir(parents=True, exist_ok=True)
    docs = corpus(seed, documents)
    cut = max(1, len(docs) // 20)  # 5% held out for validation MLM loss
    for name, part in (("train", docs[cut:]), ("valid", docs[:cut])):
        write_text_atomic(paths["corpus"] / f"{name}.txt", "\n\n".join(" ".join(d) for d in part) + "\n")
    makers = {"order": (order_example, "sentence\tlabel"),
              "pair-order": (pair_order_example, "sentence1\tsentence2\tlabel"),
              "topic": (topic_example, "sentence\tlabel"),
              "distance": (distance_example, "sentence\tlabel"),
              "start": (start_example, "sentence\tlabel")}
    for t, (name, (make, header)) in enumerate(makers.items()):
        rng = random.Random(seed * 1000 + t + 1)
        paths[name] = root / name
        paths[name].mkdir(parents=True, exist_ok=True)
        for split, n in (("train", train), ("dev", dev)):
            rows = ["\t".join(make(rng)) for _ in range(n)]
            write_text_atomic(paths[name] / f"{split}.tsv", header + "\n" + "\n".join(rows) + "\n")
    return paths
