"""Where a trained model runs (``device``, ``inference.precision``) and batches of images: every refusal on
this machine, batches equal to one-by-one prediction, predict over a folder through loader workers; the
CUDA paths run where a CUDA device is."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from export_fixtures import tiny_exports
from PIL import Image

import segattn
from segattn.images import shrink_image
from segattn.inference.device import is_device, onnx_providers, resolved_precision, torch_device
from segattn.inference.image_io import normalize
from segattn.predict import main

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """One tiny model exported as safetensors and as ONNX."""
    return tiny_exports(tmp_path_factory.mktemp("exported"), seed=5)


def rgb(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def no_cuda(monkeypatch, count: int = 0) -> None:
    """This machine as one with ``count`` CUDA devices, for the refusals."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_forms_are_accepted(value):
    assert is_device(value)


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "CPU", 0, None, "mps"])
def test_other_device_values_are_not(value):
    assert not is_device(value)


def test_auto_is_the_cpu_without_cuda_and_the_first_gpu_with_it(monkeypatch):
    no_cuda(monkeypatch)
    assert (torch_device("auto"), torch_device("cpu")) == ("cpu", "cpu")
    no_cuda(monkeypatch, count=2)
    assert (torch_device("auto"), torch_device("cuda"), torch_device("cuda:1")) == (
        "cuda:0",
        "cuda:0",
        "cuda:1",
    )


def test_cuda_without_a_cuda_device_is_refused_naming_the_setting(monkeypatch, exported):
    no_cuda(monkeypatch)
    with pytest.raises(ValueError) as refused:
        segattn.open_model(exported["safetensors"], device="cuda")
    assert (
        str(refused.value) == "device=cuda: this machine has no CUDA device; use device=cpu (or device=auto)"
    )


def test_a_gpu_index_past_the_last_names_how_many_there_are(monkeypatch):
    no_cuda(monkeypatch, count=1)
    with pytest.raises(
        ValueError, match=r"^device=cuda:3: this machine has 1 CUDA device\(s\), cuda:0 to cuda:0"
    ):
        torch_device("cuda:3")


