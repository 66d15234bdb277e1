"""Masked-LM data: full sentences packed into blocks, and BERT's 15% masking with the 80/10/10 rule.

Packing follows RoBERTa's FULL-SENTENCES (Liu et al. 2019), which the DIET paper adopts: whole sentences are
added to a block of `max_length` tokens, `[CLS] s1 s2 ... [SEP]`, crossing document boundaries with an extra
`[SEP]`; no next-sentence task, one segment. A sentence longer than a block is cut into block-sized pieces.

With `packing="documents"` several documents share a block without seeing each other: the collator gives
position ids restarting at each document and a block-diagonal `(B, 1, L, L)` attention mask.

Masking (Devlin et al. 2019, 3.1): 15% of the non-special tokens are chosen; of those 80% become `[MASK]`,
10% a random word, 10% stay. Labels are the original ids at chosen positions and -100 elsewhere. An example
carrying `example_seed` (`dietpe.tasks.seeding.EpochExamples`) is masked by its own generator over its own
length, so its mask is a pure function of that seed: independent of the batch, the padding and the global RNG.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dietpe.errors import DataError

IGNORE_INDEX = -100


PACKINGS = ("full-sentences", "documents")


def iter_blocks(documents, max_length: int, cls_id: int, sep_id: int, packing: str = "full-sentences"):
    """Blocks of tokenised sentences, streamed: yields (parts, starts), the block being the concatenation of
    `parts` (slices of the sentences, and [CLS]/[SEP] lists) and `starts` the offsets where documents begin.

    `full-sentences` (RoBERTa): `[CLS] s1 s2 [SEP] t1 ... [SEP]`, a new document after an extra [SEP].
    `documents`: each document's sentences packed the same way into `[CLS] ... [SEP]` segments, several
    segments to a block; a segment starts a document, so position ids restart and attention stays inside it.
    `stream` (not a packing of blocks): one item per document, its tokens then [SEP], for `dietpe lm`.
    Sentences are any sliceable sequences (lists, numpy arrays): the shards pack numpy slices, without copying."""
    if packing == "stream":  # causal LMs' stream (`dietpe lm`): a document's tokens then [SEP], unpacked
        for doc in documents:
            yield [*doc, [sep_id]], [0]
        return
    if max_length < 3:
        raise DataError(f"max_length={max_length} leaves no room for text between [CLS] and [SEP]")
    if packing not in PACKINGS:
        raise DataError(f"packing {packing!r}: expected one of {', '.join(PACKINGS)}")
    room = max_length - 2
    cls, sep = [cls_id], [sep_id]

    def bodies(docs):  # FULL-SENTENCES over `docs`: lists of parts of at most `room` tokens
        body, size = [], 0
        for doc in docs:
            boundary = size > 0  # a new document inside a block gets a separator before its first sentence
            for sentence in doc:
                for i in range(0, len(sentence), room):
                    piece = sentence[i:i + room]
                    if size + boundary + len(piece) > room:
                        if size:
                            yield body
                        body, size, boundary = [], 0, False
                    if boundary:
                        body.append(sep)
                        size += 1
                        boundary = False
                    body.append(piece)
                    size += len(piece)
        if size:
            yield body

    if packing == "full-sentences":
        for body in bodies(documents):
            yield [cls, *body, sep], [0]
        return
    parts, starts, size = [], [], 0
    for doc in documents:
        for body in bodies([doc]):
            n = 2 + sum(len(p) for p in body)
            if size + n > max_length:
                yield parts, starts
                parts, starts, size = [], [], 0
            starts.append(size)
            parts += [cls, *body, sep]
            size += n
    if size:
        yield parts, starts


def pack_sentences(documents: Sequence[Sequence[Sequence[int]]], max_length: int, cls_id: int,
                   sep_id: int, packing: str = "full-sentences") -> list[list[int]]:
    """Pack tokenised sentences (documents of sentences of ids) into blocks of at most `max_length` ids."""
    return [[int(t) for p in parts for t in p]
            for parts, _ in iter_blocks(documents, max_length, cls_id, sep_id, packing)]


def document_layout(starts: Sequence[Sequence[int]], lengths: Sequence[int], length: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids (B, L), attention_mask (B, 1, L, L) bool) of blocks holding several documents:
    positions restart at 0 where a document starts; a query sees the keys of its own document; padding is a
    document of its own, so no real token sees it and every query has a key."""
    b = len(lengths)
    doc = torch.full((b, length), -1, dtype=torch.long)
    positions = torch.zeros((b, length), dtype=torch.long)
    for i, (row_starts, n) in enumerate(zip(starts, lengths)):
        bounds = [*row_starts, n]
        for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            doc[i, lo:hi] = k
            positions[i, lo:hi] = torch.arange(hi - lo)
    # padding is a document of its own: real tokens never see it, and its queries still have keys (a softmax)
    mask = doc[:, :, None] == doc[:, None, :]
    return positions, mask[:, None]


