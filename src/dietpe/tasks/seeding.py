"""Runs as pure functions of their settings and seed, so that a resumed run ends bit-identical to an
uninterrupted one.

Data order comes from `SeededSampler` (a permutation seeded by (seed, epoch), not the global RNG), MLM masks
from per-example seeds (seed, epoch, index) (`EpochExamples`), so the only consumer of the global RNG is
dropout, whose state `Trainer` saves in each checkpoint and restores.
"""

from __future__ import annotations

import inspect

import torch
from transformers import Trainer

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (SplitMix64 steps): a pure function, unlike Python's `hash`."""
    x = 0x9E3779B97F4A7C15
    for part in parts:
        x = (x ^ (int(part) & _MASK64)) & _MASK64
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x >> 1


class EpochExamples(torch.utils.data.Dataset):
    """A training set whose items carry `example_seed`, a pure function of (seed, epoch, index).

    `SeededSampler` yields `epoch * len + index` for such a dataset, so the seed of an example's MLM mask is
    known from the index alone: it does not depend on the global RNG, on what ran before, or on a resume."""

    def __init__(self, items: list[dict], seed: int):
        self.items, self.seed = items, seed

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        epoch, index = divmod(int(i), len(self.items))
        return {**self.items[index], "example_seed": mix_seed(self.seed, epoch, index)}


class SeededSampler(torch.utils.data.Sampler):
    """Training order as a pure function of (seed, epoch): a permutation from a generator seeded by both, or
    with `lengths` the length grouping of `Trainer`'s `group_by_length` (mega-batches sorted by length).

    `SeededTrainer` sets the epoch before each epoch itself: `Trainer`'s `set_epoch` goes through accelerate's
    wrappers, which do not reach a sampler three deep (a resumed epoch's skip around several processes'
    shards), so the order of the resumed epoch is the order the uninterrupted run had."""

    def __init__(self, size: int, seed: int, lengths: list[int] | None = None, batch_size: int = 1,
                 tag_epoch: bool = False):
        self.size, self.seed, self.lengths, self.batch_size, self.tag_epoch = size, seed, lengths, batch_size, tag_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self):
        return self.size

    def __iter__(self):
        generator = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch))
        if self.lengths is not None:
            from transformers.trainer_pt_utils import get_length_grouped_indices
            order = get_length_grouped_indices(self.lengths, self.batch_size, generator=generator)
        else:
            order = torch.randperm(self.size, generator=generator)
        offset = self.epoch * self.size if self.tag_epoch else 0
        if isinstance(order, torch.Tensor):  # a tensor, read in pieces: no Python int per block of a large corpus
            return (offset + i for piece in order.split(1 << 16) for i in piece.tolist())
        return iter([offset + int(i) for i in order])


class SeededTrainer(Trainer):
    """`Trainer` whose training order is a `SeededSampler` seeded with `data_seed` (else `seed`), told each
    epoch's number before the epoch's batches are drawn."""

    _seeded: SeededSampler | None = None

    def _get_train_sampler(self, train_dataset=None):
        dataset = self.train_dataset if train_dataset is None else train_dataset
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        lengths = None
        if self.args.train_sampling_strategy == "group_by_length":
            lengths = [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
        self._seeded = SeededSampler(len(dataset), seed, lengths,
                                     self.args.train_batch_size * self.args.gradient_accumulation_steps,
                                     tag_epoch=isinstance(dataset, EpochExamples))
        return self._seeded

    def _run_epoch(self, *args, **kwargs):
        if self._seeded is not None:
            self._seeded.set_epoch(_RUN_EPOCH.bind(self, *args, **kwargs).arguments["epoch"])
        return super()._run_epoch(*args, **kwargs)


# the epoch loop's signature (transformers 5), read once: its `epoch` is the number the sampler needs
_RUN_EPOCH = inspect.signature(Trainer._run_epoch)
