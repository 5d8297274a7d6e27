"""Exact resume: 2 epochs straight == 1 epoch, interrupted, then ``ckpt_path=last`` for the second epoch
(same weights, optimizer moments, LR schedule, step counters), and the W&B run continues."""

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from train_overrides import QUIET, TINY_DATA, TINY_MODEL

from segattn.training.run import run

pytestmark = pytest.mark.slow


class StopAfterEpochs(pl.Callback):
    """Interrupts training after ``epochs`` epochs, like a job killed between epochs."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


# One worker: augmentations (random flips) are seeded per epoch from the torch RNG, which the
# checkpoint carries. Dropout and drop-path stay on; the schedule warms up then decays over 2 epochs.
RUN = [
    *QUIET,
    *TINY_DATA,
    *TINY_MODEL["vit"],
    "data.num_workers=1",
    "trainer.max_epochs=2",
    "trainer.deterministic=true",
    "scheduler.warmup_steps=3",
    "optimizer.lr=1e-3",
]


def load(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints/last.ckpt", map_location="cpu", weights_only=True)


def test_interrupted_then_resumed_equals_straight(train_config, tmp_path):
    stop_after_1 = [
        f"+callbacks.stop_after._target_={__name__}.StopAfterEpochs",
        "+callbacks.stop_after.epochs=1",
    ]
    run(train_config(*RUN, "logger=none", run="straight"))
    first = run(train_config(*RUN, *stop_after_1, run="first"))
    assert first["epochs"] == 1
    resumed = run(train_config(*RUN, "ckpt_path=last", run="resumed"))
    assert resumed["epochs"] == 2

    straight, interrupted, resumed_ckpt = (
        load(tmp_path / "straight"),
        load(tmp_path / "first"),
        load(tmp_path / "resumed"),
    )
    assert (resumed_ckpt["epoch"], resumed_ckpt["global_step"]) == (
        straight["epoch"],
        straight["global_step"],
    )
    for name, value in straight["state_dict"].items():
        assert torch.equal(value, resumed_ckpt["state_dict"][name]), name
    assert not torch.equal(
        straight["state_dict"]["model.head.classifier.weight"],
        interrupted["state_dict"]["model.head.classifier.weight"],
    )
    optim_a, optim_b = straight["optimizer_states"][0], resumed_ckpt["optimizer_states"][0]
    assert [g["lr"] for g in optim_a["param_groups"]] == [g["lr"] for g in optim_b["param_groups"]]
    for key, state in optim_a["state"].items():
        assert torch.equal(state["exp_avg_sq"], optim_b["state"][key]["exp_avg_sq"])
    assert straight["lr_schedulers"][0]["_last_lr"] == resumed_ckpt["lr_schedulers"][0]["_last_lr"]

    # The resumed run logged to the same W&B run as the interrupted one.
    run_id = interrupted["segattn"]["wandb_run_id"]
    assert run_id and resumed_ckpt["segattn"]["wandb_run_id"] == run_id
    assert next((tmp_path / "resumed/wandb").glob("offline-run-*")).name.endswith(run_id)
