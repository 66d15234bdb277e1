"""Shaw et al.'s terms read only the rows of a^K and a^V that some offset reaches (±min(k, L - 1) for
consecutive positions), and give what the whole ±k table gives: values and gradients."""

import pytest
import torch

from dietpe import DietModel
from dietpe.positions.context import Context
from dietpe.positions.shaw import Shaw
from tests.conftest import batch, tiny


@pytest.mark.parametrize("q_pos,k_pos,rows", [
    (torch.arange(10), torch.arange(10), 19),             # self-attention: offsets -9 .. 9
    (torch.tensor([11]), torch.arange(12), 23),           # decoding one token: offsets 0 .. 11, window ±11
    (torch.arange(5) + 20, torch.arange(25), 49),         # a chunk after 20 cached keys: 0 .. 24 behind
    (torch.arange(100), torch.arange(100), 81),           # longer than k: the whole table
    (2 * torch.arange(10), 2 * torch.arange(10), 81),     # not consecutive: the general gather, whole table
])
def test_terms_read_the_reached_rows_only(q_pos, k_pos, rows):
    method = Shaw(num_layers=1, head_size=4, max_distance=40)
    terms = method.layer_terms(Context(q_pos, k_pos), 0)
    assert terms.logits[0].r.shape[0] == rows and terms.values[0].a.shape[0] == rows


def test_a_window_gives_the_whole_tables_values_and_gradients():
    """k = 40 at 10 tokens against k = 9 holding the same middle rows (no window there): the same outputs,
    the same gradients on those rows, none on the rows no offset reaches."""
    torch.manual_seed(0)
    wide = DietModel(tiny(position="shaw", shaw_max_distance=40, attn_backend="eager"))
    narrow = DietModel(tiny(position="shaw", shaw_max_distance=9, attn_backend="eager"))
    state = wide.state_dict()
    for name in ("positions.method.key", "positions.method.value"):
        state[name] = state[name][:, 31:50]
    narrow.load_state_dict(state)
    ids, mask, segments = batch(10)
    weights = torch.randn(2, 10, 16)  # a fixed random readout: gradients of every size and sign, not LN's zero
    losses = [(m(ids, mask, segments).last_hidden_state * weights).sum() for m in (wide, narrow)]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-5)
    for loss in losses:
        loss.backward()
    for part in ("key", "value"):
        grad_wide = getattr(wide.positions.method, part).grad
        grad_narrow = getattr(narrow.positions.method, part).grad
        assert grad_narrow.abs().mean() > 1e-5  # about 2e-4: far above the tolerance below
        torch.testing.assert_close(grad_wide[:, 31:50], grad_narrow, rtol=1e-5, atol=1e-8)
        assert not grad_wide[:, :31].any() and not grad_wide[:, 50:].any()