def word_ids(tokenizer) -> int | torch.Tensor:
    """The ids random replacements are drawn from, every id but the special ones: the first of them where
    they run to the end of the vocabulary (BERT's layout, specials first), else all of them (a tokenizer whose
    specials sit elsewhere, such as RoBERTa's <mask> last)."""
    special = set(tokenizer.all_special_ids)
    first = max(special) + 1
    if len(special) == first:  # 0 .. first-1 special, the rest words
        return first
    words = torch.tensor([i for i in range(len(tokenizer)) if i not in special], dtype=torch.long)
    if not len(words):
        raise DataError("the tokenizer has no word ids besides its special tokens")
    return words


def mask_tokens(input_ids: torch.Tensor, special_mask: torch.Tensor, mask_id: int, first_word_id: int | torch.Tensor,
                vocab_size: int, probability: float = 0.15,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking of a `(B, L)` batch: returns (masked inputs, labels with -100 where not chosen).

    `special_mask` is True at [CLS]/[SEP]/[PAD], which are never chosen. Random replacements are drawn from
    the non-special ids: `[first_word_id, vocab_size)`, or the ids in `first_word_id` when it is a tensor
    (`word_ids`).
    """
    if not 0.0 < probability < 1.0:
        raise DataError(f"mlm probability={probability} must lie strictly between 0 and 1")
    inputs = input_ids.clone()
    labels = input_ids.clone()
    chance = torch.full(inputs.shape, probability)
    chance.masked_fill_(special_mask, 0.0)
    chosen = torch.bernoulli(chance, generator=generator).bool()
    labels[~chosen] = IGNORE_INDEX
    action = torch.rand(inputs.shape, generator=generator)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    inputs[to_mask] = mask_id
    if isinstance(first_word_id, torch.Tensor):
        pick = torch.randint(0, len(first_word_id), inputs.shape, generator=generator)
        random_words = first_word_id[pick]
    else:
        random_words = torch.randint(first_word_id, vocab_size, inputs.shape, generator=generator)
    inputs[to_random] = random_words[to_random]
    return inputs, labels


class MlmCollator:
    """Pads blocks and masks them; examples that already carry `labels` (a pre-masked validation set) are
    only padded, so every method is evaluated on the same masked positions."""

    def __init__(self, tokenizer, probability: float = 0.15, pad_to_multiple_of: int | None = None):
        self.pad_id = tokenizer.pad_token_id
        self.mask_id = tokenizer.mask_token_id
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)))
        self.first_word_id = word_ids(tokenizer)
        self.vocab_size = len(tokenizer)
        self.probability = probability
        self.pad_to_multiple_of = pad_to_multiple_of

    def pad(self, sequences: list[list[int]], value: int) -> torch.Tensor:
        length = max(len(s) for s in sequences)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        out = torch.full((len(sequences), length), value, dtype=torch.long)
        for i, s in enumerate(sequences):
            out[i, :len(s)] = torch.as_tensor(s, dtype=torch.long)
        return out

    def __call__(self, features: list[dict], generator: torch.Generator | None = None) -> dict:
        ids = self.pad([f["input_ids"] for f in features], self.pad_id)
        attention_mask = self.pad([[1] * len(f["input_ids"]) for f in features], 0)
        batch = {"input_ids": ids, "attention_mask": attention_mask,
                 "token_type_ids": torch.zeros_like(ids)}
        if "doc_starts" in features[0]:  # --packing documents: no attention across documents
            batch["position_ids"], batch["attention_mask"] = document_layout(
                [f["doc_starts"] for f in features], [len(f["input_ids"]) for f in features], ids.shape[1])
        if "labels" in features[0]:
            batch["labels"] = self.pad([f["labels"] for f in features], IGNORE_INDEX)
        elif "example_seed" in features[0]:
            labels = torch.full_like(ids, IGNORE_INDEX)
            for i, f in enumerate(features):
                n = len(f["input_ids"])
                row = ids[i:i + 1, :n]
                g = torch.Generator().manual_seed(int(f["example_seed"]))
                masked, row_labels = mask_tokens(row, torch.isin(row, self.special_ids), self.mask_id,
                                                 self.first_word_id, self.vocab_size, self.probability, g)
                ids[i, :n], labels[i, :n] = masked[0], row_labels[0]
            batch["input_ids"], batch["labels"] = ids, labels
        else:
            special = torch.isin(ids, self.special_ids)
            batch["input_ids"], batch["labels"] = mask_tokens(
                ids, special, self.mask_id, self.first_word_id, self.vocab_size, self.probability, generator)
        if batch["attention_mask"].dim() == 2 and bool(batch["attention_mask"].all()):
            # nothing padded, seen here on the host: no mask lets SDPA take flash on a GPU (no mask = attend all)
            del batch["attention_mask"]
        return batch

    def premask(self, blocks, seed: int) -> list[dict]:
        """Mask `blocks` (lists of ids, or examples with `input_ids` and maybe `doc_starts`) once with a fixed
        seed: a validation set that is the same for every model."""
        generator = torch.Generator().manual_seed(seed)
        out = []
        for block in blocks:
            feature = dict(block) if isinstance(block, dict) else {"input_ids": block}
            batch = self([{"input_ids": feature["input_ids"]}], generator=generator)
            feature.update(input_ids=batch["input_ids"][0].tolist(), labels=batch["labels"][0].tolist())
            out.append(feature)
        return out
