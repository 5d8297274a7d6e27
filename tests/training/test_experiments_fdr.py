"""Every experiment recipe (and the default config) runs one train + one val batch (debug=fdr) on tiny
synthetic data with tiny model widths: the recipe's schedule, loss, validation mode and trainer settings
all go through the real code path."""

import math

import pytest
from train_overrides import CONF, QUIET, TINY_DATA, TINY_MODEL

from segattn.training.run import run

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
# Recipes target GPUs; here they run on the CPU in fp32 with pretrained weights off (no network), on
# synthetic data, whose classes are not the ones a recipe may average into mAP.
CPU_RECIPE = [
    "model.pretrained=null",
    "trainer.precision=32-true",
    "trainer.sync_batchnorm=false",
    "metrics.ap_mean_classes=null",
    "inference.stride=null",  # half the window: a recipe's slide stride is wider than the tiny crops
]


def fast_dev_run(train_config, *overrides):
    cfg = train_config("debug=fdr", "logger=none", *QUIET, *TINY_DATA, *overrides)
    return cfg, run(cfg)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_fast_dev_run(name, train_config):
    cfg, summary = fast_dev_run(train_config, f"experiment={name}", *TINY_MODEL["pvt"], *CPU_RECIPE)
    assert cfg.data.name == "synthetic" and cfg.trainer.fast_dev_run
    assert summary["steps"] == 1
    assert 0 <= summary["final"]["mIoU"] <= 100


@pytest.mark.parametrize("family", ["vit", "unet"])  # pvt: the experiments above
def test_default_config_fast_dev_run_per_model_family(family, train_config):
    _, summary = fast_dev_run(train_config, *TINY_MODEL[family], "model.aux_head=true")  # + aux loss
    assert summary["steps"] == 1
    assert not math.isnan(summary["final"]["aAcc"])
