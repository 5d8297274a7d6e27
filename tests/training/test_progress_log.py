"""The console of a training run: the step lines go to the terminal only when no progress bar shows the
steps (always to the log files), and the bar counts epochs from 1 as the lines do."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import pytest
import torch

from segattn.training.progress_log import EpochsFromOneBar, ProgressLog


def trainer(progress_bar: object | None) -> SimpleNamespace:
    """The trainer attributes the callback and the bar read: epoch 0 of 20, step 8 of 160."""
    return SimpleNamespace(
        is_global_zero=True, global_step=8, log_every_n_steps=4, world_size=1, estimated_stepping_batches=160,
        max_epochs=20, current_epoch=0, callback_metrics={}, progress_bar_callback=progress_bar,
    )  # fmt: skip


@pytest.fixture
def outputs(tmp_path):
    """The console (a stream) and the log file of the root logger, as Hydra's logging config sets them."""
    root, console = logging.getLogger(), io.StringIO()
    handlers = [logging.StreamHandler(console), logging.FileHandler(tmp_path / "train.log")]
    level = root.level
    root.setLevel(logging.INFO)
    for handler in handlers:
        root.addHandler(handler)
    yield console, tmp_path / "train.log"
    root.setLevel(level)
    for handler in handlers:
        root.removeHandler(handler)
        handler.close()


def log_a_step(run: SimpleNamespace) -> None:
    callback = ProgressLog()
    callback.on_train_start(run, None)
    callback.on_train_batch_end(run, None, {"loss": torch.tensor(0.5)}, {"image": torch.zeros(2, 3)}, 0)


@pytest.mark.parametrize("bar", [None, EpochsFromOneBar()], ids=["no bar", "bar"])
def test_step_lines_reach_the_console_only_without_a_progress_bar(outputs, bar):
    console, log_file = outputs
    log_a_step(trainer(bar))
    assert "epoch 1/20 step 8/160 loss 0.5000" in log_file.read_text()
    assert ("epoch 1/20 step 8/160" in console.getvalue()) is (bar is None)


def test_the_progress_bar_counts_epochs_from_one_as_the_log_lines_do():
    bar = EpochsFromOneBar()
    bar._trainer = trainer(bar)  # what Lightning's setup sets
    assert bar._get_train_description(0).strip() == "Epoch 1/20"
