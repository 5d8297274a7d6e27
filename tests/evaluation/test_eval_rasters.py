"""eval.py with data=raster: each raster streamed strip by strip scores the confusion matrix of the
in-memory slide prediction against its label raster, counted independently with numpy; bad settings are
one line naming the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from raster_fixtures import CLASSES, label_raster, make_raster_dataset, scene
from train_overrides import compose_config

from segattn.checkpoints.loading import save_exported
from segattn.evaluation.command import run as evaluate
from segattn.images import default_palette
from segattn.inference.image_io import normalize
from segattn.inference.infer import infer
from segattn.inference.trained import open_model
from segattn.models import build_model
from segattn.record import ModelRecord

SIZES = [(300, 520), (130, 170)]  # the second is smaller than the window on one side
SLIDE = ["inference.mode=slide", "inference.crop=[128,160]", "inference.stride=[96,120]"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """A raster dataset (test split only) and a tiny random ViT exported as safetensors."""
    root = tmp_path_factory.mktemp("eval_rasters")
    torch.manual_seed(0)
    model = build_model(
        "vit",
        num_classes=3,
        attention="linear",
        embed_dim=16,
        depth=1,
        num_heads=2,
        patch_size=8,
        img_size=32,
    ).eval()
    record = ModelRecord(model.config, CLASSES, default_palette(3), dataset="raster")
    save_exported(model, record, root / "model")
    return {"model": root / "model", "data": make_raster_dataset(root / "data", {"test": SIZES})}


def eval_config(out: Path, *overrides: str):
    return compose_config([f"paths.log_dir={out}", f"paths.output_dir={out}", *overrides], "eval")


def expected_confusion(model_dir: Path, flip: bool) -> np.ndarray:
    """In-memory infer(mode=slide) of each whole raster, labels counted with numpy, ignore left out."""
    model = open_model(model_dir)
    confusion = np.zeros((3, 3), dtype=np.int64)
    for index, size in enumerate(SIZES):
        images = torch.from_numpy(
            normalize(scene(size, index).transpose(1, 2, 0), model.record.mean, model.record.std)
        )
        with torch.inference_mode():
            logits = infer(model.network, images, 3, "slide", (128, 160), (96, 120), 4, flip=flip)
        pred, label = logits[0].argmax(0).numpy().ravel(), label_raster(size, index)[0].ravel()
        valid = label != 255
        confusion += np.bincount(label[valid] * 3 + pred[valid], minlength=9).reshape(3, 3)
    return confusion


@pytest.mark.parametrize("flip", [False, True])
def test_streamed_raster_scores_equal_in_memory_slide_counts(setup, tmp_path, flip):
    overrides = [f"checkpoint={setup['model']}", "data=raster", f"data.root={setup['data']}", *SLIDE]
    payload = evaluate(eval_config(tmp_path, *overrides, f"inference.flip={str(flip).lower()}"))
    assert payload["images"] == 2 and payload["dataset"] == "raster"
    np.testing.assert_array_equal(np.asarray(payload["confusion"]), expected_confusion(setup["model"], flip))
    assert (tmp_path / "metrics.json").is_file() and (tmp_path / "confusion.png").is_file()


def test_whole_mode_on_rasters_is_refused_naming_the_key(setup, tmp_path):
    overrides = [f"checkpoint={setup['model']}", "data=raster", f"data.root={setup['data']}"]
    with pytest.raises(
        ValueError, match=r"inference.mode='whole': data=raster scores whole rasters strip by"
    ):
        evaluate(eval_config(tmp_path, *overrides))
    assert not (tmp_path / "metrics.json").exists()
