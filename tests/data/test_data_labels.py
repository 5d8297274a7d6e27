"""Label tables: hand-written expectations, every failure names the file (decoding: tests/test_images.py)."""

from __future__ import annotations

import numpy as np
import pytest

from segattn.data import ColorMap, DataError, LabelMap
from segattn.data.labels import describe_values


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
