"""A run that fails mid-training still closes its W&B run (exit code 1 in the offline run file), so the
next run in the same process (a sweep job) starts a fresh one."""

import pytest
import pytorch_lightning as pl
import wandb
from train_overrides import QUIET, TINY_DATA, TINY_MODEL
from wandb_records import wait_for_record

from segattn.training.run import run

pytestmark = pytest.mark.slow


class FailAtStep(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError(f"planted failure at step {trainer.global_step}")


def test_failed_run_finishes_its_wandb_run(train_config, tmp_path):
    fail_at = [f"+callbacks.fail_at._target_={__name__}.FailAtStep", "+callbacks.fail_at.step=1"]
    cfg = train_config(*QUIET, *TINY_DATA, *TINY_MODEL["vit"], *fail_at, run="failed")
    with pytest.raises(RuntimeError, match="planted failure at step 1"):
        run(cfg)
    assert wandb.run is None
    run_file = next((tmp_path / "failed/wandb").glob("offline-run-*/run-*.wandb"))
    records = wait_for_record(run_file, "exit")
    exits = [record.exit for record in records if record.WhichOneof("record_type") == "exit"]
    assert len(exits) == 1 and exits[0].exit_code == 1
    assert [record.run.display_name for record in records if record.WhichOneof("record_type") == "run"] == [
        "vit-flatten-synthetic"
    ]
