"""A short CamVid training (downscaled, 60 steps) beats predicting the most frequent class
by a wide margin. Runs only where the team's copy of CamVid is present."""

import numpy as np
import pytest
from PIL import Image
from train_overrides import QUIET, REPO

from segattn.training.run import run

CAMVID = REPO.parent / "shared" / "data" / "camvid"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.camvid,
    pytest.mark.skipif(not CAMVID.is_dir(), reason=f"{CAMVID} not present"),
]
NUM_CLASSES, IGNORE = 11, 255


def label_counts(split: str) -> np.ndarray:
    counts = np.zeros(256, dtype=np.int64)
    for stem in (CAMVID / f"{split}.txt").read_text().split():
        counts += np.bincount(
            np.asarray(Image.open(CAMVID / "masks" / split / f"{stem}.png")).ravel(), minlength=256
        )
    return counts


def most_frequent_class_miou() -> float:
    """mIoU (percent) of predicting everywhere the class most frequent in the training masks: that
    class's IoU is its share of the valid val pixels; every other class present in val scores 0."""
    majority = int(label_counts("train")[:NUM_CLASSES].argmax())
    val = label_counts("val")[:NUM_CLASSES]
    present = np.count_nonzero(val)
    return 100 * val[majority] / val.sum() / present


def test_short_camvid_training_beats_the_majority_class(train_config):
    baseline = most_frequent_class_miou()
    cfg = train_config(
        *QUIET,
        "data=camvid",
        f"data.root={CAMVID}",
        "model=pvt",  # a narrow one-block-per-stage PVT: quick on 2 CPU cores
        "model.embed_dims=[16,32,64,64]",
        "model.depths=[1,1,1,1]",
        "model.num_heads=[1,1,2,2]",
        "model.head_channels=64",
        "attention=efficient",
        "logger=none",
        # 480x360 -> 96x72 for training and validation, no photometric jitter, in-process loading.
        "data.base_size=[96,72]",
        "data.ratio_range=[1.0,1.0]",
        "data.crop_size=[72,96]",
        "data.eval_short_side=72",
        "data.photometric=false",
        "data.num_workers=0",
        "data.persistent_workers=false",
        "data.pin_memory=false",
        "data.batch_size=8",
        "data.val_batch_size=8",
        # 3 x 20 steps, one validation over all 101 val images at the end.
        "trainer.max_epochs=3",
        "trainer.limit_train_batches=20",
        "trainer.check_val_every_n_epoch=3",
        "trainer.num_sanity_val_steps=0",
        "optimizer.lr=2e-3",
        "scheduler.warmup_steps=10",
    )
    summary = run(cfg)
    assert baseline < 5  # CamVid's most frequent class (road) covers about a quarter of the pixels
    assert summary["best_mIoU"] > baseline + 10, (summary["best_mIoU"], baseline)  # measured: about 20
