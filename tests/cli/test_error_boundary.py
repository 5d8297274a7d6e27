"""One error boundary for every command (issue 34): each refusal is one line on stderr and the status
``segattn.errors`` documents, checked before anything is written; the known third-party failures (a full
disk, a read-only folder, a file that is no safetensors / ONNX / JSON, Lightning's and Hydra's configuration
errors) are translated there, naming the file or key; ``HYDRA_FULL_ERROR=1`` keeps the traceback.

Every command runs in-process (train.py and eval.py as their real Hydra applications)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from commands_in_process import run_command
from export_fixtures import tiny_model, tiny_record
from PIL import Image
from reliability_fixtures import refuse

from segattn import files
from segattn.checkpoints.atomic import atomic_save
from segattn.errors import EXIT_CONFIG, EXIT_FAILED, ConfigError, DiskError, FileFormatError, translate
from segattn.export import export
from segattn.export import main as export_main
from segattn.predict import main as predict_main


@pytest.fixture
def places(tmp_path) -> dict[str, Path]:
    """A log dir that must stay empty, a text file posing as a checkpoint, an input folder."""
    paths = {"logs": tmp_path / "logs", "text": tmp_path / "notes.txt", "images": tmp_path / "images"}
    paths["logs"].mkdir()
    paths["images"].mkdir()
    paths["text"].write_text("not a checkpoint\n")
    return paths


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


PREDICT = ["checkpoint={text}", "input={images}", "out={tmp}/o"]
REFUSED = [  # command, arguments, the line after "<command>: ", status; checked before anything is written
    (
        "train.py",
        ["checkpoint={text}"],
        "train.py does not read checkpoint= (eval, export and predict do): use ckpt_path={text} to resume "
        "that run or init_from={text} to fine-tune from its weights",
        EXIT_FAILED,
    ),
    (
        "eval.py",
        ["ckpt_path={text}"],
        "eval.py scores checkpoint=<ckpt>: write checkpoint={text}",
        EXIT_FAILED,
    ),
    (
        "segattn.predict",
        ["model={text}", "input={images}", "out={tmp}/o"],
        "segattn.predict runs checkpoint=<ckpt | exported dir | model.onnx>: write checkpoint={text}",
        EXIT_CONFIG,
    ),
    (
        "train.py",
        ["inference.mode=slide", "inference.crop=16", "inference.stride=32"],
        "inference.stride=32 is larger than inference.crop=16: the windows would skip pixels",
        EXIT_FAILED,
    ),
    (
        "segattn.predict",
        [*PREDICT, "inference.mode=slide", "inference.crop=[16,16]", "inference.stride=[8,24]"],
        "inference.stride=[8, 24] is larger than inference.crop=[16, 16]",
        EXIT_CONFIG,
    ),
    (
        "train.py",
        ["callbacks.model_checkpoint.monitor=val/nosuch"],
        "callbacks.model_checkpoint.monitor=val/nosuch: the run does not log this metric; expected one of "
        "val/mIoU, val/mAcc",
        EXIT_FAILED,
    ),
    (
        "train.py",
        ["+callbacks.foo._target_=nosuch.Class"],
        "callbacks.foo._target_=nosuch.Class: cannot import it (No module named 'nosuch'); expected the "
        "import path (package.module.Class) of a Lightning Callback subclass",
        EXIT_FAILED,
    ),
    (
        "train.py",
        ["logger=csv", "logger.csv._target_=segattn.training.guards.NonFiniteGuard"],
        "logger.csv._target_=segattn.training.guards.NonFiniteGuard: NonFiniteGuard is not a Logger",
        EXIT_FAILED,
    ),
    (
        "train.py",
        ["+callbacks.model_checkpoint.nosuch=1"],
        "callbacks.model_checkpoint.nosuch: ResumableModelCheckpoint takes no argument 'nosuch'; it takes "
        "dirpath, filename, monitor,",
        EXIT_FAILED,
    ),
    (
        "train.py",
        ["callbacks=[default,early_stopping]", "callbacks.early_stopping.mode=nope"],
        "callbacks.early_stopping: EarlyStopping refused its arguments: ",
        EXIT_FAILED,
    ),
]


IDS = [
    *("train checkpoint=", "eval ckpt_path=", "predict model=", "train stride", "predict stride", "monitor"),
    *("callback _target_", "logger _target_", "callback argument", "callback refuses its arguments"),
]


@pytest.mark.parametrize(("command", "argv", "expected", "status"), REFUSED, ids=IDS)
def test_a_refusal_is_one_line_before_anything_is_written(
    command, argv, expected, status, places, tmp_path, monkeypatch, capsys
):
    fill = {"text": places["text"], "images": places["images"], "tmp": tmp_path}
    assert run_command(command, [a.format(**fill) for a in argv], places["logs"], monkeypatch) == status
    assert one_line(capsys).startswith(f"{command}: {expected.format(**fill)}")
    assert not any(places["logs"].iterdir()) and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("value", "cuda", "expected"),
    [
        (
            "nonsense",
            False,
            "SEGATTN_KERNEL='nonsense'; expected auto (the default), torch, triton, loss, upsample, head, "
            "ffn or residual (auto and that form)",
        ),
        ("triton", False, "SEGATTN_KERNEL=triton"),  # needs CUDA or TRITON_INTERPRET=1 (or is not installed)
    ],
)
@pytest.mark.parametrize(("command", "status"), [("train.py", EXIT_FAILED), ("segattn.predict", EXIT_CONFIG)])
def test_segattn_kernel_is_checked_with_the_config(
    value, cuda, expected, command, status, places, tmp_path, monkeypatch, capsys
):
    """It was a 70-line traceback from inside the model builder, after the run dir was made."""
    monkeypatch.setenv("SEGATTN_KERNEL", value)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: cuda)
    argv = [] if command == "train.py" else [a.format(**{**places, "tmp": tmp_path}) for a in PREDICT]
    assert run_command(command, argv, places["logs"], monkeypatch) == status
    line = one_line(capsys)
    assert line.startswith(f"{command}: {expected}"), line
    assert not any(places["logs"].iterdir()) and not (tmp_path / "o").exists()


def test_two_inputs_with_one_name_are_refused_before_anything_is_written(places, tmp_path, capsys):
    """a.png and a.jpg both became masks/a.png: the second overwrote the first without a word."""
    for name in ("a.png", "a.jpg"):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(places["images"] / name)
    out = tmp_path / "o"
    assert predict_main([f"checkpoint={places['text']}", f"input={places['images']}", f"out={out}"]) == 1
    line = one_line(capsys)
    jpg, png = places["images"] / "a.jpg", places["images"] / "a.png"
    both = f"input: {jpg} and {png} would both be written as {out}/masks/a.png"
    assert line.startswith(f"segattn.predict: {both}")
    assert not out.exists()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A tiny model exported as safetensors (the folder predict and export open)."""
    folder = tmp_path_factory.mktemp("exported") / "st"
    model = tiny_model("linear", seed=3)
    export(model, tiny_record(model), "safetensors", folder, size=(32, 32))
    return folder


def test_overlays_are_reported_only_when_written(exported, places, tmp_path, capsys):
    """predict said "and overlays to out/overlays" also when it wrote none (TIFF-only or unreadable input)."""
    (places["images"] / "c.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not an image")
    out = tmp_path / "o"
    assert predict_main([f"checkpoint={exported}", f"input={places['images']}", f"out={out}"]) == EXIT_FAILED
    assert capsys.readouterr().out.strip().endswith(f"segattn.predict: wrote 0 masks to {out / 'masks'}")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(places["images"] / "a.png")
    assert predict_main([f"checkpoint={exported}", f"input={places['images']}/a.png", f"out={out}"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.endswith(f"wrote 1 masks to {out / 'masks'} and overlays to {out / 'overlays'}")
    assert (out / "overlays" / "a.png").is_file()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errno.EROFS, "{masks} is on a read-only file system: writing a.png"),
        (errno.EACCES, "{masks} is not writable by this user: writing a.png"),
        (errno.ENOSPC, "no space left on {masks}: writing a.png"),
    ],
)
def test_predict_into_a_folder_that_refuses_writes_is_one_line(
    code, expected, exported, places, tmp_path, monkeypatch, capsys
):
    """A read-only masks/ folder was a PermissionError traceback."""
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(places["images"] / "a.png")
    out = tmp_path / "o"
    monkeypatch.setattr(files.os, "open", refuse(code, out / "masks"))
    argv = [f"checkpoint={exported}", f"input={places['images']}", f"out={out}"]
    assert predict_main(argv) == EXIT_FAILED
    assert one_line(capsys).startswith(f"segattn.predict: {expected.format(masks=out / 'masks')}")
    assert not out.exists()  # no temporary file, no empty masks folder: out was new, so it goes too
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # developers get the traceback
    with pytest.raises(DiskError):
        predict_main(argv)


def test_a_full_disk_under_torch_save_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch):
    """torch.save on a full disk: "RuntimeError: [enforce fail at inline_container.cc] unexpected pos",
    with "No space left on device" only in the exception it was raised during."""
    path = tmp_path / "checkpoints" / "last.ckpt"
    atomic_save({"step": 1}, path)
    monkeypatch.setattr(files.os, "open", refuse(errno.ENOSPC, tmp_path))
    with pytest.raises(DiskError, match=rf"^no space left on {path.parent}: writing last.ckpt; free some"):
        atomic_save({"step": 2, "weights": torch.zeros(1000)}, path)
    assert torch.load(path)["step"] == 1 and files.temp_files(path) == []


@pytest.mark.parametrize(
    ("fmt", "written"), [("torchscript", "model.pt"), ("safetensors", "model.safetensors")]
)
def test_an_export_to_a_full_disk_is_one_line_and_leaves_nothing(fmt, written, exported, tmp_path, capsys):
    """torch.jit.save on a full disk aborted the process (status 134, C++ frames) and left a 1 MiB temporary
    file; safetensors' writer was reported as an unreadable input file."""
    out = tmp_path / "new" / fmt
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files.os, "open", refuse(errno.ENOSPC, out))
        assert export_main([f"checkpoint={exported}", f"format={fmt}", f"out={out}"]) == EXIT_FAILED
    assert one_line(capsys) == (
        f"segattn.export: no space left on {out}: writing {written}; free some space or write elsewhere"
    )
    assert not (tmp_path / "new").exists()  # the folders export made are gone with the temporary file
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files.os, "open", refuse(errno.ENOSPC, existing))
        assert export_main([f"checkpoint={exported}", f"format={fmt}", f"out={existing}"]) == EXIT_FAILED
    capsys.readouterr()
    assert existing.is_dir() and list(existing.iterdir()) == []  # a folder that was there stays


def test_a_full_disk_mid_write_is_named_by_the_writer(tmp_path):
    def write(handle):
        handle.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskError, match=rf"^no space left on {tmp_path}: writing summary.json"):
        files.atomic_write(tmp_path / "summary.json", write)
    assert list(tmp_path.iterdir()) == []


def test_a_truncated_safetensors_file_names_the_file(exported, places, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in exported.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    argv = [f"checkpoint={broken}", f"input={places['images']}", f"out={tmp_path / 'o'}"]
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(places["images"] / "a.png")
    assert predict_main(argv) == EXIT_FAILED
    assert one_line(capsys).startswith(f"segattn.predict: {weights}: not a readable safetensors file")
    # the weights file instead of its folder: the hint says to pass the folder
    assert export_main([f"checkpoint={weights}", "format=onnx", f"out={tmp_path / 'x'}"]) == EXIT_FAILED
    assert one_line(capsys).endswith(f"an exported model is opened by its folder: checkpoint={broken}")


def test_a_text_file_named_onnx_names_the_file(places, tmp_path, capsys):
    model = tmp_path / "model.onnx"
    model.write_text("not a model\n")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(places["images"] / "a.png")
    argv = [f"checkpoint={model}", f"input={places['images']}", f"out={tmp_path / 'o'}"]
    assert predict_main(argv) == EXIT_FAILED
    assert one_line(capsys).startswith(f"segattn.predict: {model}: not an ONNX model onnxruntime can load")


def test_onnx_metadata_that_is_not_json_names_the_file(tmp_path):
    onnx = pytest.importorskip("onnx")
    from segattn.inference.onnx import OnnxSegmentor

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 4, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, 4, 4])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.helper.set_model_props(model, {"segattn": "{not json"})
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    with pytest.raises(FileFormatError, match=rf"^{path}: its 'segattn' metadata is not JSON"):
        OnnxSegmentor(path)


def test_known_third_party_failures_are_translated_and_bugs_are_not(tmp_path):
    from hydra.errors import MissingConfigException
    from lightning_fabric.utilities.exceptions import MisconfigurationException
    from safetensors.torch import load_file

    garbage = tmp_path / "w.safetensors"
    garbage.write_bytes(b"\x10" * 40)
    with pytest.raises(Exception) as raised:  # the library's own type
        load_file(garbage)
    assert isinstance(translate(raised.value), FileFormatError)
    assert "not a readable safetensors file" in str(translate(raised.value))
    config = translate(MisconfigurationException("`devices=3` is more than the 2 available"))
    assert isinstance(config, ConfigError)
    assert str(config).startswith("Lightning refused the trainer settings")
    missing = translate(MissingConfigException("Could not find 'experiment/nosuch'", "experiment/nosuch"))
    assert isinstance(missing, ConfigError) and "experiment/nosuch" in str(missing)
    try:
        json.loads("{x")
    except json.JSONDecodeError as error:
        assert isinstance(translate(error), FileFormatError)
    assert translate(RuntimeError("a bug")) is None and translate(KeyError("x")) is None
