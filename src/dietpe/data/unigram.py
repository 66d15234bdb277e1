"""A deterministic Unigram-LM vocabulary trainer (Kudo 2018; SentencePiece's `unigram_model_trainer`), a pure
function of word counts, so that words counted in streamed chunks (and summed) give the same vocabulary.

`tokenizers`' UnigramTrainer follows the same algorithm but is not deterministic: it walks a hash map of the
words, whose order changes from process to process, and ties and floating-point sums follow that order (three
trainings on the same XNLI text gave three different `tokenizer.json`). Here every order is defined:

1. **Characters.** The most frequent characters covering `character_coverage` of all character occurrences
   are required (SentencePiece's default 0.9995); rarer ones become an unknown symbol in training, and
   pieces never hold them.
2. **Seed.** Every substring of 2 to `max_piece_length` characters of the words (SentencePiece enumerates the
   repeated substrings with a suffix array; here, every substring seen at least twice, words weighted by
   their counts), scored frequency x length; the best `seed_size` beside the characters, ties by first
   appearance in the sorted words. `▁` (the word-start marker) may only begin a piece. Scores are
   log-probabilities.
3. **EM** (`sub_iterations` per round): the E-step takes expected piece counts over all segmentations of
   each word (forward-backward on its lattice); the M-step drops pieces expected fewer than 0.5 times
   (required characters stay) and sets log p = digamma(count) - digamma(total), SentencePiece's Bayesian
   update.
4. **Pruning** until `1.1 x vocab_size` pieces remain: each piece's loss is the drop in likelihood if its
   Viterbi uses were re-segmented by its best alternative segmentation; the `shrinking_factor` (0.75) of
   pieces with the largest loss are kept, along with pieces without an alternative.
5. **Final**: the required characters, then the best-scoring pieces, up to `vocab_size`.

Lattices are computed for all words at once with numpy (edges grouped by where they end), so EM over the
words of the 15 XNLI languages takes seconds; loops in Python run over word positions, not words.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

import numpy as np

from dietpe.errors import DataError

WORD_START = "▁"
UNKNOWN = "⁇"          # stands for a rare character in training (SentencePiece's kUNKChar)
UNK_PENALTY = 10.0     # an unknown character scores min_score - 10, as SentencePiece's lattice does
MIN_EXPECTED = 0.5     # the M-step drops pieces expected fewer times


def digamma(x: np.ndarray) -> np.ndarray:
    """SentencePiece's digamma: the recurrence up to 7, then the asymptotic series."""
    x = np.asarray(x, dtype=np.float64).copy()
    result = np.zeros_like(x)
    small = x < 7
    while small.any():
        result[small] -= 1 / x[small]
        x[small] += 1
        small = x < 7
    x = x - 0.5
    xx = 1 / x
    xx2 = xx * xx
    xx4 = xx2 * xx2
    return (result + np.log(x) + xx2 / 24 - 7 / 960 * xx4 + 31 / 8064 * xx4 * xx2
            - 127 / 30720 * xx4 * xx4)


def valid_piece(piece: str) -> bool:
    return UNKNOWN not in piece and WORD_START not in piece[1:]


class Spans:
    """Every substring of 1..`max_len` characters of every word, enumerated once: `strings` (the distinct
    substrings, in order of first appearance) and, per occurrence, its string's index and where it lies
    (global node numbers: word k's positions are nodes first[k] .. last[k])."""

    def __init__(self, words: list[str], max_len: int):
        sizes = np.array([len(w) for w in words], dtype=np.int64)
        self.first = np.r_[0, np.cumsum(sizes + 1)[:-1]].astype(np.int64)
        self.last = self.first + sizes
        ids: dict[str, int] = {}
        templates: dict[int, tuple] = {}
        subs, starts, ends, counts = [], [], [], []
        for w, offset in zip(words, self.first.tolist()):
            n = len(w)
            if n not in templates:
                pairs = [(i, j) for i in range(n) for j in range(i + 1, min(n, i + max_len) + 1)]
                templates[n] = (pairs, np.array([i for i, _ in pairs], dtype=np.int64),
                                np.array([j for _, j in pairs], dtype=np.int64))
            pairs, i_arr, j_arr = templates[n]
            subs.append(np.fromiter((ids.setdefault(w[i:j], len(ids)) for i, j in pairs), dtype=np.int64,
                                    count=len(pairs)))
            starts.append(i_arr + offset)
            ends.append(j_arr + offset)
            counts.append(len(pairs))
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64))
        self.strings, self.index = list(ids), ids
        self.sub, self.start, self.end = cat(subs), cat(starts), cat(ends)
        self.word = np.repeat(np.arange(len(words)), counts)


