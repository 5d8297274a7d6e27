"""``data=folder`` takes its number of classes from classes.json (or data.classes) when data.num_classes is
not given; without either the error says which key to set, and a disagreeing count is still refused."""

from __future__ import annotations

import pytest
from data_fixtures import make_folder

from segattn.data import DataError, SegDataModule
from segattn.doctor import compose_data_config


def test_num_classes_comes_from_classes_json(tmp_path):
    root = make_folder(tmp_path)
    dm = SegDataModule(name="folder", root=root, num_classes=None)
    assert dm.num_classes == 3 and dm.classes == ["road", "tree", "car"]
    kwargs = compose_data_config(["data=folder", f"data.root={root}"])  # conf/data/folder.yaml defaults
    assert kwargs["num_classes"] is None and SegDataModule(**kwargs).num_classes == 3


def test_num_classes_comes_from_data_classes(tmp_path):
    root = make_folder(tmp_path)
    (root / "classes.json").unlink()
    dm = SegDataModule(name="folder", root=root, num_classes=None, classes=["background", "a", "b"])
    assert dm.num_classes == 3 and dm.classes == ["background", "a", "b"]


def test_no_classes_json_nor_data_classes_is_a_one_line_error(tmp_path):
    root = make_folder(tmp_path)
    (root / "classes.json").unlink()
    with pytest.raises(DataError, match=r"no classes\.json and data\.classes is not set") as err:
        SegDataModule(name="folder", root=root, num_classes=None)
    message = str(err.value)
    assert "\n" not in message
    assert str(root / "classes.json") in message and "set data.classes=[" in message


def test_num_classes_that_disagrees_with_classes_json_is_refused(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"data\.num_classes=2 but dataset 'folder' at .* has 3 classes \(road, tree, car\); "
        r"set data\.num_classes=3",
    ):
        SegDataModule(name="folder", root=make_folder(tmp_path), num_classes=2)
