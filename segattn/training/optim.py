"""AdamW over the model's own parameter groups and the per-step LR schedule: linear warmup, then
polynomial or cosine decay, built from torch's schedulers."""

from __future__ import annotations

from collections.abc import Sequence

from pytorch_lightning.utilities import rank_zero_warn
from torch import nn
from torch.optim import AdamW, Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, PolynomialLR, SequentialLR

from ..files import conf_values

SCHEDULES = ("poly", "cosine")
# the defaults of the builders' options, as conf/optimizer/ and conf/scheduler/ declare them
ADAMW, POLY, COSINE = map(conf_values, ("optimizer/adamw", "scheduler/poly", "scheduler/cosine"))


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: Sequence[float] = ADAMW["betas"],
    eps: float = ADAMW["eps"],
) -> Optimizer:
    """AdamW over ``model.param_groups(lr, weight_decay)`` (the model decides decay and LR multipliers)."""
    return AdamW(
        model.param_groups(lr, weight_decay), lr=lr, weight_decay=weight_decay, betas=tuple(betas), eps=eps
    )


def build_scheduler(
    optimizer: Optimizer,
    total_steps: int,
    name: str = POLY["name"],
    warmup_steps: int = 0,
    warmup_start_factor: float = POLY["warmup_start_factor"],
    power: float = POLY["power"],
    eta_min: float = COSINE["eta_min"],
) -> LRScheduler:
    """LR factor ramps linearly from ``warmup_start_factor`` to 1 over ``warmup_steps``, then decays to
    0 (poly: (1 - t)^power) or to ``eta_min`` (cosine) at ``total_steps``; stepped once per optimizer step.

    A warmup longer than half the run (a recipe's 1500 steps under fast_dev_run, the default 50 in a
    48-step or 60-step run) is cut to a tenth of the run, so that most of the run decays.
    """
    if name not in SCHEDULES:
        raise ValueError(f"scheduler.name={name!r}; expected one of {', '.join(SCHEDULES)}")
    if warmup_steps > total_steps // 2:
        rank_zero_warn(
            f"scheduler.warmup_steps={warmup_steps} is more than half of the run's {total_steps} training "
            f"steps; shortened to {total_steps // 10} (a tenth of the run)"
        )
        warmup_steps = total_steps // 10
    decay_steps = total_steps - warmup_steps
    if name == "poly":
        decay: LRScheduler = PolynomialLR(optimizer, total_iters=decay_steps, power=power)
    else:
        decay = CosineAnnealingLR(optimizer, T_max=decay_steps, eta_min=eta_min)
    if warmup_steps <= 0:
        return decay
    warmup = LinearLR(optimizer, start_factor=warmup_start_factor, total_iters=warmup_steps)
    return SequentialLR(optimizer, [warmup, decay], milestones=[warmup_steps])
