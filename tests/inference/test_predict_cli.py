"""python -m segattn.predict on a folder with a corrupt file: ONNX without torch, and the torch path (from
safetensors and from TorchScript)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from export_fixtures import MEAN, PALETTE, STD, tiny_exports, tiny_model
from PIL import Image

from segattn.predict import main

SIZES = {"a.png": (37, 53), "b.jpg": (64, 40)}  # (H, W); b is grayscale


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """One tiny model exported as safetensors, ONNX and TorchScript."""
    return tiny_exports(tmp_path_factory.mktemp("exported"), seed=3)


@pytest.fixture
def images(tmp_path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (*SIZES["a.png"], 3), dtype=np.uint8)).save(folder / "a.png")
    Image.fromarray(rng.integers(0, 256, SIZES["b.jpg"], dtype=np.uint8)).save(folder / "b.jpg")
    (folder / "c.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not an image")
    (folder / "notes.txt").write_text("not an image suffix, ignored")
    return folder


def expected_mask(path: Path) -> np.ndarray:
    """argmax of the PyTorch model on (pixel / 255 - mean) / std: the definition predict must follow."""
    rgb = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0
    x = torch.from_numpy(((rgb - np.float32(MEAN)) / np.float32(STD)).transpose(2, 0, 1)[None].copy())
    with torch.inference_mode():
        return tiny_model("linear", seed=3)(x)[0].argmax(0).numpy()


def test_onnx_predict_runs_without_torch_skips_the_corrupt_file_and_fails_at_the_end(
    exported, images, tmp_path
):
    out = tmp_path / "out"
    code = "import sys; sys.modules['torch'] = None; from segattn.predict import main; sys.exit(main())"
    args = [f"checkpoint={exported['onnx']}", f"input={images}", f"out={out}"]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "c.png" in result.stderr and "skipping" in result.stderr
    for name, size in SIZES.items():
        mask = np.asarray(Image.open(out / "masks" / f"{Path(name).stem}.png"))
        assert mask.shape == size
        assert (mask == expected_mask(images / name)).mean() > 0.999  # argmax ties aside, the same classes
        overlay = np.asarray(Image.open(out / "overlays" / f"{Path(name).stem}.png"))
        assert overlay.shape == (*size, 3)
    assert not (out / "masks" / "c.png").exists()


def test_overlays_false_writes_the_masks_alone(exported, images, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(
            [f"checkpoint={exported['safetensors']}", f"input={images}/a.png", f"out={out}", "overlays=false"]
        )
        == 0
    )
    assert sorted(path.name for path in out.iterdir()) == ["masks"]
    np.testing.assert_array_equal(
        np.asarray(Image.open(out / "masks" / "a.png")), expected_mask(images / "a.png")
    )
    assert capsys.readouterr().out.strip().endswith(f"wrote 1 masks to {out / 'masks'}")


def test_torch_predict_from_safetensors_matches_the_model(exported, images, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([f"checkpoint={exported['safetensors']}", f"input={images}/*.png", f"out={out}"]) == 1
    assert "replacing" not in capsys.readouterr().out
    # a rerun into the same out= says which of its files it replaces before writing them
    assert main([f"checkpoint={exported['safetensors']}", f"input={images}/*.png", f"out={out}"]) == 1
    said = capsys.readouterr().out
    assert f"replacing 2 file(s) of an earlier run in {out}: masks/a.png, overlays/a.png" in said
    mask = np.asarray(Image.open(out / "masks" / "a.png"))
    np.testing.assert_array_equal(mask, expected_mask(images / "a.png"))
    colours = np.asarray(PALETTE)[mask]
    rgb = np.asarray(Image.open(images / "a.png"), dtype=np.float32)
    overlay = np.asarray(Image.open(out / "overlays" / "a.png"), dtype=np.float32)
    background = (mask == 0)[..., None]  # not coloured by default: the image shows through undimmed
    np.testing.assert_allclose(
        overlay, np.where(background, rgb, np.round(0.5 * rgb + 0.5 * colours)), atol=1
    )
    assert background.any() and not background.all()


def test_torch_predict_from_torchscript_matches_the_model(exported, images, tmp_path):
    """A TorchScript export predicts through the same torch path as the safetensors export: slide, flip."""
    options = [
        "inference.mode=slide",
        "inference.crop=[16,24]",
        "inference.stride=[8,16]",
        "inference.flip=true",
    ]
    for kind in ("torchscript", "safetensors"):
        args = [f"checkpoint={exported[kind]}", f"input={images}/*.png", f"out={tmp_path / kind}", *options]
        assert main(args) == 1  # c.png is not an image
    for name, size in SIZES.items():
        if name.endswith(".png"):
            masks = [
                np.asarray(Image.open(tmp_path / kind / "masks" / name))
                for kind in ("torchscript", "safetensors")
            ]
            assert masks[0].shape == size and (masks[0] == masks[1]).mean() > 0.999


def test_overlay_classes_pick_the_coloured_classes_and_an_unknown_one_is_refused(exported, images, tmp_path):
    out = tmp_path / "out"
    args = [f"checkpoint={exported['safetensors']}", f"input={images / 'a.png'}", f"out={out}"]
    assert main([*args, "overlay_classes=[background,thing,stuff]"]) == 0
    mask = np.asarray(Image.open(out / "masks" / "a.png"))
    rgb = np.asarray(Image.open(images / "a.png"), dtype=np.float32)
    overlay = np.asarray(Image.open(out / "overlays" / "a.png"), dtype=np.float32)
    np.testing.assert_allclose(overlay, np.round(0.5 * rgb + 0.5 * np.asarray(PALETTE)[mask]), atol=1)
    assert main([*args, f"out={tmp_path / 'refused'}", "overlay_classes=[sky]"]) == 1
    assert not (tmp_path / "refused").exists()


def test_slide_and_flip_agree_between_onnx_numpy_and_torch_paths(exported, images, tmp_path):
    options = ["inference.mode=slide", "inference.crop=[16,24]", "inference.stride=[8,16]"]
    options += ["inference.crop_batch_size=3", "inference.flip=true"]
    for kind in ("onnx", "safetensors"):
        main(
            [f"checkpoint={exported[kind]}", f"input={images / 'a.png'}", f"out={tmp_path / kind}", *options]
        )
    onnx_mask = np.asarray(Image.open(tmp_path / "onnx" / "masks" / "a.png"))
    torch_mask = np.asarray(Image.open(tmp_path / "safetensors" / "masks" / "a.png"))
    assert onnx_mask.shape == SIZES["a.png"]
    assert (onnx_mask == torch_mask).mean() > 0.999


def test_predict_errors_name_the_problem(exported, images, tmp_path, capsys):
    assert (
        main(
            [
                f"checkpoint={exported['onnx']}",
                f"input={images}",
                f"out={tmp_path}",
                "inference.scales=[0.5,1.0]",
            ]
        )
        == 1
    )
    assert "multi-scale" in capsys.readouterr().err
    assert main([f"checkpoint={tmp_path / 'missing.ckpt'}", f"input={images}", f"out={tmp_path}"]) == 1
    assert "missing.ckpt" in capsys.readouterr().err
