"""A separate learning rate for logit-unit position parameters (`--logit-lr-scale`), one rule for every method.

AdamW moves each parameter by about the learning rate per step whatever its gradient's size. A parameter that
is added to the attention logits as it is (DIET-REL's R, T5's and TUPE-R's buckets, DIET's per-head segment
table Ŝ) or is a factor of such a term (DIET-ABS's P_Q, P_K) needs values of order 1 but starts at the
embedding std 0.02; a parameter in embedding units (BERT's or TUPE's position table, TUPE's projections, Shaw's
and XLNet's relative embeddings, input segments) does not. Each method names its logit-unit parameters
(`PositionMethod.logit_parameters`); they get `scale ×` the peak learning rate under the same warm-up and decay,
every other parameter is trained as before. Since the tables are stored over `DietConfig.logit_scale` (10 by
default; `dietpe.positions.method`), one learning rate trains them and this rule is an option, 1 in every
recipe (evidence: docs/parametrization.md); it multiplies with the stored scale.

The same groups serve LAMB (`--optimizer lamb`, dietpe.tasks.lamb): the groups without weight decay (biases,
layer norms) take no trust ratio either.
"""

from __future__ import annotations

from torch import nn

from dietpe.tasks.seeding import SeededTrainer


def logit_parameter_names(model: nn.Module) -> set[str]:
    """Names (as in `model.named_parameters()`) of the logit-unit parameters of every position method."""
    from dietpe.positions.method import PositionMethod

    names: set[str] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, PositionMethod):
            own = dict(module.named_parameters(recurse=False))
            names.update(f"{prefix}.{n}" if prefix else n for n in module.logit_parameters if n in own)
    return names


def parameter_groups(model: nn.Module, lr: float, weight_decay: float, decay_names: set[str] | list[str],
                     logit_lr_scale: float = 1.0) -> list[dict]:
    """AdamW groups: (decay, no decay) × (other, logit-unit); logit-unit groups carry lr × logit_lr_scale.
    Empty groups are dropped; the order (and so the optimizer state layout) is fixed. `adapt`: LAMB's trust
    ratio, for the groups with weight decay (AdamW ignores the key)."""
    logit = logit_parameter_names(model)
    decay_names = set(decay_names)
    groups = []
    for is_logit in (False, True):
        for decays in (True, False):
            params = [p for n, p in model.named_parameters()
                      if p.requires_grad and (n in logit) == is_logit and (n in decay_names) == decays]
            if params:
                groups.append(dict(params=params, weight_decay=weight_decay if decays else 0.0,
                                   lr=lr * (logit_lr_scale if is_logit else 1.0), adapt=decays))
    return groups


class LogitLrTrainer(SeededTrainer):
    """`SeededTrainer` whose AdamW (or LAMB, `optimizer="lamb"`) gives logit-unit position parameters
    `logit_lr_scale` × the learning rate."""

    def __init__(self, *args, logit_lr_scale: float = 1.0, optimizer: str = "adamw", **kwargs):
        super().__init__(*args, **kwargs)
        self.logit_lr_scale = float(logit_lr_scale)
        self.optimizer_name = optimizer

    def create_optimizer(self, model=None):
        if (self.logit_lr_scale == 1.0 and self.optimizer_name == "adamw") or self.optimizer is not None:
            return super().create_optimizer(model)
        opt_model = self.model if model is None else model
        groups = parameter_groups(opt_model, self.args.learning_rate, self.args.weight_decay,
                                  self.get_decay_parameter_names(opt_model), self.logit_lr_scale)
        if self.optimizer_name == "lamb":
            from dietpe.tasks.lamb import Lamb

            a = self.args
            self.optimizer = Lamb(groups, lr=a.learning_rate, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_epsilon)
            return self.optimizer
        for group in groups:
            group.pop("adapt")
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer
