"""A nanoGPT-size character model (Karpathy's nanoGPT layout: pre-norm blocks, causal self-attention, GELU MLP)
whose attention takes its positions from one of diet's methods through `dietpe.Positions`.

    python examples/nanogpt.py --method diet-rel --steps 200
    python examples/nanogpt.py --method alibi --text my.txt

The method's terms are built once per forward (`Positions.context`) and applied by every layer
(`Positions.attend`); input methods (`absolute`, `sinusoidal`) add `Positions.embed` to the token embeddings.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F

from dietpe import Positions

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
        "it was the season of Darkness, it was the spring of hope, it was the winter of despair. ") * 20


class Block(nn.Module):
    def __init__(self, d: int, heads: int, layer: int, positions: Positions):
        super().__init__()
        self.heads, self.layer = heads, layer
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        object.__setattr__(self, "positions", positions)  # shared by the blocks, owned by the model

    def forward(self, x, ctx):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, L, Dh)
        y = self.positions.attend(q, k, v, ctx, layer=self.layer)  # causal: Positions(..., causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, method: str, d: int = 64, heads: int = 4, layers: int = 2, max_length: int = 256):
        super().__init__()
        self.positions = Positions(method, num_layers=layers, num_heads=heads, head_size=d // heads,
                                   max_length=max_length, causal=True)
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, i, self.positions) for i in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        ctx = self.positions.context(pos)  # the method's terms, once per forward
        x = self.wte(idx)
        extra = self.positions.embed(pos)
        if extra is not None:
            x = x + extra
        for block in self.blocks:
            x = block(x, ctx)
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def train(method: str = "diet-rel", steps: int = 200, length: int = 64, batch: int = 16, lr: float = 3e-3,
          seed: int = 0, text: str = TEXT) -> list[float]:
    """Train on random windows of `text`; returns the losses."""
    torch.manual_seed(seed)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    model = GPT(len(chars), method, max_length=length)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        starts = torch.randint(0, len(data) - length - 1, (batch,))
        x = torch.stack([data[s:s + length] for s in starts])
        y = torch.stack([data[s + 1:s + length + 1] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.3f}")
    return losses


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="diet-rel")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--text", help="a text file to train on (default: a built-in paragraph)")
    a = p.parse_args()
    train(a.method, a.steps, lr=a.lr, text=open(a.text).read() if a.text else TEXT)