def test_onnx_on_cuda_without_onnxruntime_gpu_names_the_extra():
    with pytest.raises(
        ValueError, match=r"^device=cuda: .*onnxruntime-gpu, which is not installed; pip install"
    ):
        onnx_providers("cuda", ["CPUExecutionProvider"])
    assert onnx_providers("auto", ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert onnx_providers("cuda:1", ["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        ("CUDAExecutionProvider", {"device_id": 1}),
        "CPUExecutionProvider",
    ]


def test_precision_auto_is_bf16_on_a_gpu_that_has_it_and_fp32_elsewhere():
    assert resolved_precision("auto", "cuda:0", onnx=False, bf16_supported=True) == "bf16"
    assert resolved_precision("auto", "cuda:0", onnx=False, bf16_supported=False) == "fp32"
    assert resolved_precision("auto", "cuda:0", onnx=True, bf16_supported=True) == "fp32"
    assert resolved_precision("auto", "cpu", onnx=False, bf16_supported=False) == "fp32"
    assert resolved_precision("bf16", "cpu", onnx=False, bf16_supported=False) == "bf16"


def test_fp16_on_the_cpu_and_half_precision_of_an_onnx_model_are_refused(exported):
    opened = segattn.open_model(exported["safetensors"], device="cpu")
    with pytest.raises(
        ValueError, match=r"^inference.precision=fp16 on device=cpu: half precision runs on a CUDA"
    ):
        opened.predict(rgb(32, 32, 0), precision="fp16")
    onnx_model = segattn.open_model(exported["onnx"], device="cpu")
    with pytest.raises(ValueError, match=r"^inference.precision=bf16: an ONNX model runs in the precision"):
        onnx_model.predict(rgb(32, 32, 0), precision="bf16")


@pytest.mark.parametrize("form", ["safetensors", "onnx"])
@pytest.mark.parametrize("inference", [{}, {"mode": "slide", "crop": 24, "stride": 16, "crop_batch_size": 3}])
def test_lists_and_arrays_of_images_give_the_masks_of_one_by_one(exported, form, inference):
    """Mixed sizes are grouped by size, never refused; every mask is exactly the one-by-one mask."""
    opened = segattn.open_model(exported[form], device="cpu")
    images = [rgb(32, 40, 1), rgb(48, 32, 2), rgb(32, 40, 3), rgb(32, 40, 4)]
    alone = [opened.predict(image, **inference) for image in images]
    for batch_size in (None, 2, 3):
        masks = opened.predict(images, batch_size=batch_size, **inference)
        assert all(np.array_equal(a, b) for a, b in zip(alone, masks, strict=True))
    stacked = opened.predict(np.stack([images[0], images[2], images[3]]), batch_size=3, **inference)
    assert all(np.array_equal(a, b) for a, b in zip([alone[0], *alone[2:]], stacked, strict=True))
    logits = opened.logits(images, batch_size=2, **inference)
    assert [item.shape[1:] for item in logits] == [(32, 40), (48, 32), (32, 40), (32, 40)]
    np.testing.assert_allclose(logits[1], opened.logits(images[1], **inference), atol=1e-5)
    ids, probabilities = opened.predict(images, probabilities=True, batch_size=2, **inference)[3]
    assert np.array_equal(ids, alone[3]) and np.allclose(probabilities.sum(axis=0), 1, atol=1e-5)


@pytest.mark.parametrize("downsample", [1, 2])
def test_the_torch_path_normalises_on_the_device_as_numpy_does(exported, downsample):
    """uint8 images go to the device and are normalised there: the numpy normalisation's values and the
    logits of the numpy-normalised batch, a shrinking model's included."""
    opened = segattn.open_model(exported["safetensors"], device="cpu")
    record = replace(
        opened.record, data_config={**(opened.record.data_config or {}), "downsample": downsample}
    )
    opened = replace(opened, record=record)
    images = [rgb(32, 40, 1), rgb(32, 40, 2)]
    shrunk = [shrink_image(image, downsample) for image in images]
    on_host = np.concatenate([normalize(image, record.mean, record.std) for image in shrunk])
    np.testing.assert_array_equal(opened.normalized(shrunk).numpy(), on_host)
    settings = opened.settings()
    expected = opened.run_torch(on_host, settings, (32, 40))
    np.testing.assert_allclose(
        opened.batch_logits(images, settings).numpy(), expected.numpy(), rtol=0, atol=1e-6
    )


def test_a_moved_model_runs_where_it_was_moved(exported):
    opened = segattn.open_model(exported["safetensors"], device="cpu").to("cpu")
    assert opened.device == "cpu" and next(opened.network.parameters()).device.type == "cpu"
    assert segattn.open_model(exported["onnx"], device="auto").to("cpu").device == "cpu"


@pytest.fixture
def folder(tmp_path) -> Path:
    """Five images of two sizes in an order that mixes them, and one that cannot be read."""
    images = tmp_path / "images"
    images.mkdir()
    for index, size in enumerate([(32, 40), (32, 40), (48, 32), (32, 40), (48, 32)]):
        Image.fromarray(rgb(*size, seed=10 + index)).save(images / f"i{index}.png")
    (images / "z.png").write_bytes(b"\x89PNG\r\n\x1a\nnot an image")
    return images


@pytest.mark.parametrize("form", ["safetensors", "onnx"])
def test_predict_over_a_folder_through_loader_workers_in_batches_writes_the_one_by_one_masks(
    exported, folder, tmp_path, form
):
    base = [f"checkpoint={exported[form]}", f"input={folder}", "device=cpu"]
    assert main([*base, f"out={tmp_path / 'one'}", "num_workers=0"]) == 1  # z.png: skipped, named, status 1
    assert main([*base, f"out={tmp_path / 'batched'}", "num_workers=2", "inference.batch_size=3"]) == 1
    for index in range(5):
        one, batched = (
            np.asarray(Image.open(tmp_path / run / "masks" / f"i{index}.png")) for run in ("one", "batched")
        )
        assert np.array_equal(one, batched)
    assert sorted(path.name for path in (tmp_path / "batched" / "overlays").iterdir()) == [
        f"i{index}.png" for index in range(5)
    ]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("device=gpu", "device='gpu': expected auto, cpu, cuda or cuda:N"),
        ("inference.precision=fp16", "inference.precision=fp16 on device=cpu: half precision runs on a CUDA"),
        ("inference.batch_size=0", "inference.batch_size=0: expected null or an integer >= 1"),
    ],
)
def test_predict_refuses_a_setting_this_machine_cannot_run_before_writing(
    exported, folder, tmp_path, capsys, setting, message
):
    out = tmp_path / "out"
    code = main(
        [f"checkpoint={exported['safetensors']}", f"input={folder}", f"out={out}", "device=cpu", setting]
    )
    assert code != 0
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_predict_with_cuda_on_a_machine_without_it_says_so(exported, folder, tmp_path, capsys, monkeypatch):
    no_cuda(monkeypatch)
    out = tmp_path / "out"
    assert (
        main([f"checkpoint={exported['safetensors']}", f"input={folder}", f"out={out}", "device=cuda"]) == 1
    )
    assert "device=cuda: this machine has no CUDA device" in capsys.readouterr().err
    assert not out.exists()


@CUDA
def test_the_gpu_predicts_the_masks_of_the_cpu(exported):
    images = [rgb(32, 40, seed) for seed in range(4)]
    cpu = segattn.open_model(exported["safetensors"], device="cpu").predict(images)
    gpu = segattn.open_model(exported["safetensors"], device="cuda").predict(
        images, precision="fp32", batch_size=4
    )
    assert np.mean([np.mean(a == b) for a, b in zip(cpu, gpu, strict=True)]) >= 0.999


@CUDA
def test_bf16_class_maps_agree_with_fp32_on_nearly_every_pixel(exported):
    opened = segattn.open_model(exported["safetensors"], device="cuda")
    images = [rgb(64, 96, seed) for seed in range(4)]
    fp32 = opened.predict(images, precision="fp32", batch_size=4)
    bf16 = opened.predict(images, precision="bf16", batch_size=4)
    assert np.mean([np.mean(a == b) for a, b in zip(fp32, bf16, strict=True)]) >= 0.995


@pytest.mark.skipif(
    not torch.cuda.is_available()
    or "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers(),
    reason="needs a CUDA device and onnxruntime-gpu",
)
def test_an_onnx_model_runs_on_the_cuda_provider(exported):
    opened = segattn.open_model(exported["onnx"], device="cuda")
    assert opened.device == "cuda:0" and opened.session.session.get_providers()[0] == "CUDAExecutionProvider"
    image = rgb(32, 40, 0)
    cpu = segattn.open_model(exported["onnx"], device="cpu").predict(image)
    assert np.mean(opened.predict(image) == cpu) >= 0.999
