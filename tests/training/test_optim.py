"""The LR schedule against its closed form, step by step."""

import math
import warnings

import pytest
import torch
from torch import nn

from segattn.training.optim import build_optimizer, build_scheduler

LR = 0.1


class TwoGroups(nn.Module):
    """Stands in for a Segmentor: a backbone group and a head group with a 10x LR multiplier."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(2, 2)
        self.head = nn.Linear(2, 2)

    def param_groups(self, lr: float, weight_decay: float) -> list[dict]:
        return [
            {"params": list(self.backbone.parameters()), "lr": lr, "weight_decay": weight_decay},
            {"params": list(self.head.parameters()), "lr": 10 * lr, "weight_decay": 0.0},
        ]


def lrs_over(name: str, total: int, warmup: int, **options) -> list[list[float]]:
    optimizer = build_optimizer(TwoGroups(), lr=LR, weight_decay=0.01)
    scheduler = build_scheduler(optimizer, total, name, warmup_steps=warmup, **options)
    lrs = []
    for _ in range(total):
        lrs.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return lrs


def warmup_factor(step: int, warmup: int, start: float) -> float:
    return start + (1 - start) * step / warmup


@pytest.mark.parametrize("name", ["poly", "cosine"])
def test_warmup_then_decay_matches_closed_form(name):
    total, warmup, start, power = 20, 5, 0.01, 0.9
    lrs = lrs_over(name, total, warmup, warmup_start_factor=start, power=power)
    for step, (backbone, head) in enumerate(lrs):
        if step < warmup:
            factor = warmup_factor(step, warmup, start)
        else:
            t = (step - warmup) / (total - warmup)
            factor = (1 - t) ** power if name == "poly" else 0.5 * (1 + math.cos(math.pi * t))
        assert backbone == pytest.approx(LR * factor, rel=1e-6, abs=1e-12), step
        assert head == pytest.approx(10 * LR * factor, rel=1e-6, abs=1e-12), step


def test_weight_decay_and_groups_come_from_the_model():
    optimizer = build_optimizer(TwoGroups(), lr=LR, weight_decay=0.05)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.05, 0.0]


def test_warmup_longer_than_half_the_run_is_shortened_to_a_tenth_of_it_and_unknown_schedule_rejected():
    with pytest.warns(UserWarning, match="shortened to 4 "):
        lrs = lrs_over("poly", total=48, warmup=50, warmup_start_factor=0.5)
    assert lrs[0][0] == pytest.approx(LR * 0.5)  # warmup of 4 steps, then 44 decay steps
    assert lrs[4][0] == pytest.approx(LR)
    assert lrs[47][0] == pytest.approx(LR / 44)
    with pytest.warns(UserWarning, match="more than half of the run's 60 training steps; shortened to 6 "):
        lrs_over("poly", total=60, warmup=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # half the run or less is the recipe's choice, kept
        assert lrs_over("poly", total=100, warmup=50, warmup_start_factor=0.5)[0][0] == pytest.approx(
            LR * 0.5
        )
    with pytest.warns(UserWarning, match="shortened to 0 "):
        lrs = lrs_over("poly", total=3, warmup=100)
    assert lrs[0][0] == pytest.approx(LR)  # too short for any warmup: decay from the first step
    optimizer = build_optimizer(TwoGroups(), lr=LR, weight_decay=0.0)
    with pytest.raises(ValueError, match="step"):
        build_scheduler(optimizer, 10, "step")