class Lattices:
    """Every word's lattice at once: edges (start node, end node, piece) over global node numbers, word k's
    positions being nodes first[k] .. last[k]. Piece -1 is an unknown character."""

    def __init__(self, spans: Spans, piece_of: np.ndarray, drop_whole: bool = False):
        """The spans that are pieces (`piece_of[string index]`, -1 when not), and an unknown-character edge for
        every single character that is not; `drop_whole`: without each word's edge spanning all of it."""
        piece = piece_of[spans.sub]
        single = spans.end - spans.start == 1
        ok = (piece >= 0) | single
        if drop_whole:
            ok &= ~((spans.start == spans.first[spans.word]) & (spans.end == spans.last[spans.word]) & ~single)
            # a one-character word keeps no edge of its own: an unknown edge stands for it
            piece = np.where(single & (spans.last[spans.word] - spans.first[spans.word] == 1), -1, piece)
        self.first, self.last = spans.first, spans.last
        self.nodes = int(self.last[-1]) + 1 if len(self.last) else 0
        self.start, self.end, self.piece, self.word = spans.start[ok], spans.end[ok], piece[ok], spans.word[ok]
        self.local_end = self.end - self.first[self.word]
        self.local_start = self.start - self.first[self.word]
        # the edges by (end position, end node) and by (start position, start node): sorted once, then
        # filtered in step with `keep`
        self.order = {True: np.lexsort((self.end, self.local_end)), False: np.lexsort((self.start, self.local_start))}
        self._cache = {}

    @classmethod
    def of(cls, words: list[str], ids: Mapping[str, int], max_len: int, drop_whole: bool = False) -> Lattices:
        spans = Spans(words, max_len)
        piece_of = np.array([ids.get(x, -1) for x in spans.strings], dtype=np.int64)
        return cls(spans, piece_of, drop_whole)

    def keep(self, alive: np.ndarray) -> None:
        """Drop the edges of pieces no longer in the vocabulary (unknown characters stay)."""
        ok = (self.piece < 0) | alive[np.maximum(self.piece, 0)]
        if ok.all() and alive.all():
            return
        for name in ("start", "end", "piece", "local_end", "local_start", "word"):
            setattr(self, name, getattr(self, name)[ok])
        self.piece = np.where(self.piece >= 0, np.cumsum(alive)[np.maximum(self.piece, 0)] - 1, -1)
        remap = np.cumsum(ok) - 1
        self.order = {k: remap[order[ok[order]]] for k, order in self.order.items()}
        self._cache = {}

    def _groups(self, forward: bool) -> list:
        """Forward: per end position ascending, the edges ending there sorted by end node, and the boundaries
        of each node's run; backward: the same by start position, descending. Kept until `keep`."""
        if forward not in self._cache:
            by, node = (self.local_end, self.end) if forward else (self.local_start, self.start)
            self._cache[forward] = list(self._group(by, node, self.order[forward], not forward))
        return self._cache[forward]

    @staticmethod
    def _group(by: np.ndarray, node: np.ndarray, order: np.ndarray, reverse: bool):
        b, nd = by[order], node[order]
        new_pos = np.r_[True, b[1:] != b[:-1]]
        groups = np.r_[np.flatnonzero(new_pos), len(b)]
        runs = np.flatnonzero(new_pos | np.r_[True, nd[1:] != nd[:-1]])
        cuts = np.searchsorted(runs, groups)
        spans = [(groups[g], groups[g + 1], runs[cuts[g]:cuts[g + 1]]) for g in range(len(groups) - 1)]
        for lo, hi, run in (spans[::-1] if reverse else spans):
            yield order[lo:hi], nd[run], run - lo

    def forward_backward(self, scores: np.ndarray, unk: float):
        """(log Z per word, marginal probability per edge)."""
        s = np.where(self.piece >= 0, scores[np.maximum(self.piece, 0)], unk)
        alpha = np.full(self.nodes, -np.inf)
        alpha[self.first] = 0.0
        for idx, nodes, bounds in self._groups(True):
            alpha[nodes] = _logsumexp_runs(alpha[self.start[idx]] + s[idx], bounds)
        beta = np.full(self.nodes, -np.inf)
        beta[self.last] = 0.0
        for idx, nodes, bounds in self._groups(False):
            beta[nodes] = _logsumexp_runs(beta[self.end[idx]] + s[idx], bounds)
        z = alpha[self.last]
        node_z = np.repeat(z, self.last - self.first + 1)
        marginal = np.exp(alpha[self.start] + s + beta[self.end] - node_z[self.start])
        return z, marginal

    def viterbi(self, scores: np.ndarray, unk: float):
        """(best score per word, the pieces of each word's best path as (word, piece) arrays)."""
        s = np.where(self.piece >= 0, scores[np.maximum(self.piece, 0)], unk)
        best = np.full(self.nodes, -np.inf)
        best[self.first] = 0.0
        back = np.full(self.nodes, -1, dtype=np.int64)
        for idx, nodes, bounds in self._groups(True):
            vals = best[self.start[idx]] + s[idx]
            top = np.maximum.reduceat(vals, bounds)
            # the first edge reaching each run's maximum: deterministic ties
            where = np.where(vals == np.repeat(top, np.diff(np.r_[bounds, len(vals)])),
                             np.arange(len(vals)), len(vals))
            best[nodes], back[nodes] = top, idx[np.minimum.reduceat(where, bounds)]
        words, pieces = [], []
        current = self.last.copy()
        active = np.flatnonzero((current > self.first) & (back[current] >= 0))
        while len(active):
            edge = back[current[active]]
            words.append(active)
            pieces.append(self.piece[edge])
            current[active] = self.start[edge]
            active = active[current[active] > self.first[active]]
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64))
        return best[self.last], cat(words), cat(pieces)


