"""``trainer=ddp_cpu``: two gloo processes train and validate through train.py; the validation mIoU,
summed across ranks, equals a single-process evaluation of the same weights on the whole val set."""

import csv
import os
import sys

import pytest
import torch
from omegaconf import OmegaConf
from train_overrides import REPO, TINY_DATA, TINY_MODEL
from warm_processes import run as run_command

from segattn.data import SegDataModule
from segattn.evaluation.metrics import SegmentationMetric
from segattn.inference.infer import infer
from segattn.models import build_model

pytestmark = pytest.mark.slow


def evaluate_single_process(ckpt_path, data_cfg) -> float:
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    model = build_model(**ckpt["segattn"]["model"])
    prefix = "model."
    model.load_state_dict(
        {k[len(prefix) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
    )
    model.eval()
    datamodule = SegDataModule(**data_cfg)
    metric = SegmentationMetric(model.num_classes, datamodule.ignore_index)
    for batch in datamodule.val_dataloader():
        metric.update(infer(model, batch["image"], model.num_classes).argmax(1), batch["mask"])
    return metric.compute()["mIoU"].item()


def test_ddp_cpu_two_processes_sync_the_metric(tmp_path):
    overrides = [
        "trainer=ddp_cpu",
        *TINY_DATA,
        *TINY_MODEL["vit"],
        "data.num_val=6",  # 3 images per rank, none repeated by the distributed sampler
        "data.val_batch_size=1",
        "trainer.max_epochs=1",
        "logger=csv",
        "callbacks.rich_progress_bar=null",
        "callbacks.rich_model_summary=null",
        f"paths.log_dir={tmp_path}",
    ]
    result = run_command(
        [sys.executable, str(REPO / "train.py"), *overrides],
        cwd=tmp_path,
        env={**os.environ, "WANDB_SILENT": "true"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Both ranks wrote into one Hydra run dir (the child gets hydra.run.dir from Lightning's launcher).
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1, run_dirs
    run_dir = run_dirs[0]
    assert (run_dir / "train.log").is_file() and (run_dir / "train_ddp_process_1.log").is_file()
    assert result.stdout.count("segattn run summary") == 1  # rank zero only

    with open(run_dir / "csv/metrics.csv") as handle:
        ddp_miou = [float(row["val/mIoU"]) for row in csv.DictReader(handle) if row.get("val/mIoU")]
    assert len(ddp_miou) == 1
    data_cfg = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra/config.yaml").data)
    single = evaluate_single_process(run_dir / "checkpoints/last.ckpt", data_cfg)
    assert ddp_miou[0] == pytest.approx(single, abs=1e-4)
