"""CamVid from the team's shared copy (../shared/data/camvid next to the repo): every split loads with the
class histogram that a plain PIL + numpy count over the raw masks gives. Skipped when the copy is absent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from segattn.data import SegDataModule
from segattn.data.scan import format_report, scan_splits

CAMVID = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "camvid").resolve()
pytestmark = [
    pytest.mark.camvid,
    pytest.mark.skipif(not (CAMVID / "masks").is_dir(), reason=f"CamVid not found at {CAMVID}"),
]


def _raw_histogram(split: str) -> tuple[int, np.ndarray, int]:
    """(files, pixels of classes 0..10, void pixels) from the mask PNGs (value = class, 255 = void)."""
    counts = np.zeros(256, dtype=np.int64)
    files = sorted((CAMVID / "masks" / split).glob("*.png"))
    for path in files:
        counts += np.bincount(np.asarray(Image.open(path)).ravel(), minlength=256)
    assert counts[11:255].sum() == 0  # the shared copy stores void as 255 only
    return len(files), counts[:11], int(counts[255])


def test_camvid_splits_load_with_the_right_histogram():
    dm = SegDataModule("camvid", root=CAMVID, num_classes=11)
    reports = scan_splits(dm)
    assert [r.split for r in reports] == ["train", "val", "test"]
    for report in reports:
        files, classes, void = _raw_histogram(report.split)
        assert report.count == files and report.problems == []
        np.testing.assert_array_equal(report.histogram, classes)
        assert report.ignored == void
        assert dict(report.sizes) == {(480, 360): files}
    assert [r.count for r in reports] == [367, 101, 78]  # as documented in the copy's README
    text = format_report(dm, CAMVID, reports)
    assert "no problems found" in text and "480x360 (367)" in text


def test_camvid_val_item_is_full_resolution_with_raw_labels():
    dm = SegDataModule("camvid", root=CAMVID, num_classes=11)
    dm.setup("validate")
    item = dm.datasets["val"][0]
    assert item["image"].shape == (3, 360, 480) and item["path"].endswith(".png")
    assert set(item["mask"].unique().tolist()) <= set(range(11)) | {255}
    raw = np.asarray(Image.open(CAMVID / "masks" / "val" / Path(item["path"]).name))
    np.testing.assert_array_equal(item["mask"].numpy(), raw)  # eval keeps full resolution, labels as stored
    assert torch.isfinite(item["image"]).all()
