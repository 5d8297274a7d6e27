"""The device script and the IDRiD GPU arms it runs (issue 31 item 6, issue 32 item 4), checked without a
GPU: the scripts parse, and the arms of conf/experiment/idrid_gpu_whole.yaml train on whole images with
the pixels per step and the batches the issue asks for. The script's commands themselves run in its dry
run (`DRY_RUN=1 make device-check`, docs/performance.md "The device script"): minutes, not a test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from segattn.bench.arms import experiment_table, spec_overrides
from segattn.cli import compose_command

REPO = Path(__file__).resolve().parents[2]
ROOT = ["data.root=../shared/data/idrid"]  # composing does not read the folder
IDRID = (2848, 4288)  # height, width of every IDRiD photograph


@pytest.mark.parametrize("script", [".ci/device-check", ".ci/device-idrid"])
def test_the_device_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)


def test_the_gpu_arms_are_whole_images_at_equal_pixels_or_equal_epochs():
    table = experiment_table("idrid_gpu_whole", ROOT)
    assert table is not None
    arms = {arm.label: arm for arm in table.arms}
    assert list(arms) == ["A-linear-full", "B-linear-x4-equal-time", "C-linear-x4-equal-epochs", "sra-full"]

    def pixels_per_step(label: str) -> int:
        options = arms[label].options
        shrink, batch = options.get("data.downsample", 1), options.get("data.batch_size", 2)
        return batch * (IDRID[0] // shrink) * (IDRID[1] // shrink)

    assert pixels_per_step("B-linear-x4-equal-time") == pixels_per_step("A-linear-full")  # 32 x 712x1072
    assert arms["C-linear-x4-equal-epochs"].options == {"data.downsample": 4}  # A's batch of 2
    for label, arm in arms.items():
        cfg = compose_command("train", ["experiment=idrid_gpu_whole", *ROOT, *spec_overrides(arm)])
        assert cfg.data.crop_size is None and cfg.inference.mode == "whole", label
        assert cfg.attention.name == ("sra" if label == "sra-full" else "linear")
        assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"
