"""``python train.py`` end to end in a subprocess: checkpoints, the offline W&B run, the summary, sweeps."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from train_overrides import REPO, TINY_DATA, TINY_MODEL
from wandb_records import artifacts, config, history
from wandb_records import summary as wandb_summary
from warm_processes import run as run_command

from segattn.data.synthetic import SYNTHETIC_CLASSES
from segattn.models import build_model

pytestmark = pytest.mark.slow
QUIET = ["callbacks.rich_model_summary=null", "trainer.accelerator=cpu"]


def train_py(cwd: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run train.py from ``cwd`` (not the repo: paths must not depend on the working directory)."""
    env = {**os.environ, "WANDB_SILENT": "true"}
    command = [sys.executable, str(REPO / "train.py"), *overrides]
    result = run_command(command, cwd=cwd, env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def strict_json(constant: str) -> None:
    """``json.loads``'s ``parse_constant``: NaN and Infinity are not standard JSON."""
    raise AssertionError(f"{constant} in a JSON file")


def test_train_writes_checkpoints_wandb_run_and_summary(tmp_path):
    run_dir = tmp_path / "run"
    result = train_py(
        tmp_path,
        *TINY_DATA,
        *TINY_MODEL["vit"],
        *QUIET,
        "trainer.max_epochs=2",
        "trainer.log_every_n_steps=1",
        "callbacks.wandb_panel.num_images=3",
        f"hydra.run.dir={run_dir}",
        f"paths.log_dir={tmp_path}",
    )
    assert "segattn run summary" in result.stdout
    # test_after_fit: the best checkpoint scored on the test split, in the summary (printed and saved).
    assert "test mIoU / mAcc / aAcc" in result.stdout and "4 images of split 'test'" in result.stdout
    summary = json.loads((run_dir / "summary.json").read_text(), parse_constant=strict_json)
    assert set(summary["test"]["IoU"]) == {name for name, _ in SYNTHETIC_CLASSES}
    assert 0 <= summary["test"]["mIoU"] <= 100
    assert OmegaConf.load(run_dir / ".hydra/config.yaml").model.name == "vit"

    # Checkpoints: best by val/mIoU and last; the model is rebuilt from the checkpoint alone.
    best, last = run_dir / "checkpoints/best.ckpt", run_dir / "checkpoints/last.ckpt"
    assert best.is_file() and last.is_file()
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    meta = ckpt["segattn"]
    assert set(meta) == {"format_version", "model", "data", "inference", "versions", "wandb_run_id"}
    # The versions that trained it, in the checkpoint's record and in the run directory alike.
    assert meta["versions"] == json.loads((run_dir / "environment.json").read_text())
    assert meta["versions"]["torch"] == torch.__version__ and meta["inference"]["mode"] == "whole"
    assert meta["data"]["config"]["image_size"] == [32, 32]  # what eval.py rebuilds the dataset from
    assert meta["data"]["classes"] == [name for name, _ in SYNTHETIC_CLASSES]
    assert meta["data"]["ignore_index"] == 255 and len(meta["data"]["palette"]) == 5
    model = build_model(**meta["model"])
    prefix = "model."
    model.load_state_dict(
        {k[len(prefix) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
    )
    assert (meta["model"]["name"], meta["model"]["attention"], meta["model"]["num_classes"]) == (
        "vit",
        "flatten",
        5,
    )

    # The offline W&B run: same id as in the checkpoint, resolved config, metric history, mask overlays.
    wandb_dirs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_dirs) == 1 and wandb_dirs[0].name.endswith(meta["wandb_run_id"])
    run_file = next(wandb_dirs[0].glob("run-*.wandb"))
    logged_config = config(run_file)
    assert logged_config["model"]["embed_dim"] == 32
    assert logged_config["paths"]["output_dir"] == str(run_dir)  # resolved, not an interpolation
    rows = history(run_file)
    val_miou = [row["val/mIoU"] for row in rows if "val/mIoU" in row]
    assert len(val_miou) == 2
    checkpoint_key = next(key for key, state in ckpt["callbacks"].items() if "best_model_score" in state)
    scores = [ckpt["callbacks"][checkpoint_key]["best_model_score"]]
    assert max(val_miou) == pytest.approx(scores[0].item(), abs=1e-4)
    assert any("train/loss" in row and "train/lr" in row for row in rows)
    panels = [row for row in rows if "val/examples.all_masks" in row]
    assert len(panels) == 2  # every epoch (every_n_epochs=1)
    overlays = panels[-1]["val/examples.all_masks"]
    assert len(overlays) == 3 and all({"ground_truth", "prediction"} <= set(o) for o in overlays)
    for overlay in overlays:
        assert (wandb_dirs[0] / "files" / overlay["prediction"]["path"]).is_file()
    assert any("val/per_class.nrows" in row for row in rows)
    tested = [row for row in rows if "test/mIoU" in row]
    assert len(tested) == 1 and tested[0]["test/mIoU"] == pytest.approx(summary["test"]["mIoU"], abs=1e-4)
    assert {"test/mDice", "test/fwIoU"} <= set(tested[0])

    # What a W&B user reads afterwards: the best score and its step in the summary, per-class IoU curves,
    # the test's per-class table and confusion matrix, the environment, the best checkpoint as a model.
    class_names = [name for name, _ in SYNTHETIC_CLASSES]
    logged_summary = wandb_summary(run_file)
    assert logged_summary["val/mIoU"] == pytest.approx(max(val_miou), abs=1e-4)
    assert (
        logged_summary["best_step"] == summary["best_step"] == ckpt["callbacks"][checkpoint_key]["best_step"]
    )
    curves = [row for row in rows if "val/mIoU" in row]
    assert all({f"val/IoU/{name}" for name in class_names} <= set(row) for row in curves)
    assert {f"test/IoU/{name}" for name in class_names} <= set(tested[0])
    assert any(row.get("test/per_class.nrows") == len(class_names) for row in rows)
    assert any("test/confusion_table.nrows" in row for row in rows)
    assert logged_config["environment"] == meta["versions"]
    model_artifact = artifacts(run_file)[f"model-{meta['wandb_run_id']}"]
    assert model_artifact == ("model", ["best.ckpt"])


def test_multirun_sweeps_attention_variants(tmp_path):
    variants = ["softmax", "efficient", "taylor", "flatten"]
    train_py(
        tmp_path,
        "-m",
        f"attention={','.join(variants)}",
        "debug=fdr",
        "logger=none",
        *TINY_DATA,
        *TINY_MODEL["vit"],
        *QUIET,
        "callbacks.rich_progress_bar=null",
        f"paths.log_dir={tmp_path}",
    )
    jobs = sorted((tmp_path / "multiruns").glob("*/*_vit-*-synthetic"))
    assert [job.name for job in jobs] == [f"{i}_vit-{name}-synthetic" for i, name in enumerate(variants)]
    for job, name in zip(jobs, variants, strict=True):
        assert OmegaConf.load(job / ".hydra/config.yaml").attention.name == name
