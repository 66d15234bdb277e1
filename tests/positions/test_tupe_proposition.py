"""TUPE's Proposition 1 (Ke et al. 2021, §3.3, appendix A): any Toeplitz B ∈ C^{n×n} factorises as B = G D G*,
D a 2n×2n diagonal matrix, G the n×2n Vandermonde matrix G_{j,k} = e^{iπ(j+1)k/n} / 2n: the relative bias
b_{j-i} spans a (2n-1)-dimensional subspace, unlike the low-rank absolute correlation (P U_Q)(P U_K)ᵀ.

Checked on the relative terms the models compute (T5's buckets, DIET-REL's R, TUPE-R's b_{j-i}) with the
proof's construction: the 2n×2n circulant B̂ of eq. (12) diagonalised by the Vandermonde matrix."""

import torch
import pytest

from dietpe import DietConfig, DietModel
from dietpe.analysis import position_pattern


def circulant(B: torch.Tensor) -> torch.Tensor:
    """Eq. (12): B̂_{j,k} = b_{k-j} for |k-j| ≤ n, b_{k-j-2n} above, b_{k-j+2n} below, with b_{±n} = b_0."""
    n = B.shape[0]
    b = {d: (B[0, d] if d >= 0 else B[-d, 0]) for d in range(-(n - 1), n)}
    b[n] = b[-n] = b[0]
    out = torch.empty(2 * n, 2 * n, dtype=torch.complex128)
    for j in range(2 * n):
        for k in range(2 * n):
            d = k - j
            out[j, k] = b[d] if -n <= d <= n else (b[d - 2 * n] if d > n else b[d + 2 * n])
    return out


def vandermonde(rows: int, n: int) -> torch.Tensor:
    """G_{j,k} = e^{iπ(j+1)k/n} / 2n for j < rows, k < 2n."""
    j = torch.arange(rows, dtype=torch.float64)[:, None]
    k = torch.arange(2 * n, dtype=torch.float64)[None, :]
    return torch.exp(1j * torch.pi * (j + 1) * k / n) / (2 * n)


def factorise(B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(G, D, B̂): the proposition's factors of B, D from B̂ = Q D Q* (Q = the 2n-row Vandermonde matrix)."""
    n = B.shape[0]
    Q = vandermonde(2 * n, n)
    Bh = circulant(B.to(torch.float64))
    D = torch.linalg.solve(Q, torch.linalg.solve(Q.conj(), Bh.T).T)  # Q⁻¹ B̂ (Q*)⁻¹
    return vandermonde(n, n), D, Bh


def model(position, **kw):
    torch.manual_seed(0)
    cfg = DietConfig.from_preset("bert-tiny", position=position, vocab_size=50, max_position_embeddings=64,
                                 hidden_size=32, intermediate_size=64, **kw)
    return DietModel(cfg).eval()


def relative_bias(position: str, n: int) -> torch.Tensor:
    """The model's b_{j-i} as an (n, n) matrix for one head (TUPE-R's without its absolute part and [CLS] reset)."""
    if position == "tupe-r":
        m = model("tupe-r", tupe_reset=False)
        a = model("tupe-a", tupe_reset=False)
        a.positions.method.load_state_dict(m.positions.method.state_dict(), strict=False)
        return (position_pattern(m, n)[0] - position_pattern(a, n)[0])[1].detach()
    return position_pattern(model(position), n)[0][1].detach()


@pytest.mark.parametrize("position", ["t5", "diet-rel", "tupe-r"])
def test_a_relative_bias_is_g_d_g_star(position):
    n = 12
    B = relative_bias(position, n)
    G, D, Bh = factorise(B)
    assert torch.allclose(Bh, torch.roll(torch.roll(Bh, 1, 0), 1, 1))  # B̂ is circulant
    off = D - torch.diag(torch.diagonal(D))
    assert float(off.abs().max()) < 1e-8 * float(D.abs().max())   # the Vandermonde columns diagonalise it
    torch.testing.assert_close(G @ torch.diag(torch.diagonal(D)) @ G.conj().T, B.to(torch.complex128),
                               atol=1e-6, rtol=1e-6)  # B is float32


def test_an_absolute_correlation_is_not():
    """TUPE-A's (P U_Q)(P U_K)ᵀ is no Toeplitz matrix: the construction cannot reproduce it."""
    n = 12
    B = position_pattern(model("tupe-a", tupe_reset=False), n)[0][1].detach()
    G, D, _ = factorise(B)
    assert not torch.allclose(G @ torch.diag(torch.diagonal(D)) @ G.conj().T, B.to(torch.complex128), atol=1e-3)