def _logsumexp_runs(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    top = np.maximum.reduceat(values, bounds)
    safe = np.where(np.isfinite(top), top, 0.0)
    lengths = np.diff(np.r_[bounds, len(values)])
    total = np.add.reduceat(np.exp(values - np.repeat(safe, lengths)), bounds)
    with np.errstate(divide="ignore"):
        return np.log(total) + safe


def required_characters(word_counts: Mapping[str, int], coverage: float) -> list[tuple[str, int]]:
    """The characters (with counts) that cover `coverage` of all character occurrences, most frequent first."""
    chars: Counter = Counter()
    for w, n in word_counts.items():
        for c in w:
            chars[c] += n
    ranked = sorted(chars.items(), key=lambda cn: (-cn[1], cn[0]))
    total, seen, kept = sum(chars.values()), 0, []
    for c, n in ranked:
        if kept and seen / total >= coverage:
            break
        kept.append((c, n))
        seen += n
    return kept


def seed_pieces(spans: Spans, counts: np.ndarray, chars: list[tuple[str, int]], seed_size: int):
    """The characters, then the substrings of 2..max_len characters seen at least twice, by frequency x length
    (ties: first appearance in the sorted words); as (pieces with log-probability scores, piece index per
    distinct substring or -1)."""
    freq = np.bincount(spans.sub, weights=counts[spans.word], minlength=len(spans.strings))
    length = np.fromiter(map(len, spans.strings), dtype=np.int64, count=len(spans.strings))
    candidate = np.flatnonzero((length >= 2) & (freq >= 2))
    candidate = candidate[[valid_piece(spans.strings[k]) for k in candidate.tolist()]]
    score = freq[candidate] * length[candidate]
    chosen = candidate[np.lexsort((candidate, -score))][:max(0, seed_size - len(chars))]
    index = spans.index
    piece_of = np.full(len(spans.strings), -1, dtype=np.int64)
    pieces = []
    for c, n in chars:
        if c in index:
            piece_of[index[c]] = len(pieces)
        pieces.append((c, float(n)))
    for k in chosen.tolist():
        piece_of[k] = len(pieces)
        pieces.append((spans.strings[k], float(freq[k] * length[k])))
    total = math.log(sum(s for _, s in pieces))
    return [(p, math.log(s) - total) for p, s in pieces], piece_of


def learn_unigram(word_counts: Mapping[str, int], vocab_size: int, *, max_piece_length: int = 16,
                  seed_size: int = 1_000_000, shrinking_factor: float = 0.75, sub_iterations: int = 2,
                  character_coverage: float = 0.9995, log=None) -> list[tuple[str, float]]:
    """`vocab_size` pieces with their log-probabilities, best first, from word counts (words as the
    pre-tokenizer gives them, `▁` marking a word's start)."""
    if not 0 < character_coverage <= 1:
        raise DataError(f"character_coverage={character_coverage} must lie in (0, 1]")
    counted = {w: n for w, n in word_counts.items() if w and n > 0}
    if not counted:
        raise DataError("the tokenizer learned no words: the training text is empty")
    chars = required_characters(counted, character_coverage)
    if len(chars) > vocab_size:
        raise DataError(f"vocab_size={vocab_size} is smaller than the {len(chars)} characters needed to cover "
                        f"{character_coverage:g} of the text; raise the vocabulary size")
    known = {c for c, _ in chars}
    merged: Counter = Counter()
    for w, n in counted.items():
        merged["".join(c if c in known else UNKNOWN for c in w)] += n
    words = sorted(merged.items())
    counts = np.array([n for _, n in words], dtype=np.float64)
    spans = Spans([w for w, _ in words], max_piece_length)
    pieces, piece_of = seed_pieces(spans, counts, chars, seed_size)
    model = _Model(pieces, len(chars), Lattices(spans, piece_of), counts, max_piece_length)
    del spans
    desired = vocab_size * 11 // 10
    while True:
        for _ in range(sub_iterations):
            model.em_step()
        if log:
            log(f"unigram: {len(model.names):,} pieces")
        if len(model.names) <= desired:
            break
        model.drop(model.prune(desired, shrinking_factor))
    return finalize(model.names, model.scores, model.required, vocab_size)


class _Model:
    """The pieces being trained, their scores, and the lattices of the words (`lattices`) and of the pieces
    themselves without their own edge (`own`, for the alternatives of pruning), kept in step."""

    def __init__(self, pieces: list[tuple[str, float]], n_chars: int, lattices: Lattices, counts: np.ndarray,
                 max_len: int):
        self.names = [p for p, _ in pieces]
        self.scores = np.array([s for _, s in pieces])
        self.required = np.arange(len(pieces)) < n_chars
        self.max_len = max_len
        self.counts = counts
        self.lattices = lattices
        self.own = None   # built at the first pruning; its words stay, its edges follow `drop`
        self.origin = None  # piece -> its word in `own`

    def ids(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.names)}

    def drop(self, alive: np.ndarray) -> None:
        self.names = [p for p, a in zip(self.names, alive) if a]
        self.scores, self.required = self.scores[alive], self.required[alive]
        self.lattices.keep(alive)
        if self.own is not None:
            self.own.keep(alive)
            self.origin = self.origin[alive]

    def em_step(self) -> None:
        """E-step (expected counts by forward-backward) and M-step (SentencePiece's digamma update)."""
        lat = self.lattices
        _, marginal = lat.forward_backward(self.scores, self.scores.min() - UNK_PENALTY)
        known = lat.piece >= 0
        expected = np.bincount(lat.piece[known], weights=(marginal * self.counts[lat.word])[known],
                               minlength=len(self.names))
        alive = (expected >= MIN_EXPECTED) | self.required
        expected = np.maximum(expected, MIN_EXPECTED)  # a required character expected less keeps a score
        self.scores = digamma(expected) - digamma(expected[alive].sum())
        self.drop(alive)

    def prune(self, desired: int, shrinking: float) -> np.ndarray:
        """Which pieces survive a pruning round (SentencePiece's PruneSentencePieces)."""
        n = len(self.names)
        unk = self.scores.min() - UNK_PENALTY
        if self.own is None:
            self.own = Lattices.of(self.names, self.ids(), self.max_len, drop_whole=True)
            self.origin = np.arange(n)
        # each piece's best segmentation without itself: what replaces it if it is removed
        alt_score, alt_word, alt_piece = self.own.viterbi(self.scores, unk)
        alt_score = alt_score[self.origin]
        where = np.full(len(self.own.first), -1)
        where[self.origin] = np.arange(n)
        alternatives = [[] for _ in range(n)]
        for w, p in zip(where[alt_word].tolist(), alt_piece.tolist()):
            if w >= 0:
                alternatives[w].append(p)
        single = np.array([len(p) == 1 for p in self.names])
        removable = ~single & (alt_score > self.scores)  # its best segmentation is not itself
        _, word, piece = self.lattices.viterbi(self.scores, unk)
        known = piece >= 0
        freq = np.bincount(piece[known], weights=self.counts[word[known]], minlength=n)
        vsum, total = self.counts.sum(), freq.sum()
        keep = self.required | single  # no alternative: kept
        candidates = []
        for i in np.flatnonzero(~keep & ~removable & (freq > 0)).tolist():  # others: never on a Viterbi path
            alt = alternatives[i]
            logprob_sp = math.log(freq[i]) - math.log(total)
            logsum_alt = math.log(total + freq[i] * (len(alt) - 1))
            logprob_alt = sum(math.log(freq[a] + freq[i]) - logsum_alt for a in alt)
            candidates.append((-(freq[i] / vsum) * (logprob_sp - logprob_alt), i))
        room = max(desired, int(n * shrinking)) - int(keep.sum())
        for _, i in sorted(candidates)[:max(0, room)]:
            keep[i] = True
        return keep


def finalize(names, scores, required, vocab_size) -> list[tuple[str, float]]:
    """The required characters, then the best pieces, up to `vocab_size`; best score first, ties by string."""
    final: dict[str, float] = {}
    for i in np.flatnonzero(required):
        final[names[i]] = float(scores[i])
    for i in sorted(range(len(names)), key=lambda i: (-scores[i], names[i])):
        if len(final) >= vocab_size:
            break
        final.setdefault(names[i], float(scores[i]))
    return sorted(final.items(), key=lambda ps: (-ps[1], ps[0]))
