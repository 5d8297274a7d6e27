"""segattn.record.ModelRecord: the defaults older files get, and its forms read back unchanged."""

from __future__ import annotations

import subprocess
import sys

from segattn.images import IMAGENET_MEAN, IMAGENET_STD
from segattn.record import ModelRecord

CONFIG = {"name": "pvt", "num_classes": 3, "attention": "flatten", "attention_options": {"kernel_size": 5}}


def test_sections_without_data_take_the_documented_defaults():
    record = ModelRecord.from_sections(CONFIG, {})
    assert record.classes == ["0", "1", "2"]
    assert record.palette == [(0, 0, 0), (128, 0, 0), (0, 128, 0)]  # PASCAL VOC's first colours
    assert (record.mean, record.std, record.ignore_index) == (IMAGENET_MEAN, IMAGENET_STD, 255)
    assert (record.family, record.attention, record.attention_options) == (
        "pvt",
        "flatten",
        {"kernel_size": 5},
    )
    assert ModelRecord.from_sections({"name": "vit", "num_classes": 2}, {}).attention == "softmax"


def test_both_forms_read_back_the_same_record():
    record = ModelRecord(
        CONFIG, ["a", "b", "c"], [(1, 2, 3), (4, 5, 6), (7, 8, 9)], (0.5, 0.5, 0.5), (0.2, 0.2, 0.2), 7,
        "folder", {"name": "folder", "root": "/data"},
    )  # fmt: skip
    assert ModelRecord.from_sections(record.model, record.data_section()) == record
    assert ModelRecord.from_dict(record.to_dict()) == record
    assert record.to_dict()["num_classes"] == 3 and record.data_section()["palette"][1] == [4, 5, 6]


def test_the_record_imports_without_torch():
    code = "import sys, segattn.record, segattn.inference.trained; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
