"""Label tables, palettes and file decoding: hand-written expectations, every failure names the file."""

from __future__ import annotations

import numpy as np
import pytest
from data_fixtures import rgb, save
from PIL import Image

from segattn.data import ColorMap, DataError, LabelMap, pascal_colormap
from segattn.data.labels import describe_values
from segattn.data.readers import read_image, read_mask


def test_pascal_colormap_matches_voc_colours():
    # colours of VOC's SegmentationClass palette, read off the devkit's documentation
    expected = {0: (0, 0, 0), 1: (128, 0, 0), 2: (0, 128, 0), 3: (128, 128, 0), 8: (64, 0, 0)}
    expected |= {15: (192, 128, 128), 20: (0, 64, 128), 255: (224, 224, 192)}
    colours = pascal_colormap(256)
    assert {k: colours[k] for k in expected} == expected


def test_describe_values_folds_runs():
    assert describe_values([255, 0, 1, 2, 5]) == "0..2, 5, 255"
    assert describe_values([7]) == "7"


def test_label_map_maps_and_refuses_unknown_values():
    table = LabelMap({0: 255, 1: 0, 2: 1}, "toy")
    raw = np.array([[0, 1], [2, 1]], np.uint8)
    np.testing.assert_array_equal(table(raw, "m.png"), [[255, 0], [1, 0]])
    with pytest.raises(
        DataError, match=r"mask x/m\.png has unknown label values \{3, 200\}; .*expects 0\.\.2"
    ):
        table(np.array([[3, 200, 1]], np.uint8), "x/m.png")


def test_label_map_reads_16_bit_values_beyond_the_table():
    table = LabelMap.identity(3, "toy")
    np.testing.assert_array_equal(table(np.array([[0, 2, 255]], np.uint16), "m.png"), [[0, 2, 255]])
    with pytest.raises(DataError, match=r"unknown label values \{1000, 65535\}"):
        table(np.array([[0, 1000, 65535]], np.uint16), "m.png")


def test_binary_0_255_masks_are_refused_unless_mapped_explicitly():
    mask = np.array([[0, 255], [255, 0]], np.uint8)
    with pytest.raises(DataError, match="binary 0/255 mask"):
        LabelMap.identity(2, "toy")(mask, "m.png")
    # an explicit mapping is the user's decision; a mask with other classes too is ordinary
    np.testing.assert_array_equal(LabelMap({0: 0, 255: 255}, "toy", check_binary=False)(mask, "m.png"), mask)
    LabelMap.identity(2, "toy")(np.array([[0, 1, 255]], np.uint8), "m.png")


def test_color_map_maps_palette_and_ignore_colour():
    table = ColorMap([(10, 20, 30), (40, 50, 60)], "toy", ignore_color=(0, 0, 0))
    rgb_mask = np.array([[[40, 50, 60], [0, 0, 0], [10, 20, 30]]], np.uint8)
    np.testing.assert_array_equal(table(rgb_mask, "m.png"), [[1, 255, 0]])


def test_read_image_converts_grey_rgba_palette_and_16_bit(tmp_path):
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    np.testing.assert_array_equal(read_image(save(tmp_path / "g.png", grey)), np.stack([grey] * 3, axis=2))
    colour = rgb(1, 3, 4)
    rgba = np.concatenate([colour, np.full((3, 4, 1), 7, np.uint8)], axis=2)  # alpha dropped, not blended
    np.testing.assert_array_equal(read_image(save(tmp_path / "a.png", rgba)), colour)
    Image.fromarray(colour).convert("P").save(tmp_path / "p.png")
    assert read_image(tmp_path / "p.png").shape == (3, 4, 3)
    deep = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000).astype(np.uint16)
    Image.fromarray(deep).save(tmp_path / "d.png")  # 16-bit grey keeps its top 8 bits
    np.testing.assert_array_equal(read_image(tmp_path / "d.png")[..., 0], deep >> 8)


def test_corrupt_and_truncated_files_name_the_file(tmp_path):
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=r"image .*junk\.png cannot be decoded"):
        read_image(tmp_path / "junk.png")
    whole = save(tmp_path / "whole.png", rgb(2, 64, 64)).read_bytes()
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"mask .*cut\.png cannot be decoded.*corrupt or truncated"):
        read_mask(tmp_path / "cut.png")
    with pytest.raises(DataError, match=r"gone\.png does not exist"):
        read_image(tmp_path / "gone.png")


def test_read_mask_modes(tmp_path):
    values = np.array([[0, 1, 2, 255]], np.uint8)
    np.testing.assert_array_equal(read_mask(save(tmp_path / "l.png", values)), values)
    np.testing.assert_array_equal(
        read_mask(save(tmp_path / "grey_rgb.png", np.stack([values] * 3, 2))), values
    )
    deep = np.array([[0, 1, 300, 65535]], np.uint16)
    Image.fromarray(deep).save(tmp_path / "16.png")
    mask = read_mask(tmp_path / "16.png")
    assert mask.dtype == np.uint16
    np.testing.assert_array_equal(mask, deep)
    with pytest.raises(DataError, match=r"colour\.png is a colour image"):
        read_mask(save(tmp_path / "colour.png", rgb(3, 2, 2)))
