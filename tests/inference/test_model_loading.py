"""segattn.open_model: checkpoints, exported directories (rebuilt from registry names only), ONNX and
TorchScript."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from export_fixtures import CLASSES, MEAN, PALETTE, STD, tiny_model, tiny_opened, tiny_record

import segattn
from segattn.checkpoints.loading import save_exported
from segattn.checkpoints.resume import read_checkpoint
from segattn.export.command import export
from segattn.export.command import main as export_main


def write_checkpoint(path, model, **overrides):
    """A checkpoint laid out as train.py writes it: weights under state_dict with prefix 'model.'."""
    meta = {
        "model": dict(model.config),
        "data": {
            "name": "synthetic",
            "classes": CLASSES,
            "palette": [list(c) for c in PALETTE],
            "ignore_index": 255,
            "mean": MEAN,
            "std": STD,
        },
        "wandb_run_id": None,
    }
    meta["model"].update(overrides)
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    state["criterion.weight"] = torch.ones(3)  # other LightningModule state is ignored
    torch.save({"state_dict": state, "segattn": meta, "epoch": 1}, path)
    return path


def test_checkpoint_loads_with_its_metadata_and_weights(tmp_path):
    model = tiny_model("flatten", seed=5)
    opened = segattn.open_model(write_checkpoint(tmp_path / "last.ckpt", model))
    loaded, record = opened.network, opened.record
    assert not loaded.training and opened.format == "checkpoint"
    assert (record.classes, record.palette, list(record.mean), record.num_classes) == (
        CLASSES,
        PALETTE,
        MEAN,
        3,
    )
    assert (record.family, record.attention, record.dataset) == ("vit", "flatten", "synthetic")
    images = torch.randn(1, 3, 27, 45)
    with torch.inference_mode():
        assert torch.equal(loaded(images), model(images))


def test_pretrained_file_named_in_a_config_is_never_read(tmp_path):
    model = tiny_model("linear")
    path = write_checkpoint(tmp_path / "c.ckpt", model, pretrained=str(tmp_path / "absent.pth"))
    loaded = segattn.open_model(path).network  # the checkpoint's weights win; the file is not opened
    assert torch.equal(
        loaded.state_dict()["head.classifier.weight"], model.state_dict()["head.classifier.weight"]
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"_target_": "os.system"}, "_target_"),
        ({"name": "os.system"}, "unknown model 'os.system'"),
        ({"attention": "builtins.eval"}, "unknown attention 'builtins.eval'"),
        ({"attention_options": {"_partial_": True}}, "_partial_"),
    ],
)
def test_config_naming_a_callable_is_refused(tmp_path, overrides, message):
    path = write_checkpoint(tmp_path / "bad.ckpt", tiny_model("linear"), **overrides)
    with pytest.raises(ValueError, match=message) as error:
        segattn.open_model(path)
    assert "bad.ckpt" in str(error.value)


def test_pickled_object_in_a_checkpoint_is_refused_not_run(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "segattn": {"model": {"name": "vit"}}, "hook": os.system}, path)
    with pytest.raises(ValueError, match="refused to unpickle"):
        segattn.open_model(path)


def test_exported_directory_refuses_python_yaml_tags_and_names_missing_weights(tmp_path):
    """segattn.json is plain JSON; model.yaml, which folders exported before it hold, is read safely."""
    model = tiny_model("linear")
    save_exported(model, tiny_record(model), tmp_path)
    meta = json.loads((tmp_path / "segattn.json").read_text())
    assert meta["model"] == model.config and meta["data"]["mean"] == MEAN
    (tmp_path / "segattn.json").unlink()
    (tmp_path / "model.yaml").write_text("model: !!python/object/apply:os.system ['echo owned']\n")
    with pytest.raises(ValueError, match="not a plain YAML mapping"):
        segattn.open_model(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing model\.safetensors"):
        segattn.open_model(tmp_path)


def test_weights_that_do_not_match_the_config_name_the_file(tmp_path):
    path = write_checkpoint(tmp_path / "wide.ckpt", tiny_model("linear"), embed_dim=32)
    with pytest.raises(ValueError, match=r"wide\.ckpt: weights do not match"):
        segattn.open_model(path)


def test_an_onnx_export_opens_in_onnxruntime_with_the_same_record(tmp_path):
    model = tiny_model("linear")
    export(model, tiny_record(model), "onnx", tmp_path, size=(32, 32))
    for path in (tmp_path, tmp_path / "model.onnx"):  # the directory holding model.onnx alone, or the file
        opened = segattn.open_model(path)
        assert (opened.format, opened.path, opened.network) == ("onnx", tmp_path / "model.onnx", None)
        assert opened.record == tiny_record(model)


def test_a_missing_model_is_named_with_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        segattn.open_model(tmp_path / "gone.ckpt")
    assert str(error.value) == (
        f"checkpoint={tmp_path / 'gone.ckpt'}: no such file or directory; expected a train.py .ckpt, an "
        "exported safetensors directory, a model.onnx or a TorchScript model.pt"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"flip": "no"}, "inference.flip='no': expected true or false"),
        ({"crop_batch_size": 2.5}, "inference.crop_batch_size=2.5: expected an integer >= 1"),
        ({"probabilities": "no"}, "probabilities='no': expected True or False"),
    ],
)
def test_predict_takes_booleans_and_integers_only_of_their_type(tmp_path, arguments, message):
    """In Python as on the command line: flip="no" is refused, not read as true (it flipped)."""
    opened = segattn.open_model(write_checkpoint(tmp_path / "last.ckpt", tiny_model("linear", seed=0)))
    image = torch.randint(0, 255, (18, 20, 3), dtype=torch.uint8).numpy()
    with pytest.raises(ValueError) as refused:
        opened.predict(image, **arguments)
    assert str(refused.value) == message


@pytest.fixture(scope="module")
def torchscript_export(tmp_path_factory):
    """A tiny model exported as TorchScript: the folder holding model.pt."""
    folder = tmp_path_factory.mktemp("ts") / "ts"
    model = tiny_model("linear", seed=1)
    export(model, tiny_record(model), "torchscript", folder, size=(32, 32))
    return folder


def test_a_torchscript_export_predicts_as_the_torch_model_does(torchscript_export):
    """It was refused ("no segattn command opens"); now its folder or its model.pt opens, and predicts through
    the torch inference path (batches, flip, slide windows) as the model it was exported from."""
    model = tiny_model("linear", seed=1)
    reference = tiny_opened(model)
    images = [np.random.default_rng(seed).integers(0, 255, (27, 45, 3), dtype=np.uint8) for seed in (0, 1)]
    settings = {"batch_size": 2, "flip": True, "mode": "slide", "crop": 32, "stride": 16}
    for given in (torchscript_export, torchscript_export / "model.pt"):
        opened = segattn.open_model(given, device="cpu")
        assert (opened.format, opened.record, opened.device) == ("torchscript", tiny_record(model), "cpu")
        for inference in ({}, settings):
            for actual, expected in zip(
                opened.logits(images, **inference), reference.logits(images, **inference), strict=True
            ):
                np.testing.assert_allclose(actual, expected, atol=1e-4)
        assert [ids.tolist() for ids in opened.predict(images)] == [
            ids.tolist() for ids in reference.predict(images)
        ]


def test_a_torchscript_export_is_named_when_training_starts_from_it(torchscript_export):
    """ckpt_path and init_from read checkpoints only: a TorchScript export is named with what to give."""
    with pytest.raises(ValueError) as error:
        read_checkpoint(torchscript_export / "model.pt", "init_from")
    assert str(error.value).startswith(
        f"init_from={torchscript_export / 'model.pt'}: a TorchScript export, which eval and predict run but "
        "training cannot start from; give the checkpoint it was exported from"
    )


def test_export_starts_from_a_checkpoint_not_from_a_torchscript_export(torchscript_export, tmp_path, capsys):
    assert export_main([f"checkpoint={torchscript_export}", "format=onnx", f"out={tmp_path / 'out'}"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"segattn.export: {torchscript_export}: a model exported to torchscript runs as it is (python -m "
        f"segattn.predict checkpoint={torchscript_export}); export from the checkpoint it came from"
    )
    assert not (tmp_path / "out").exists()


def test_a_run_folder_given_as_a_model_points_at_its_checkpoints(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(ValueError) as error:
        segattn.open_model(run)
    assert str(error.value).startswith(
        f"checkpoint={run}: a train.py run folder; give one of its checkpoints: "
        f"checkpoint={run / 'checkpoints' / 'best.ckpt'} (or last.ckpt)"
    )


def test_init_from_an_export_folder_says_what_init_from_reads(tmp_path):
    """It said "no such checkpoint file"."""
    model = tiny_model("linear", seed=0)
    save_exported(model, tiny_record(model), tmp_path / "st")
    with pytest.raises(ValueError) as error:
        read_checkpoint(tmp_path / "st", "init_from")
    assert str(error.value) == (
        f"init_from={tmp_path / 'st'}: a safetensors export folder; expected a train.py checkpoint file such "
        "as <run dir>/checkpoints/last.ckpt"
    )
