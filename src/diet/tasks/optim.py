"""A separate learning rate for position parameters (`--position-lr-scale`), the same rule for every method.

Position parameters are every parameter owned by a model's `PositionEncoding` (`diet.positions`): BERT's
absolute table, TUPE's table and projections, DIET-ABS's P_Q/P_K, DIET-REL's and T5's per-head scalars, ALiBi
and KERPLE's slopes, and the segment parameters (input token-type embeddings or DIET's per-head segment
tables). They get `scale ×` the peak learning rate under the same warm-up and decay; every other parameter is
trained exactly as before. The evidence for the study's scale is in docs/study.md.
"""

from __future__ import annotations

from torch import nn

from diet.tasks.seeding import SeededTrainer


def position_parameter_names(model: nn.Module) -> set[str]:
    """Names (as in `model.named_parameters()`) of the parameters under any `PositionEncoding` of `model`."""
    from diet.positions.encoding import PositionEncoding

    names: set[str] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, PositionEncoding):
            names.update(f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters())
    return names


def parameter_groups(model: nn.Module, lr: float, weight_decay: float, decay_names: set[str] | list[str],
                     position_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: (decay, no decay) × (position, other); position groups carry lr × position_lr_scale.
    Empty groups are dropped; the order (and so the optimizer state layout) is fixed."""
    position = position_parameter_names(model)
    decay_names = set(decay_names)
    groups = []
    for is_position in (False, True):
        for decays in (True, False):
            params = [p for n, p in model.named_parameters()
                      if p.requires_grad and (n in position) == is_position and (n in decay_names) == decays]
            if params:
                groups.append(dict(params=params, weight_decay=weight_decay if decays else 0.0,
                                   lr=lr * (position_lr_scale if is_position else 1.0)))
    return groups


class PositionLrTrainer(SeededTrainer):
    """`SeededTrainer` whose AdamW gives position parameters `position_lr_scale` × the learning rate."""

    def __init__(self, *args, position_lr_scale: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.position_lr_scale = float(position_lr_scale)

    def create_optimizer(self, model=None):
        if self.position_lr_scale == 1.0 or self.optimizer is not None:
            return super().create_optimizer(model)
        opt_model = self.model if model is None else model
        groups = parameter_groups(opt_model, self.args.learning_rate, self.args.weight_decay,
                                  self.get_decay_parameter_names(opt_model), self.position_lr_scale)
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer
