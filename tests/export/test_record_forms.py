"""One record, one document in four files (checkpoint, exported directory, model.onnx, model.pt): written by
one writer, read back by one reader to the same ``ModelRecord``; a bad value in any of them is one line
naming the file and the key, and a newer ``format_version`` names the one this segattn reads."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
import yaml
from export_fixtures import SIZE, tiny_model, tiny_record

import segattn
from segattn.checkpoints.compat import check_resumable
from segattn.checkpoints.resume import read_checkpoint, wandb_run_id
from segattn.errors import FileFormatError
from segattn.export import export
from segattn.images import write_classes
from segattn.record import FORMAT_VERSION, ModelRecord
from segattn.training import rundir

VERSIONS = {
    "segattn": "0.1.0",
    "torch": "2.14.1",
    "timm": "1.0.31",
    "python": "3.11.9",
    "git_commit": "ab" * 20,
}
INFERENCE = {"mode": "slide", "crop": [32, 32], "stride": [16, 16], "crop_batch_size": 4, "scales": [1.0]}


@pytest.fixture(scope="module")
def forms(tmp_path_factory) -> dict[str, Any]:
    """A tiny model's record, with everything a training run records, written in every form."""
    folder = tmp_path_factory.mktemp("forms")
    model = tiny_model("linear")
    record = dataclasses.replace(
        tiny_record(model),
        data_config={"name": "folder", "root": "/data/cracks", "downsample": 4, "image_size": [32, 32]},
        inference={**INFERENCE, "flip": True},
        versions=VERSIONS,
    )
    checkpoint = {"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()}}
    record.to_checkpoint(checkpoint, wandb_run_id="run123")
    torch.save(checkpoint, folder / "last.ckpt")
    for fmt in ("safetensors", "onnx", "torchscript"):
        export(model, record, fmt, folder / fmt, size=SIZE)
    return {"record": record, "folder": folder}


def torchscript_extra(path: Path) -> str:
    """model.pt's extra file segattn.json."""
    extra = {"segattn.json": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.load(str(path), _extra_files=extra)
    return extra["segattn.json"]


def test_every_form_reads_back_the_same_record(forms):
    record, folder = forms["record"], forms["folder"]
    opened = {
        "checkpoint": segattn.open_model(folder / "last.ckpt").record,
        "safetensors": segattn.open_model(folder / "safetensors").record,
        "onnx": segattn.open_model(folder / "onnx").record,
        "torchscript": segattn.open_model(folder / "torchscript" / "model.pt").record,
    }
    assert opened == dict.fromkeys(opened, record)
    assert record.downsample == 4 and opened["onnx"].inference["flip"] is True
    ckpt = read_checkpoint(folder / "last.ckpt")
    assert ckpt["segattn"]["format_version"] == FORMAT_VERSION and wandb_run_id(ckpt) == "run123"
    # Each file carries the record once: the ONNX and TorchScript exports are the one file alone.
    assert sorted(p.name for p in (folder / "onnx").iterdir()) == ["model.onnx"]
    assert sorted(p.name for p in (folder / "torchscript").iterdir()) == ["model.pt"]
    assert sorted(p.name for p in (folder / "safetensors").iterdir()) == ["model.safetensors", "segattn.json"]


def test_every_file_holds_the_same_document(forms):
    """One form on disk: the same keys and format_version in the checkpoint and in each export."""
    folder = forms["folder"]
    document = forms["record"].document()
    checkpoint = read_checkpoint(folder / "last.ckpt")["segattn"]
    assert {key: value for key, value in checkpoint.items() if key != "wandb_run_id"} == document
    onnx_metadata = {p.key: p.value for p in onnx.load(str(folder / "onnx" / "model.onnx")).metadata_props}
    assert json.loads(onnx_metadata["segattn"]) == document
    assert json.loads(torchscript_extra(folder / "torchscript" / "model.pt")) == document
    assert json.loads((folder / "safetensors" / "segattn.json").read_text()) == document
    assert list(document) == ["format_version", "model", "data", "inference", "versions"]


def refusal(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert isinstance(error.value, FileFormatError) and "\n" not in message
    return message


def previous_release_export(directory: Path) -> None:
    """Turn a safetensors export into the form segattn wrote before segattn.json: model.yaml (the document
    without classes and palette) and classes.json."""
    document = json.loads((directory / "segattn.json").read_text())
    (directory / "segattn.json").unlink()
    classes, palette = document["data"].pop("classes"), document["data"].pop("palette")
    (directory / "model.yaml").write_text(yaml.safe_dump(document))
    write_classes(directory, classes, [tuple(colour) for colour in palette])


@pytest.mark.parametrize("name", ["segattn.json", "model.yaml"])
@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda meta: meta["model"].update(num_classes="abc"), "model.num_classes='abc': expected a whole"),
        (lambda meta: meta.update(format_version=99), "format_version=99 is not supported"),
        (lambda meta: meta["data"]["config"].update(downsample="x"), "data.config.downsample='x'"),
        (lambda meta: meta["data"].update(mean=[0.5]), "data.mean=[0.5]: expected 3 numbers"),
        (lambda meta: meta.update(versions=["2.14"]), "versions=['2.14']: expected a mapping"),
    ],
)
def test_a_bad_exported_record_names_the_file_and_the_key(forms, tmp_path, name, edit, expected):
    """segattn.json, and model.yaml of a folder exported before it."""
    directory = tmp_path / "export"
    directory.mkdir()
    for path in (forms["folder"] / "safetensors").iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    if name == "model.yaml":
        previous_release_export(directory)
        assert segattn.open_model(directory).record == forms["record"]
    meta = yaml.safe_load((directory / name).read_text())  # JSON is YAML
    edit(meta)
    (directory / name).write_text(yaml.safe_dump(meta) if name == "model.yaml" else json.dumps(meta))
    with pytest.raises(FileFormatError) as error:
        segattn.open_model(directory)
    message = refusal(error)
    assert message.startswith(f"{directory / name}: {expected}"), message
    if "format_version" in expected:
        assert f"this segattn reads format_version {FORMAT_VERSION}" in message


