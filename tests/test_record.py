"""segattn.record.ModelRecord: the defaults older files get, and its document reads back unchanged."""

from __future__ import annotations

import json
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


RECORD = ModelRecord(
    CONFIG, ["a", "b", "c"], [(1, 2, 3), (4, 5, 6), (7, 8, 9)], (0.5, 0.5, 0.5), (0.2, 0.2, 0.2), 7,
    "folder", {"name": "folder", "root": "/data"},
)  # fmt: skip


def read(content: object) -> ModelRecord:
    return ModelRecord.read(content, "segattn.json", "", "segattn.json", "export it again")


def test_the_document_reads_back_the_same_record_as_a_mapping_and_as_json():
    document = RECORD.document()
    assert ModelRecord.from_sections(RECORD.model, document["data"]) == RECORD
    assert read(document) == RECORD and read(RECORD.to_json()) == RECORD
    assert read(RECORD.to_json().encode()) == RECORD
    assert document["model"]["num_classes"] == 3 and document["data"]["palette"][1] == [4, 5, 6]
    assert json.loads(RECORD.to_json()) == document


def test_the_flat_json_of_earlier_onnx_and_torchscript_exports_still_reads():
    flat = {
        "format_version": 1,
        "num_classes": 3,
        "classes": ["a", "b", "c"],
        "palette": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
        "mean": [0.5, 0.5, 0.5],
        "std": [0.2, 0.2, 0.2],
        "ignore_index": 7,
        "model": CONFIG,
        "dataset": "folder",
        "data_config": {"name": "folder", "root": "/data"},
        "inference": None,
        "versions": None,
        "dynamic": True,
        "exporter": "dynamo",
    }
    assert read(json.dumps(flat)) == RECORD


def test_the_record_imports_without_torch():
    code = "import sys, segattn.record, segattn.inference.trained; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
