"""The device script and the IDRiD GPU arms it runs (issue 31 item 6, issue 32 item 4), checked without a
GPU: the scripts parse, and the arms of conf/experiment/idrid_gpu_whole.yaml train on whole images with
the pixels per step and the batches the issue asks for. The script's commands themselves run in its dry
run (`DRY_RUN=1 make device-check`, docs/performance.md "The device script"): minutes, not a test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from segattn.cli import compose_command

REPO = Path(__file__).resolve().parents[2]
ROOT = ["data.root=../shared/data/idrid"]  # composing does not read the folder
IDRID = (2848, 4288)  # height, width of every IDRiD photograph


@pytest.mark.parametrize("script", [".ci/device-check", ".ci/device-idrid"])
def test_the_device_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)


def test_the_gpu_arms_are_whole_images_at_equal_pixels_or_equal_epochs():
    experiment = ["experiment=idrid_gpu_whole", *ROOT]
    params = compose_command("train", experiment, keep_hydra=True).hydra.sweeper.params
    assert params["+experiment/arms/idrid_gpu_whole"].split(",") == [
        "A-linear-full",
        "B-linear-x4-equal-time",
        "C-linear-x4-equal-epochs",
        "sra-full",
    ]
    arms = {
        label: compose_command("train", [*experiment, f"+experiment/arms/idrid_gpu_whole={label}"])
        for label in params["+experiment/arms/idrid_gpu_whole"].split(",")
    }

    def pixels_per_step(label: str) -> int:
        shrink, batch = arms[label].data.downsample, arms[label].data.batch_size
        return batch * (IDRID[0] // shrink) * (IDRID[1] // shrink)

    assert pixels_per_step("B-linear-x4-equal-time") == pixels_per_step("A-linear-full")  # 32 x 712x1072
    recipe = compose_command("train", experiment)
    assert arms["C-linear-x4-equal-epochs"].data.downsample == 4  # A's batch of 2
    assert arms["C-linear-x4-equal-epochs"].data.batch_size == recipe.data.batch_size == 2
    for label, cfg in arms.items():
        assert cfg.data.crop_size is None and cfg.inference.mode == "whole", label
        assert cfg.attention.name == ("sra" if label == "sra-full" else "linear")
        assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"
