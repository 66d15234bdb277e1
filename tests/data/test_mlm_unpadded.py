"""The MLM collator leaves `attention_mask` out of a batch with nothing padded (so a GPU training step, which
never looks at the mask's values, can give SDPA no mask and take flash); the loss is the same either way."""

import torch

from dietpe import DietForMaskedLM
from dietpe.data.mlm import MlmCollator
from dietpe.models import modeling
from tests.conftest import tiny

CLS, SEP = 2, 3


class _Tok:
    pad_token_id, mask_token_id, all_special_ids = 0, 4, [0, 1, 2, 3, 4]

    def __len__(self):
        return 50


def _blocks(*lengths):
    return [{"input_ids": [CLS] + [10 + (7 * i + j) % 40 for j in range(n)] + [SEP]} for i, n in enumerate(lengths)]


def test_a_batch_without_padding_has_no_mask_and_a_padded_one_has_one():
    collate = MlmCollator(_Tok())
    g = torch.Generator().manual_seed(0)
    assert "attention_mask" not in collate(_blocks(12, 12, 12), generator=g)
    padded = collate(_blocks(12, 5, 12), generator=g)
    assert padded["attention_mask"].tolist()[1] == [1] * 7 + [0] * 7
    assert "attention_mask" in MlmCollator(_Tok(), pad_to_multiple_of=8)(_blocks(12, 12), generator=g)
    premasked = collate.premask([b["input_ids"] for b in _blocks(12, 12)], seed=1)
    assert "attention_mask" not in collate(premasked)  # the validation set's batches too


def test_the_loss_is_the_same_without_the_mask_as_with_an_all_ones_mask(monkeypatch):
    """With the mask, the model is made to build it as a GPU training step does (it never looks whether
    anything is padded): the same loss and gradients as without it."""
    batch = MlmCollator(_Tok())(_blocks(12, 12), generator=torch.Generator().manual_seed(0))
    model = DietForMaskedLM(tiny(position="diet-rel")).train()
    runs = []
    for mask in (None, torch.ones_like(batch["input_ids"])):
        with monkeypatch.context() as mp:
            built = []
            real = modeling.padding_mask

            def watch(attention_mask, dtype):
                built.append(real(attention_mask, dtype))
                return built[-1]

            mp.setattr(modeling, "may_read", lambda t: False)
            mp.setattr(modeling, "padding_mask", watch)
            model.zero_grad()
            loss = model(**batch, attention_mask=mask).loss
            loss.backward()
            runs.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        assert (built[0] is None) == (mask is None)  # with the mask, an additive (B, 1, 1, L) of zeros is built
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-6, rtol=1e-6)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
