import pytest
import torch

from dietpe import DietConfig


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def tiny(**overrides) -> DietConfig:
    """A deterministic tiny config: 2 layers, 2 heads of size 8, no dropout."""
    base = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                linformer_k=6, shaw_max_distance=3, t5_num_buckets=8, t5_max_distance=16)
    return DietConfig(**{**base, **overrides})


def batch(length=10, batch_size=2, vocab=50, pad_last=3, two_segments=True):
    ids = torch.randint(1, vocab, (batch_size, length))
    mask = torch.ones_like(ids)
    if pad_last:
        mask[-1, -pad_last:] = 0
    segments = torch.zeros_like(ids)
    if two_segments:
        segments[:, length // 2:] = 1
    return ids, mask, segments
