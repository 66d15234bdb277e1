"""A deterministic subword trainer: the merges of BPE (Sennrich et al. 2016) as `tokenizers`' BpeTrainer and
WordPieceTrainer make them, as a pure function of the word counts.

`tokenizers`' trainers are not deterministic: the ids of the `##c` continuation symbols follow a hash map's
iteration order, and ties between pairs of equal count are broken by those ids, so two trainings on the same
text give different vocabularies (58-71 of 1,000 ids differed on wikitext-2). Here every order is defined:

* words are counted after the tokenizer's own normalizer and pre-tokenizer (`tokenizers`, deterministic);
* the vocabulary starts with the special tokens, then the alphabet sorted by code point, then (WordPiece) the
  continuation symbols `prefix + c` sorted by code point;
* each step merges the most frequent adjacent pair; ties go to the pair whose (left, right) strings sort first;
  the merged symbol is `left + right` without `right`'s continuation prefix;
* training stops at `vocab_size` distinct symbols or when the best pair occurs fewer than `min_frequency` times.

Pair counts are updated incrementally (only the words holding the merged pair are touched) and the best pair
comes from a lazy max-heap, so wikitext-2's 2M words train in seconds.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping

# The tokenizer types `dietpe pretrain --tokenizer-type` learns (`dietpe.data.tokenizer`), and the largest
# vocabulary: the DIET paper's multilingual SentencePiece model (appendix A, "120,000 token vocabulary").
TOKENIZER_TYPES = ("wordpiece", "unigram", "bpe")
MAX_VOCAB_SIZE = 120_000


def count_words(texts: Iterable[str], normalizer, pre_tokenizer) -> Counter:
    """Word counts of `texts` after a `tokenizers` normalizer and pre-tokenizer (either may be None)."""
    counts: Counter = Counter()
    for text in texts:
        if normalizer is not None:
            text = normalizer.normalize_str(text)
        if pre_tokenizer is not None:
            counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(text))
        else:
            counts[text] += 1
    return counts


def learn_subwords(word_counts: Mapping[str, int], vocab_size: int, special_tokens: Iterable[str] = (),
                   min_frequency: int = 2, prefix: str = "") -> tuple[list[str], list[tuple[str, str]]]:
    """(vocabulary in id order, merges in rank order) learned from `word_counts`.

    `prefix` is WordPiece's continuation marker (`##`): a word is split into `w[0], ##w[1], ...` and a merged
    symbol keeps only the left part's prefix. With `prefix=""` this is plain BPE."""
    tokens: list[str] = []
    ids: dict[str, int] = {}

    def add(token: str) -> int:
        if token not in ids:
            ids[token] = len(tokens)
            tokens.append(token)
        return ids[token]

    for t in special_tokens:
        add(t)
    words = sorted((w, n) for w, n in word_counts.items() if w and n > 0)
    for c in sorted({c for w, _ in words for c in w}):
        add(c)
    if prefix:
        for c in sorted({c for w, _ in words for c in w[1:]}):
            add(prefix + c)
    seqs = [[ids[w[0]]] + [ids[prefix + c] for c in w[1:]] for w, _ in words]
    counts = [n for _, n in words]

    pair_count: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}
    for i, seq in enumerate(seqs):
        n = counts[i]
        for pair in zip(seq, seq[1:]):
            pair_count[pair] = pair_count.get(pair, 0) + n
            where.setdefault(pair, set()).add(i)
    heap = [(-c, tokens[a], tokens[b], a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)

    merges: list[tuple[str, str]] = []
    cut = len(prefix)
    while heap and len(tokens) < vocab_size:
        neg, left, right, a, b = heapq.heappop(heap)
        current = pair_count.get((a, b), 0)
        if current != -neg:  # stale: the count fell since this entry was pushed
            if current > 0:
                heapq.heappush(heap, (-current, left, right, a, b))
            continue
        if current < min_frequency:
            break
        new = add(left + (right[cut:] if cut and right.startswith(prefix) else right))
        merges.append((left, right))
        touched: set[tuple[int, int]] = set()
        for i in sorted(where.pop((a, b), ())):
            seq, n = seqs[i], counts[i]
            merged, j = [], 0
            while j < len(seq):
                if j + 1 < len(seq) and seq[j] == a and seq[j + 1] == b:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(seq[j])
                    j += 1
            if len(merged) == len(seq):
                continue
            for pair in zip(seq, seq[1:]):
                pair_count[pair] -= n
            for pair in zip(merged, merged[1:]):
                pair_count[pair] = pair_count.get(pair, 0) + n
                where.setdefault(pair, set()).add(i)
                touched.add(pair)
            seqs[i] = merged
        pair_count.pop((a, b), None)
        for pair in sorted(touched):  # counts that rose need a fresh entry; fallen ones are caught when popped
            c = pair_count.get(pair, 0)
            if c > 0:
                heapq.heappush(heap, (-c, tokens[pair[0]], tokens[pair[1]], pair[0], pair[1]))
    return tokens, merges
