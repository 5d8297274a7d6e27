"""Export's check proves the file as eval and predict open it (``open_model``, ``TrainedModel.run``): an
export that does not reproduce PyTorch is refused, and the inference settings a model recorded for its
validation (slide windows, flip) do not enter the comparison of the network with PyTorch."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from export_fixtures import SIZE, tiny_model, tiny_record
from torch import nn

import segattn.export.onnx as onnx_export
import segattn.export.safetensors as safetensors_export
from segattn.export import ExportError, export
from segattn.export.wrapper import ExportWrapper

# Validation settings a checkpoint can record; applied by the check, they would differ from one forward pass.
RECORDED = {"mode": "slide", "crop": [16, 16], "stride": [8, 8], "flip": True}


def shifted(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose every weight is 0.01 off: what an export that lost precision would hold."""
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in copied.parameters():
            parameter.add_(0.01)
    return copied


def test_a_safetensors_export_that_reopens_as_another_model_is_refused(tmp_path, monkeypatch):
    model = tiny_model("linear")
    save = safetensors_export.save_exported
    monkeypatch.setattr(
        safetensors_export, "save_exported", lambda net, record, out: save(shifted(net), record, out)
    )
    with pytest.raises(ExportError, match=r"safetensors\[linear\]: max abs diff .* exceeds tolerance"):
        export(model, tiny_record(model), "safetensors", tmp_path, size=SIZE)


def test_an_onnx_file_that_does_not_reproduce_pytorch_is_refused(tmp_path, monkeypatch):
    model = tiny_model("linear")
    write = onnx_export.torch_onnx_export
    monkeypatch.setattr(
        onnx_export,
        "torch_onnx_export",
        lambda wrapper, *args: write(ExportWrapper(shifted(wrapper.model)).eval(), *args),
    )
    with pytest.raises(ExportError, match=r"cannot be exported to ONNX .*exceeds tolerance"):
        export(model, tiny_record(model), "onnx", tmp_path, size=SIZE, exporter="dynamo")
    assert not (tmp_path / "model.onnx").exists()


@pytest.mark.parametrize("fmt", ["onnx", "safetensors"])
def test_recorded_validation_settings_stay_out_of_the_check(fmt, tmp_path):
    model = tiny_model("linear")
    record = dataclasses.replace(tiny_record(model), inference=RECORDED)
    report = export(model, record, fmt, tmp_path, size=SIZE, exporter="dynamo")
    assert all(check["max_abs_diff"] <= (1e-4 if fmt == "onnx" else 0.0) for check in report["checks"])
