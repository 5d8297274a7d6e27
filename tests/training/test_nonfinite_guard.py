"""NonFiniteGuard in real training runs: a planted NaN batch (or Inf gradient) is skipped once and
training continues with finite weights; NaNs that persist stop the run with a message naming the step,
the batch files and the last good checkpoint."""

from __future__ import annotations

import csv
import math
from typing import ClassVar

import pytest
import pytorch_lightning as pl
import torch
from reliability_fixtures import BASE, UNET, VIT, compose_run

from segattn.training.guards import NonFiniteError
from segattn.training.run import run


class Poison(pl.Callback):
    """At the listed global steps, make the first image of the batch NaN (``image``) or one gradient
    element Inf after backward (``grad``); records the files of each poisoned batch. Each instance is kept in
    ``made``, where the test finds the one its run used."""

    made: ClassVar[list[Poison]] = []

    def __init__(self, steps: list[int], what: str = "image") -> None:
        self.steps, self.what = steps, what
        self.files: dict[int, list[str]] = {}
        self.made.append(self)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step in self.steps:
            self.files[trainer.global_step] = list(batch["path"])
            if self.what == "image":
                batch["image"][0] = float("nan")

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step in self.steps and self.what == "grad":
            next(p for p in pl_module.parameters() if p.grad is not None).grad.view(-1)[0] = math.inf


POISON = f"+callbacks.poison._target_={__name__}.Poison"  # with +callbacks.poison.steps=[...]


@pytest.fixture
def poison(monkeypatch):
    """The Poison callback instances the test's runs make (``+callbacks.poison``, ``POISON``)."""
    made: list[Poison] = []
    monkeypatch.setattr(Poison, "made", made)
    return made


def final_checkpoint(tmp_path):
    return torch.load(tmp_path / "run/checkpoints/last.ckpt", map_location="cpu", weights_only=True)


@pytest.mark.parametrize(("model", "what"), [(VIT, "image"), (UNET, "image"), (VIT, "grad")])
def test_one_bad_step_is_skipped_and_training_continues(tmp_path, poison, model, what):
    cfg = compose_run(
        tmp_path, *BASE, *model, "trainer.max_epochs=2", "logger=csv", "trainer.log_every_n_steps=1",
        POISON, "+callbacks.poison.steps=[1]", f"+callbacks.poison.what={what}",
    )  # fmt: skip
    kind = "loss" if what == "image" else "gradients"
    with pytest.warns(
        UserWarning, match=rf"non-finite {kind} at step 1 \(epoch 0\); batch files: "
    ) as caught:
        summary = run(cfg)
    (poisoned,) = poison
    message = next(str(w.message) for w in caught if "non-finite" in str(w.message))
    assert ", ".join(poisoned.files[1]) in message and "skipped this optimizer step" in message
    assert poisoned.files[1][0].startswith("synthetic/train/")
    assert summary["steps"] == 4

    ckpt = final_checkpoint(tmp_path)
    assert ckpt["global_step"] == 4
    # AdamW counted 3 updates for every parameter: step 1 never reached the weights or the moments.
    assert {int(state["step"]) for state in ckpt["optimizer_states"][0]["state"].values()} == {3}
    for name, tensor in ckpt["state_dict"].items():  # weights and BatchNorm statistics stay finite
        assert not tensor.is_floating_point() or torch.isfinite(tensor).all(), name
    with open(tmp_path / "run/csv/metrics.csv") as handle:
        skips = [
            row["train/nonfinite_skips"] for row in csv.DictReader(handle) if row["train/nonfinite_skips"]
        ]
    assert [float(value) for value in skips] == [1.0]


@pytest.mark.parametrize(
    ("steps", "limits", "stopped_by"),
    [
        ([2, 3], [2, 20], "2 non-finite step(s) in a row (max_consecutive=2)"),
        ([2, 3], [3, 2], "(max_total=2)"),
    ],
)
def test_persistent_nans_stop_with_step_files_and_last_good_checkpoint(
    tmp_path, poison, steps, limits, stopped_by
):
    cfg = compose_run(
        tmp_path, *BASE, *VIT, "trainer.max_epochs=3", "logger=none", POISON,
        f"+callbacks.poison.steps={steps}",
        f"callbacks.nonfinite_guard.max_consecutive={limits[0]}",
        f"callbacks.nonfinite_guard.max_total={limits[1]}",
    )  # fmt: skip
    with pytest.raises(NonFiniteError) as stopped:
        run(cfg)
    message = str(stopped.value)
    (poisoned,) = poison
    last = tmp_path / "run/checkpoints/last.ckpt"
    assert message.startswith(
        f"non-finite loss at step 3 (epoch 1); batch files: {', '.join(poisoned.files[3])}"
    )
    assert stopped_by in message and f"Last good checkpoint: {last}." in message
    good = torch.load(last, map_location="cpu", weights_only=True)
    assert good["global_step"] == 2  # written at the end of epoch 1, before the NaNs
    assert all(torch.isfinite(t).all() for t in good["state_dict"].values() if t.is_floating_point())
