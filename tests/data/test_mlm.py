"""Packing of full sentences and BERT's 80/10/10 masking."""

import pytest
import torch

from dietpe.data.mlm import IGNORE_INDEX, MlmCollator, mask_tokens, pack_sentences
from dietpe.errors import DataError

CLS, SEP = 2, 3


def test_packing_keeps_whole_sentences_in_order_and_respects_the_length():
    docs = [[[10, 11, 12], [13, 14]], [[20, 21, 22, 23]], [[30] * 3]]
    blocks = pack_sentences(docs, max_length=8, cls_id=CLS, sep_id=SEP)
    assert all(len(b) <= 8 and b[0] == CLS and b[-1] == SEP for b in blocks)
    # sentence [13, 14] fits after [10, 11, 12]; the next document needs a separator and 4 more: new block
    assert blocks[0] == [CLS, 10, 11, 12, 13, 14, SEP]
    assert blocks[1] == [CLS, 20, 21, 22, 23, SEP, 30, 30, 30, SEP][:len(blocks[1])]
    body = [t for b in blocks for t in b[1:-1] if t != SEP]
    assert body == [10, 11, 12, 13, 14, 20, 21, 22, 23, 30, 30, 30]


def test_packing_marks_a_document_boundary_inside_a_block():
    blocks = pack_sentences([[[5]], [[6]]], max_length=10, cls_id=CLS, sep_id=SEP)
    assert blocks == [[CLS, 5, SEP, 6, SEP]]


def test_packing_cuts_a_sentence_longer_than_a_block():
    blocks = pack_sentences([[list(range(10, 25))]], max_length=6, cls_id=CLS, sep_id=SEP)
    assert [len(b) for b in blocks] == [6, 6, 6, 5]
    assert [t for b in blocks for t in b[1:-1]] == list(range(10, 25))


def test_packing_refuses_a_length_without_room():
    with pytest.raises(DataError, match="max_length=2"):
        pack_sentences([[[5]]], max_length=2, cls_id=CLS, sep_id=SEP)


def test_masking_follows_15_percent_and_80_10_10():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 1000, (400, 250), generator=g)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    inputs, labels = mask_tokens(ids, special, mask_id=4, first_word_id=5, vocab_size=1000, generator=g)
    chosen = labels != IGNORE_INDEX
    assert not chosen[special].any()
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])
    rate = chosen.float().sum() / (~special).float().sum()
    assert abs(rate - 0.15) < 0.005
    masked = (inputs == 4) & chosen
    same = (inputs == ids) & chosen
    random = chosen & ~masked & ~same
    n = chosen.sum().float()
    assert abs(masked.sum() / n - 0.8) < 0.01
    assert abs(same.sum() / n - 0.1) < 0.01  # a random draw equal to the original counts here: 1 in 995
    assert abs(random.sum() / n - 0.1) < 0.01
    assert (inputs[random] >= 5).all()  # random words are never special tokens


class _Tok:
    pad_token_id, mask_token_id, all_special_ids = 0, 4, [0, 1, 2, 3, 4]

    def __len__(self):
        return 100


def test_collator_pads_and_masks_only_real_tokens():
    collate = MlmCollator(_Tok())
    batch = collate([{"input_ids": [2] + [50] * 40 + [3]}, {"input_ids": [2, 60, 3]}])
    assert batch["input_ids"].shape == (2, 42)
    assert batch["attention_mask"][1].tolist() == [1, 1, 1] + [0] * 39
    assert (batch["labels"][1, 3:] == IGNORE_INDEX).all()
    assert (batch["labels"][:, 0] == IGNORE_INDEX).all()


def test_premasked_validation_is_reproducible_and_kept_by_the_collator():
    collate = MlmCollator(_Tok())
    blocks = [[2] + list(range(10, 60)) + [3] for _ in range(8)]
    a, b = collate.premask(blocks, seed=7), collate.premask(blocks, seed=7)
    assert a == b
    assert a != collate.premask(blocks, seed=8)
    batch = collate(a[:2])
    assert batch["labels"][0].tolist() == a[0]["labels"]  # already masked: only padded


def test_an_example_seed_fixes_the_mask_whatever_the_batch_padding_and_global_rng():
    """Masks from `example_seed` (dietpe.tasks.seeding.EpochExamples) are a pure function of that seed, so a
    resumed run masks each example as the uninterrupted run did."""
    from dietpe.tasks.seeding import EpochExamples

    collate = MlmCollator(_Tok())
    data = EpochExamples([{"input_ids": [CLS] + list(range(10, 10 + n)) + [SEP]} for n in (30, 5, 60)], seed=7)
    alone = collate([data[3 + 0]])  # epoch 1, example 0
    torch.manual_seed(123)
    batch = collate([data[3 + 2], data[3 + 0]])  # padded to 62 now, other neighbour, other global RNG
    n = len(data[0]["input_ids"])
    assert torch.equal(batch["input_ids"][1, :n], alone["input_ids"][0])
    assert torch.equal(batch["labels"][1, :n], alone["labels"][0])
    assert (batch["labels"][1, n:] == IGNORE_INDEX).all()
    other_epoch = collate([data[0]])
    assert data[0]["example_seed"] != data[3]["example_seed"]
    assert not torch.equal(other_epoch["labels"], alone["labels"])  # a new mask every epoch


def test_random_words_skip_special_tokens_wherever_they_sit():
    """A tokenizer whose <mask> is its last id (RoBERTa's layout): random replacements come from the word ids
    between the specials, not from an empty range past the last one."""
    from dietpe.data.mlm import word_ids

    class Tok:  # ids 0-3 special, 4-9 words, 10 <mask>
        all_special_ids = [0, 1, 2, 3, 10]

        def __len__(self):
            return 11

    words = word_ids(Tok())
    assert words.tolist() == [4, 5, 6, 7, 8, 9]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 10, (200, 50), generator=g)
    inputs, labels = mask_tokens(ids, torch.zeros_like(ids, dtype=torch.bool), mask_id=10, first_word_id=words,
                                 vocab_size=11, generator=g)
    replaced = (labels != IGNORE_INDEX) & (inputs != 10)
    assert replaced.any() and ((inputs[replaced] >= 4) & (inputs[replaced] <= 9)).all()

    class Bert(Tok):  # specials first: the contiguous range, drawn as before
        all_special_ids = [0, 1, 2, 3, 4]

    assert word_ids(Bert()) == 5
