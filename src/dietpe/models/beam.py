"""GNMT's length penalty for beam search (Wu et al. 2016, §7, eq. 14), the one tensor2tensor's beam search uses
and so the DIET paper's translation models (appendix A: "beam size 10 and length penalty 0.6"):

    s(Y, X) = log P(Y | X) / lp(Y),        lp(Y) = (5 + |Y|)^α / (5 + 1)^α

transformers' beam search divides by |Y|^α instead. Both leave hypotheses of one length in the same order and,
for α > 0, favour longer ones; they differ in how much, so the chosen translation can differ. |Y| counts the
generated tokens, the end-of-sentence token included (tensor2tensor's `i + 1` at decoding step i).

`GnmtBeamSearch` is a `GenerationMixin` mixin: `generate(..., length_penalty_form="gnmt")` swaps the divisor in
the two places transformers' beam search applies it (scoring a hypothesis that finishes, and the bound on what a
running beam could still score) and lets any of the 2k candidates of a step finish, as tensor2tensor does
(transformers takes finished hypotheses from the top k only); the rest of its beam search is unchanged. `"hf"`
(the default) is transformers' own.
"""

from __future__ import annotations

import torch

from dietpe.errors import ConfigError

LENGTH_PENALTY_FORMS = ("hf", "gnmt")


def gnmt_length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6)^α, for a length (int or tensor)."""
    return ((5 + length) / 6) ** alpha


class GnmtBeamSearch:
    """Mixin for a `GenerationMixin` model: `generate(length_penalty_form=...)`."""

    _length_penalty_form = "hf"

    def generate(self, *args, length_penalty_form: str = "hf", **kwargs):
        if length_penalty_form not in LENGTH_PENALTY_FORMS:
            raise ConfigError(f"length_penalty_form={length_penalty_form!r} is not one of "
                              f"{', '.join(LENGTH_PENALTY_FORMS)}")
        self._length_penalty_form = length_penalty_form
        try:
            return super().generate(*args, **kwargs)
        finally:
            self._length_penalty_form = "hf"

    def _update_finished_beams(self, **kwargs):
        if self._length_penalty_form == "gnmt":
            length = kwargs["cur_len"] + 1 - kwargs["decoder_prompt_len"]
            kwargs["topk_log_probs"] = kwargs["topk_log_probs"] / gnmt_length_penalty(length, kwargs["length_penalty"])
            kwargs["length_penalty"] = 0.0  # transformers then divides by |Y|^0 = 1
            # tensor2tensor's grow_finished: any of the 2k candidates that ends the sentence may finish, where
            # transformers lets only the top k (a finished hypothesis outside them would be lost)
            kwargs["top_num_beam_mask"] = torch.ones_like(kwargs["top_num_beam_mask"])
        return super()._update_finished_beams(**kwargs)

    def _check_early_stop_heuristic(self, **kwargs):
        if self._length_penalty_form != "gnmt":
            return super()._check_early_stop_heuristic(**kwargs)
        # transformers' bound with GNMT's divisor: the best running score at the length that could score best
        alpha, prompt = kwargs["length_penalty"], kwargs["decoder_prompt_len"]
        longest = kwargs["early_stopping"] == "never" and alpha > 0.0
        length = (kwargs["max_length"] if longest else kwargs["cur_len"]) - prompt
        best_running = kwargs["running_beam_scores"][:, :1] / gnmt_length_penalty(length, alpha)
        scores, finished = kwargs["beam_scores"], kwargs["is_sent_finished"]
        worst_finished = torch.where(finished, torch.min(scores, dim=1, keepdim=True)[0], -1.0e9)
        return kwargs["is_early_stop_heuristic_unsatisfied"] & torch.any(best_running > worst_finished, dim=-1,
                                                                          keepdim=True)
