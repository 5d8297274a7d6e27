"""Torch-free helpers of predict: normalisation, masks, overlays, image discovery, reading inputs."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from segattn.images import DataError
from segattn.inference.image_io import drawn_classes, find_images, normalize, overlay, read_input, save_mask


def test_normalize_is_pixel_over_255_minus_mean_over_std():
    rgb = np.array([[[255, 0, 51]]], dtype=np.uint8)
    out = normalize(rgb, [0.5, 0.5, 0.2], [0.5, 0.25, 0.1])
    expected = [(1 - 0.5) / 0.5, (0 - 0.5) / 0.25, (0.2 - 0.2) / 0.1]
    np.testing.assert_allclose(out[0, :, 0, 0], expected, atol=1e-6)
    assert out.shape == (1, 3, 1, 1) and out.dtype == np.float32


def test_read_input_converts_and_names_unreadable_files(tmp_path):
    Image.fromarray(np.full((5, 7), 9, np.uint8)).save(tmp_path / "gray.png")
    Image.fromarray(np.zeros((5, 7, 4), np.uint8)).save(tmp_path / "rgba.png")
    assert read_input(tmp_path / "gray.png").shape == (5, 7, 3)
    assert read_input(tmp_path / "rgba.png").shape == (5, 7, 3)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(ValueError, match=r"broken\.png"):
        read_input(tmp_path / "broken.png")


def test_masks_keep_class_indices_and_overlay_blends_palette(tmp_path):
    mask = np.array([[0, 1], [2, 300]])
    save_mask(mask, tmp_path / "m.png")
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "m.png")), mask)  # 16-bit when > 255
    rgb = np.full((1, 2, 3), 100, np.uint8)
    blended = overlay(rgb, np.array([[0, 1]]), [(0, 0, 0), (200, 100, 0)], alpha=0.5)
    np.testing.assert_array_equal(blended, [[[50, 50, 50], [150, 100, 50]]])


def test_overlay_leaves_background_and_ignored_pixels_undimmed():
    rgb = np.full((1, 3, 3), 100, np.uint8)
    mask = np.array([[0, 1, 255]])  # background, a drawn class, the ignore index
    blended = overlay(rgb, mask, [(0, 0, 0), (200, 100, 0)], alpha=0.5, drawn=[1])
    np.testing.assert_array_equal(blended, [[[100, 100, 100], [150, 100, 50], [100, 100, 100]]])


def float32_overlay(rgb, mask, palette, alpha, drawn):
    """The per-pixel float32 blend that ``overlay``'s table must reproduce bit for bit."""
    colours = np.asarray(palette, dtype=np.float32)[np.where(np.isin(mask, drawn), mask, 0)]
    blended = (rgb.astype(np.float32) * (1 - alpha) + colours * alpha).round().astype(np.uint8)
    return np.where(np.isin(mask, drawn)[..., None], blended, rgb)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 0.77, 1.0, np.float32(0.35), np.float64(0.6)])
@pytest.mark.parametrize(
    ("dtype", "low", "high", "drawn"),
    [
        (np.uint8, 0, 256, [1, 2, 4]),  # the ignore index 255 and values past the palette among them
        (np.uint8, 0, 5, None),
        (np.uint16, 0, 300, [0, 3]),
        (np.int64, -3, 8, [4, 1]),
        (np.int64, 0, 5, []),
    ],
)
def test_overlay_is_the_float32_blend_bit_for_bit(alpha, dtype, low, high, drawn):
    rng = np.random.default_rng(7)
    palette = [tuple(int(v) for v in colour) for colour in rng.integers(0, 256, (5, 3))]
    rgb = rng.integers(0, 256, (19, 23, 3), dtype=np.uint8)
    rgb[0, :3] = [[0, 0, 0], [255, 255, 255], [128, 127, 1]]
    mask = rng.integers(low, high, (19, 23)).astype(dtype)
    expected = float32_overlay(rgb, mask, palette, alpha, list(range(5)) if drawn is None else drawn)
    result = overlay(rgb, mask, palette, alpha, drawn)
    assert result.dtype == np.uint8
    np.testing.assert_array_equal(result, expected)


def test_overlay_classes_default_to_all_but_background_and_unknown_ones_are_named():
    classes = ["Background", "thing", "stuff"]
    assert drawn_classes(classes, None) == [1, 2]
    assert drawn_classes(["road", "car"], None) == [0, 1]
    assert drawn_classes(classes, ["stuff", 0]) == [2, 0] and drawn_classes(classes, "thing") == [1]
    with pytest.raises(ValueError, match=r"^overlay_classes: 'sky' is not a class of this model; .*thing"):
        drawn_classes(classes, ["sky"])
    with pytest.raises(ValueError, match=r"indices 0\.\.2$"):
        drawn_classes(classes, [3])


def test_find_images_accepts_file_dir_and_glob(tmp_path):
    for name in ("b.png", "a.jpg", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in find_images(str(tmp_path))] == ["a.jpg", "b.png"]
    assert [p.name for p in find_images(str(tmp_path / "*.png"))] == ["b.png"]
    assert [p.name for p in find_images(str(tmp_path / "a.jpg"))] == ["a.jpg"]
    with pytest.raises(FileNotFoundError, match="matches no image"):
        find_images(str(tmp_path / "*.tif"))


@pytest.mark.parametrize(
    ("name", "how"),
    [
        (
            "scene.tif",
            "inference.mode=slide inference.crop=1024 streams a TIFF by window (stream=true, the default)",
        ),
        (
            "scene.png",
            "convert it to a tiled GeoTIFF (e.g. gdal_translate -co TILED=YES) and use inference.mode=slide "
            "inference.crop=1024",
        ),
    ],
)
def test_an_image_too_large_to_read_whole_names_the_setting_that_streams_it(tmp_path, monkeypatch, name, how):
    """predict without mode=slide on a 20,000² GeoTIFF ended in Pillow's "decompression bomb" text; here
    Pillow's limit is lowered so that a 20×20 image stands for it."""
    path = tmp_path / name
    Image.new("RGB", (20, 20)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # refused above twice this: 400 pixels are
    with pytest.raises(ValueError) as error:
        read_input(path)
    assert str(error.value) == (
        f"image {path} has 400 pixels, more than is read whole (Pillow's limit 100); {how}"
        + ("" if name.endswith(".tif") else ", which streams TIFFs by window")
    )


def test_a_tiff_the_decoder_cannot_read_says_what_it_holds_not_corrupt(tmp_path):
    """A valid uint16 GeoTIFF read whole (stream=false) was called corrupt; a file that is no TIFF is."""
    import rasterio

    path = tmp_path / "scene.tif"
    profile = {"driver": "GTiff", "height": 20, "width": 30, "count": 3, "dtype": "uint16"}
    with rasterio.open(path, "w", **profile) as raster:
        raster.write(np.full((3, 20, 30), 40000, np.uint16))
    with pytest.raises(DataError, match=rf"^raster {path} holds uint16 samples; expected uint8 \(0\.\.255\)"):
        read_input(path)
    broken = tmp_path / "broken.tif"
    broken.write_bytes(b"II*\x00 not a tiff")
    with pytest.raises(DataError, match="the file is corrupt or truncated"):
        read_input(broken)
