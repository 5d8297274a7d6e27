"""data=raster: windows read from GeoTIFF pairs are the rasters' own pixels and labels, training windows
go through the folder dataset's augmentation, tiled splits count every pixel once, and the doctor
reports a histogram by window and names pairs on different grids."""

from __future__ import annotations

import numpy as np
import pytest
import rasterio
from PIL import Image
from raster_fixtures import CLASSES, label_raster, make_raster_dataset, read_band, scene, write_geotiff
from rasterio.crs import CRS

from segattn.data import DataError, SegDataModule
from segattn.data.raster import RasterLayout, grid_windows
from segattn.doctor import main as doctor

SIZES = {"train": [(300, 520), (180, 200)], "val": [(300, 520), (130, 170)], "test": [(140, 150)]}
OPTIONS = {"window_size": [128, 160], "windows_per_split": 12}


def window_of(description: str) -> tuple[slice, slice]:
    """'.../s00.tif at rows 10:138, columns 4:164' -> the numpy slices of that window."""
    rows, columns = description.split(" at rows ")[1].split(", columns ")
    top, bottom = map(int, rows.split(":"))
    left, right = map(int, columns.split(":"))
    return slice(top, bottom), slice(left, right)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_raster_dataset(tmp_path_factory.mktemp("rasters"), SIZES)


def test_training_windows_are_the_rasters_pixels_and_labels(root):
    source = RasterLayout(root, **OPTIONS)
    dataset = source.dataset("train")
    assert len(dataset) == 12 and source.classes == CLASSES
    for index in range(len(dataset)):
        rows, columns = window_of(dataset.describe(index))
        number = int(dataset.describe(index).split("/s")[-1][:2])
        size = SIZES["train"][number]
        assert (rows.stop - rows.start, columns.stop - columns.start) == (
            min(128, size[0]),
            min(160, size[1]),
        )
        np.testing.assert_array_equal(
            dataset.load_image(index), scene(size, number)[:, rows, columns].transpose(1, 2, 0)
        )
        np.testing.assert_array_equal(dataset.load_mask(index), label_raster(size, number)[0, rows, columns])
    again = RasterLayout(root, **OPTIONS).dataset("train")
    assert [again.describe(i) for i in range(12)] == [dataset.describe(i) for i in range(12)]  # seeded


def test_the_datamodule_augments_raster_windows_like_any_dataset(root):
    datamodule = SegDataModule(name="raster", root=root, crop_size=[64, 64], batch_size=4, **OPTIONS)
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["image"].shape == (4, 3, 64, 64) and batch["mask"].shape == (4, 64, 64)
    assert set(batch["mask"].unique().tolist()) <= {0, 1, 2, 255}


def test_a_tiled_split_counts_every_labelled_pixel_once(root):
    dataset = RasterLayout(root, **OPTIONS).dataset("val")
    counted = np.zeros(len(CLASSES) + 1, dtype=np.int64)
    for index in range(len(dataset)):
        mask = dataset.load_mask(index)
        counted += np.bincount(np.where(mask == 255, 3, mask).ravel(), minlength=4)
    expected = sum(
        np.bincount(np.where(m == 255, 3, m).ravel(), minlength=4)
        for m in (read_band(path) for path in sorted((root / "masks" / "val").iterdir()))
    )
    assert counted.tolist() == expected.tolist()
    assert grid_windows(300, 520, (128, 160))[-2:] == [(256, 300, 320, 480), (256, 300, 480, 520)]


def test_the_doctor_reports_a_histogram_by_window_and_names_pairs_on_other_grids(root, tmp_path, capsys):
    args = ["data=raster", f"data.root={root}", "data.window_size=[128,160]", "data.windows_per_split=12"]
    assert doctor(args) == 0
    report = capsys.readouterr().out
    assert "no problems found" in report and "field" in report
    bad = make_raster_dataset(tmp_path / "bad", {"train": [(64, 96)], "val": [(64, 96)], "test": [(64, 96)]})
    write_geotiff(bad / "masks" / "val" / "s00.tif", label_raster((64, 80)))
    write_geotiff(bad / "masks" / "test" / "s00.tif", label_raster((64, 96)), crs=CRS.from_epsg(4326))
    assert doctor(["data=raster", f"data.root={bad}", "data.window_size=[32,32]"]) == 1
    report = capsys.readouterr().out
    assert "mask" in report and "val/s00.tif is 64×80 pixels; its image" in report
    assert "test/s00.tif has CRS EPSG:4326; its image" in report


def test_labels_outside_the_classes_name_the_mask_and_the_window(tmp_path):
    root = make_raster_dataset(tmp_path, {"train": [(64, 96)]})
    labels = label_raster((64, 96))
    labels[0, 40, 50] = 9
    write_geotiff(root / "masks" / "train" / "s00.tif", labels)
    dataset = RasterLayout(root, window_size=[64, 96], windows_per_split=1).dataset("train")
    with pytest.raises(
        DataError, match=r"mask .*s00\.tif at rows 0:64, columns 0:96 has unknown label values \{9\}"
    ):
        dataset.load_mask(0)


def test_a_non_tiff_image_is_refused_by_name(tmp_path):
    root = make_raster_dataset(tmp_path, {"train": [(64, 96)]})
    with rasterio.open(root / "images" / "train" / "s00.tif") as image:
        bands = image.read()
    Image.fromarray(bands.transpose(1, 2, 0)).save(root / "images" / "train" / "s01.png")
    with pytest.raises(DataError, match=r"image .*s01\.png is not a TIFF raster"):
        RasterLayout(root).dataset("train")


def test_raster_options_out_of_range_are_named_before_reading(root, capsys):
    assert doctor(["data=raster", f"data.root={root}", "data.windows_per_split=0"]) == 2
    assert "data.windows_per_split=0: expected an integer >= 1" in capsys.readouterr().err
