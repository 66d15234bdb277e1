"""The training order reaches the sampler however the data loader is wrapped: a resumed epoch (accelerate's
skip of its first batches) around several processes' shards draws that epoch's order, not the first's."""

import torch
from accelerate import skip_first_batches
from accelerate.data_loader import prepare_data_loader
from transformers import Trainer

from dietpe.tasks.seeding import SeededSampler, SeededTrainer


def _shard(sampler: SeededSampler, process: int, skip: int):
    """Process `process` of 2's loader, as Trainer builds it under torchrun, resumed after `skip` batches."""
    loader = torch.utils.data.DataLoader(list(range(100)), sampler=sampler, batch_size=2)
    loader = prepare_data_loader(loader, num_processes=2, process_index=process, put_on_device=False)
    return skip_first_batches(loader, skip) if skip else loader


def _epoch_order(epoch: int, process: int, skip: int) -> list[int]:
    """What an uninterrupted run's process draws in `epoch` after its first `skip` batches."""
    loader = _shard(SeededSampler(10, seed=3, tag_epoch=True), process, 0)
    loader.set_epoch(epoch)  # as Trainer does; unskipped, accelerate forwards it to the sampler
    batches = [b.tolist() for b in loader]
    return [i for b in batches[skip:] for i in b]


def test_a_resumed_epoch_over_two_processes_draws_its_own_order(monkeypatch):
    drawn = {}

    def run_epoch(self, model, epoch, train_dataloader, *rest):  # Trainer's epoch loop, as far as the data goes
        train_dataloader.set_epoch(epoch)
        drawn[epoch] = [i for b in train_dataloader for i in b.tolist()]

    monkeypatch.setattr(Trainer, "_run_epoch", run_epoch)
    trainer = SeededTrainer.__new__(SeededTrainer)  # no model or arguments: only the epoch loop's hook runs
    trainer._seeded = SeededSampler(10, seed=3, tag_epoch=True)
    for process in (0, 1):
        loader = _shard(trainer._seeded, process, skip=1)
        trainer._run_epoch(None, 2, loader, 5, 5, None, None, 0.0, "checkpoint-7", 2, 1)
        assert drawn[2] == _epoch_order(2, process, skip=1)
        assert all(20 <= i < 30 for i in drawn[2])  # epoch 2's tagged indices, where epoch 0's were drawn
