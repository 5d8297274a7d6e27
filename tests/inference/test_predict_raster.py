"""Streaming prediction of GeoTIFFs: the in-memory slide mask exactly, georeferencing kept, resumable by
strip, and bad rasters named with their window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from export_fixtures import PALETTE, tiny_model, tiny_opened, tiny_record
from PIL import Image
from raster_fixtures import CRS_UTM, TRANSFORM, read_band, scene, write_geotiff
from rasterio.crs import CRS

from segattn.checkpoints.loading import save_exported
from segattn.inference.image_io import normalize
from segattn.inference.infer import infer
from segattn.inference.raster_predict import outputs, predict_raster
from segattn.inference.trained import open_model
from segattn.predict import main, predict_rasters
from segattn.raster_io import check_pair, raster_env
from segattn.tiling import SlideSettings

SIZE = (1500, 2300)  # non-square, not a multiple of the window, six strips of 256 rows
SMALL_SIZE = (700, 1100)
SETTINGS = SlideSettings(crop=(512, 640), stride=(384, 480), crop_batch_size=3)
SMALL = SlideSettings(crop=(64, 64), stride=(64, 64))


def slide_mask(model, rgb: np.ndarray, settings: SlideSettings) -> np.ndarray:
    """The in-memory reference: ``infer(mode="slide")`` on the whole normalised image, argmax."""
    images = torch.from_numpy(normalize(rgb, model.record.mean, model.record.std))
    with torch.inference_mode():
        logits = infer(
            model.network, images, model.record.num_classes, "slide", settings.crop, settings.stride,
            settings.crop_batch_size, flip=settings.flip,
        )  # fmt: skip
    return logits[0].argmax(0).numpy()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    model = tiny_model("linear", seed=5)
    directory = tmp_path_factory.mktemp("model") / "st"
    save_exported(model, tiny_record(model), directory)
    return directory


@pytest.fixture(scope="module")
def raster(tmp_path_factory) -> Path:
    return write_geotiff(tmp_path_factory.mktemp("raster") / "scene.tif", scene(SIZE))


@pytest.fixture(scope="module")
def small_raster(tmp_path_factory) -> Path:
    """Three strips (256, 256 and 188 rows): enough to stop after two."""
    return write_geotiff(tmp_path_factory.mktemp("raster") / "small.tif", scene(SMALL_SIZE))


def test_cli_streams_a_geotiff_to_the_in_memory_slide_mask_with_its_georeferencing(
    exported, raster, tmp_path
):
    out = tmp_path / "out"
    args = [
        f"checkpoint={exported}",
        f"input={raster}",
        f"out={out}",
        "inference.mode=slide",
        "inference.crop=[512,640]",
    ]
    args += ["inference.stride=[384,480]", "inference.crop_batch_size=3"]
    assert main(args) == 0
    model = open_model(exported)
    rgb = scene(SIZE).transpose(1, 2, 0)
    with rasterio.open(out / "masks" / "scene.tif") as mask:
        assert (mask.crs, mask.transform, mask.shape) == (CRS_UTM, TRANSFORM, SIZE)
        assert mask.profile["tiled"] and mask.profile["compress"] == "deflate"
        np.testing.assert_array_equal(mask.read(1), slide_mask(model, rgb, SETTINGS))
        assert mask.colormap(1)[1] == (*PALETTE[1], 255)
    overview = np.asarray(Image.open(out / "overviews" / "scene.png"))
    assert overview.shape == (668, 1024, 3)
    assert not list((out / "masks").glob(".*"))  # no partial file or progress record left


def test_a_killed_run_resumes_at_its_strip_and_ends_with_the_uninterrupted_mask(small_raster, tmp_path):
    raster = small_raster
    model = tiny_opened(tiny_model("linear", seed=5))
    settings = SlideSettings(crop=(256, 256), stride=(192, 192), crop_batch_size=3, flip=True)
    whole = predict_raster(model, raster, tmp_path / "whole", settings)

    class SimulatedKillError(Exception):
        pass

    def kill_after_two(rows: int) -> None:
        if rows == 512:
            raise SimulatedKillError

    out, seen = tmp_path / "resumed", []
    with pytest.raises(SimulatedKillError):
        predict_raster(model, raster, out, settings, after_strip=kill_after_two)
    files = outputs(out, raster)
    assert not files["mask"].exists() and files["partial"].exists()
    predict_raster(model, raster, out, settings, on_windows=lambda done, total: seen.append(done))
    assert seen[0] == 2 * 12 + 3  # began at the first window below row 512 (12 above it, two views)
    np.testing.assert_array_equal(read_band(files["mask"]), read_band(whole))
    rgb = scene(SMALL_SIZE).transpose(1, 2, 0)  # flip TTA streamed is flip TTA in memory
    np.testing.assert_array_equal(read_band(whole), slide_mask(model, rgb, settings))


def stop_after_first_strip(model, raster: Path, out: Path, settings: SlideSettings) -> None:
    """A run stopped right after its first strip is recorded, as a kill there would stop it."""

    def stop(rows: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        predict_raster(model, raster, out, settings, after_strip=stop)


def windows_at_first_batch(model, raster: Path, out: Path, settings: SlideSettings) -> tuple[int, Path]:
    """(windows counted after the run's first batch, the mask): a fresh run counts one batch there."""
    seen: list[int] = []
    mask = predict_raster(model, raster, out, settings, lambda done, total: seen.append(done))
    return seen[0], mask


def test_a_partial_mask_left_unreadable_starts_over(small_raster, tmp_path):
    model = tiny_opened(tiny_model("linear", seed=5))
    settings = SlideSettings(crop=(256, 256), stride=(256, 256), crop_batch_size=4)
    stop_after_first_strip(model, small_raster, tmp_path, settings)
    partial = outputs(tmp_path, small_raster)["partial"]
    partial.write_bytes(partial.read_bytes()[:200])  # a kill in the middle of a write
    first, mask = windows_at_first_batch(model, small_raster, tmp_path, settings)
    assert first == 4
    whole = predict_raster(model, small_raster, tmp_path / "whole", settings)
    np.testing.assert_array_equal(read_band(mask), read_band(whole))


def test_changed_settings_start_over_instead_of_resuming(small_raster, tmp_path):
    model = tiny_opened(tiny_model("linear", seed=5))
    stop_after_first_strip(model, small_raster, tmp_path, SlideSettings((512, 512), (512, 512)))
    other = SlideSettings(crop=(512, 512), stride=(256, 512), crop_batch_size=4)
    assert windows_at_first_batch(model, small_raster, tmp_path, other)[0] == 4


def test_bad_band_count_is_one_line_naming_the_file_and_nothing_is_written(exported, tmp_path):
    two = write_geotiff(tmp_path / "two.tif", scene((64, 96))[:2])
    out = tmp_path / "out"
    code = main(
        [f"checkpoint={exported}", f"input={two}", f"out={out}", "inference.mode=slide", "inference.crop=64"]
    )
    assert code == 1
    assert not (out / "masks").exists()
    with pytest.raises(ValueError, match=r"raster .*two\.tif has 2 bands .*expected 1 \(gray\), 3 \(RGB\)"):
        predict_raster(tiny_opened(tiny_model("linear")), two, out, SMALL)


@pytest.mark.parametrize(
    ("overrides", "message", "status"),
    [
        (
            ["checkpoint=exported/model.onnx"],
            "checkpoint=exported/model.onnx: streaming a TIFF by window needs",
            1,
        ),
        (
            ["inference.scales=[0.5,1.0]"],
            "inference.scales=[0.5, 1.0]: a raster streamed by window takes flip TTA only",
            1,
        ),
        (
            ["inference.crop=null"],
            "inference.mode=slide needs inference.crop=H or inference.crop=[H,W]",
            2,
        ),  # a config error, checked first
    ],
)
def test_settings_a_raster_cannot_stream_with_are_one_line_naming_the_key(
    exported, small_raster, tmp_path, capsys, overrides, message, status
):
    args = [
        f"checkpoint={exported}",
        f"input={small_raster}",
        f"out={tmp_path / 'out'}",
        "inference.mode=slide",
        "inference.crop=64",
    ]
    assert main([*args, *overrides]) == status
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_sixteen_bit_samples_are_refused_naming_the_type(tmp_path):
    deep = write_geotiff(tmp_path / "deep.tif", scene((64, 96)).astype(np.uint16) * 256)
    with pytest.raises(ValueError, match=r"deep\.tif holds uint16 samples; expected uint8"):
        predict_raster(tiny_opened(tiny_model("linear")), deep, tmp_path / "out", SMALL)


def test_a_corrupt_tile_names_the_file_and_the_window(tmp_path):
    path = write_geotiff(tmp_path / "corrupt.tif", scene((512, 512)))
    with raster_env(), rasterio.open(path) as dataset:  # the bytes of tile (row 1, column 1)
        offset = int(dataset.get_tag_item("BLOCK_OFFSET_1_1", "TIFF", bidx=1))
        length = int(dataset.get_tag_item("BLOCK_SIZE_1_1", "TIFF", bidx=1))
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(b"\xff" * length)
    model = tiny_opened(tiny_model("linear"))
    settings = SlideSettings(crop=(256, 256), stride=(256, 256))
    with pytest.raises(
        ValueError, match=r"cannot read raster .*corrupt\.tif at rows 256:512, columns 256:512"
    ):
        predict_raster(model, path, tmp_path / "out", settings)
    assert not (tmp_path / "out" / "masks" / "corrupt.tif").exists()


def test_a_mask_on_another_grid_is_named(tmp_path):
    image = write_geotiff(tmp_path / "image.tif", scene((64, 96)))
    smaller = write_geotiff(tmp_path / "smaller.tif", scene((64, 80))[:1])
    moved = write_geotiff(tmp_path / "moved.tif", scene((64, 96))[:1], crs=CRS.from_epsg(4326))
    check_pair(image, write_geotiff(tmp_path / "same.tif", scene((64, 96))[:1]))
    with pytest.raises(
        ValueError, match=r"mask .*smaller\.tif is 64×80 pixels; its image .*image\.tif is 64×96"
    ):
        check_pair(image, smaller)
    with pytest.raises(ValueError, match=r"mask .*moved\.tif has CRS EPSG:4326; its image .*has EPSG:32633"):
        check_pair(image, moved)


def test_a_stream_value_that_is_not_a_boolean_is_named(tmp_path, capsys):
    assert main(["checkpoint=m", "input=i.tif", f"out={tmp_path / 'out'}", "stream=maybe"]) == 2
    assert "stream='maybe': expected true or false" in capsys.readouterr().err


def test_a_resumed_stream_says_where_it_continues(small_raster, tmp_path, capsys):
    """It continued silently before (issue 27)."""
    model = tiny_opened(tiny_model("linear", seed=5))
    out = tmp_path / "out"
    stop_after_first_strip(model, small_raster, out, SMALL)
    assert predict_rasters(model, [small_raster], out, SMALL) == (1, [])
    partial = outputs(out, small_raster)["partial"]
    lines = capsys.readouterr().err.splitlines()  # GDAL's notes may reach a log handler of an earlier test
    assert [line for line in lines if line.startswith("segattn.predict:")] == [
        f"segattn.predict: {small_raster}: continuing at row 256 of 700 in {partial}, where an earlier "
        "run with the same input, model and settings stopped"
    ]