def test_a_bad_checkpoint_record_names_the_file_and_the_key(forms, tmp_path):
    ckpt = read_checkpoint(forms["folder"] / "last.ckpt")
    for edit, expected in (
        (lambda section: section.update(format_version=99), "segattn.format_version=99 is not supported"),
        (lambda section: section["data"].update(palette=[[0, 0]]), "segattn.data.palette=[[0, 0]]"),
        (lambda section: section.update(inference="slide"), "segattn.inference='slide': expected a mapping"),
    ):
        bad = {**ckpt, "segattn": json.loads(json.dumps(ckpt["segattn"]))}
        edit(bad["segattn"])
        path = tmp_path / "bad.ckpt"
        torch.save(bad, path)
        with pytest.raises(FileFormatError) as error:
            segattn.open_model(path)
        assert refusal(error).startswith(f"{path}: {expected}")
    with pytest.raises(FileFormatError) as error:  # resuming: the setting, the file and what to do instead
        check_resumable({"state_dict": {}}, {}, path)
    assert refusal(error).startswith(f"ckpt_path={path}: no ckpt['segattn']['model'] entry")
    assert "init_from=" in str(error.value)


def with_onnx_metadata(source: Path, path: Path, text: str | None) -> Path:
    """A copy of model.onnx at ``path`` whose 'segattn' metadata is ``text`` (None: none)."""
    proto = onnx.load(str(source))
    del proto.metadata_props[:]
    if text is not None:
        proto.metadata_props.add(key="segattn", value=text)
    onnx.save(proto, str(path))
    return path


def with_torchscript_extra(source: Path, path: Path, text: str) -> Path:
    """A copy of model.pt at ``path`` whose extra file segattn.json is ``text`` ("": none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.jit.load(str(source))
        torch.jit.save(module, str(path), _extra_files={"segattn.json": text} if text else {})
    return path


def test_bad_embedded_metadata_names_the_file_and_the_key(forms, tmp_path):
    document, folder = forms["record"].document(), forms["folder"]
    onnx_file, script = tmp_path / "model.onnx", tmp_path / "model.pt"
    for text, expected in (
        (json.dumps({**document, "format_version": 99}), "segattn.format_version=99 is not supported"),
        (
            json.dumps({**document, "data": {**document["data"], "classes": "abc"}}),
            "segattn.data.classes='abc': expected a list",
        ),
        (None, "no 'segattn' metadata"),
        ("{not json", "its 'segattn' metadata is not JSON"),
    ):
        with pytest.raises(FileFormatError) as error:
            segattn.open_model(with_onnx_metadata(folder / "onnx" / "model.onnx", onnx_file, text))
        assert refusal(error).startswith(f"{onnx_file}: {expected}")
    bad = {**document, "model": {**document["model"], "num_classes": "abc"}}
    source = folder / "torchscript" / "model.pt"
    with pytest.raises(FileFormatError) as error:
        segattn.open_model(with_torchscript_extra(source, script, json.dumps(bad)))
    assert refusal(error).startswith(f"{script}: segattn.json.model.num_classes='abc'")
    with pytest.raises(FileFormatError) as error:
        segattn.open_model(with_torchscript_extra(source, script, ""))
    assert refusal(error).startswith(f"{script}: no extra file segattn.json")


def test_the_environment_names_the_versions_and_the_commit_and_never_fails(forms, tmp_path, monkeypatch):
    environment = rundir.environment()
    assert set(environment) == {"segattn", "torch", "timm", "python", "git_commit"}
    assert environment["torch"] == torch.__version__
    assert re.fullmatch("[0-9a-f]{40}|unknown", environment["git_commit"])
    rundir.save_environment(tmp_path)
    assert json.loads((tmp_path / "environment.json").read_text()) == environment
    # torch.__version__ is a TorchVersion: a record holding it still writes a checkpoint that a weights_only
    # load reads (plain strings only).
    record = dataclasses.replace(forms["record"], versions={**environment, "torch": torch.__version__})
    checkpoint: dict[str, Any] = {"state_dict": {}}
    record.to_checkpoint(checkpoint)
    torch.save(checkpoint, tmp_path / "versions.ckpt")
    reread = ModelRecord.from_checkpoint(read_checkpoint(tmp_path / "versions.ckpt"), "versions.ckpt")
    assert reread.versions == environment and type(reread.versions["torch"]) is str

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(rundir.subprocess, "run", no_git)
    assert rundir.git_commit() == "unknown"
