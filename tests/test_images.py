"""segattn.images: one decoder for training and prediction, classes.json, the palette, the ImageNet
statistics; checked against hand-written expectations and Pillow's own per-mode decoding."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from segattn.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ClassList,
    DataError,
    default_palette,
    read_classes,
    read_image,
    read_mask,
    write_classes,
)

CONF = Path(__file__).resolve().parents[1] / "conf"


def save(path: Path, array: np.ndarray) -> Path:
    Image.fromarray(array).save(path)
    return path


def colours(seed: int, height: int = 3, width: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_default_palette_is_the_pascal_voc_palette():
    # colours of VOC's SegmentationClass palette, read off the devkit's documentation
    expected = {0: (0, 0, 0), 1: (128, 0, 0), 2: (0, 128, 0), 3: (128, 128, 0), 8: (64, 0, 0)}
    expected |= {15: (192, 128, 128), 20: (0, 64, 128), 255: (224, 224, 192)}
    palette = default_palette(256)
    assert {index: palette[index] for index in expected} == expected


def test_read_image_converts_grey_rgba_palette_and_16_bit(tmp_path):
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    np.testing.assert_array_equal(read_image(save(tmp_path / "g.png", grey)), np.stack([grey] * 3, axis=2))
    colour = colours(1)
    rgba = np.concatenate([colour, np.full((3, 4, 1), 7, np.uint8)], axis=2)  # alpha dropped, not blended
    np.testing.assert_array_equal(read_image(save(tmp_path / "a.png", rgba)), colour)
    Image.fromarray(colour).convert("P").save(tmp_path / "p.png")
    assert read_image(tmp_path / "p.png").shape == (3, 4, 3)
    deep = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000).astype(np.uint16)
    Image.fromarray(deep).save(tmp_path / "d.png")  # 16-bit grey keeps its top 8 bits
    np.testing.assert_array_equal(read_image(tmp_path / "d.png")[..., 0], deep >> 8)


def test_training_and_predict_decode_every_image_the_same_way(tmp_path):
    """A 16-bit PNG, a palette PNG and a grey JPEG, read by the folder dataset (training, eval) and by
    predict's reader: the same pixels, and the ones each format's rule gives."""
    from segattn.data.folder import FolderLayout
    from segattn.inference.image_io import read_input

    images, masks = tmp_path / "images" / "train", tmp_path / "masks" / "train"
    images.mkdir(parents=True)
    masks.mkdir(parents=True)
    (tmp_path / "classes.json").write_text(json.dumps(["a", "b"]))
    deep = np.array([[0, 255, 256, 4660], [40000, 65280, 65535, 513]], np.uint16)
    Image.fromarray(deep).save(images / "deep.png")
    palette_colours = [(255, 0, 0), (0, 0, 255), (10, 200, 30)]
    indices = np.array([[0, 1, 2, 1], [2, 2, 0, 1]], np.uint8)
    indexed = Image.fromarray(indices, mode="P")
    indexed.putpalette([value for colour in palette_colours for value in colour])
    indexed.save(images / "indexed.png")
    grey = np.arange(8, dtype=np.uint8).reshape(2, 4) * 30
    Image.fromarray(grey).save(images / "grey.jpg", quality=95)
    for stem in ("deep", "indexed", "grey"):
        save(masks / f"{stem}.png", np.zeros((2, 4), np.uint8))
    with Image.open(images / "grey.jpg") as jpeg:
        assert jpeg.mode == "L"
        decoded_grey = np.asarray(jpeg)  # the JPEG decoder's output: lossy, so compared with it
    expected = {
        "deep": np.repeat((deep >> 8).astype(np.uint8)[..., None], 3, axis=2),  # top 8 bits, not clipped
        "indexed": np.asarray(palette_colours, np.uint8)[indices],
        "grey": np.repeat(decoded_grey[..., None], 3, axis=2),
    }
    dataset = FolderLayout(tmp_path).dataset("train")
    for index, sample in enumerate(dataset.samples):
        training, predict = dataset.load_image(index), read_input(sample.image)
        np.testing.assert_array_equal(training, expected[sample.image.stem], err_msg=sample.image.name)
        np.testing.assert_array_equal(predict, training, err_msg=sample.image.name)
    assert sorted(sample.image.stem for sample in dataset.samples) == sorted(expected)


def test_corrupt_truncated_and_missing_files_name_the_file(tmp_path):
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=r"image .*junk\.png cannot be decoded"):
        read_image(tmp_path / "junk.png")
    whole = save(tmp_path / "whole.png", colours(2, 64, 64)).read_bytes()
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"mask .*cut\.png cannot be decoded.*corrupt or truncated"):
        read_mask(tmp_path / "cut.png")
    with pytest.raises(DataError, match=r"gone\.png does not exist"):
        read_image(tmp_path / "gone.png")


def test_read_mask_modes(tmp_path):
    values = np.array([[0, 1, 2, 255]], np.uint8)
    np.testing.assert_array_equal(read_mask(save(tmp_path / "l.png", values)), values)
    np.testing.assert_array_equal(
        read_mask(save(tmp_path / "grey_rgb.png", np.stack([values] * 3, 2))), values
    )
    deep = np.array([[0, 1, 300, 65535]], np.uint16)
    mask = read_mask(save(tmp_path / "16.png", deep))
    assert mask.dtype == np.uint16
    np.testing.assert_array_equal(mask, deep)
    with pytest.raises(DataError, match=r"colour\.png is a colour image"):
        read_mask(save(tmp_path / "colour.png", colours(3, 2, 2)))


SKY, ROAD = (4, 5, 6), (1, 2, 3)
DATASET_FORM = {
    "classes": [{"id": 1, "name": "road", "color": list(ROAD)}, {"id": 0, "name": "sky", "color": list(SKY)}],
    "ignore": {"color": [0, 0, 0]},
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (["sky", "road"], ClassList(["sky", "road"])),
        (DATASET_FORM, ClassList(["sky", "road"], [SKY, ROAD], (0, 0, 0))),
        ({"classes": ["sky", "road"], "palette": [SKY, ROAD]}, ClassList(["sky", "road"], [SKY, ROAD])),
    ],
)
def test_classes_json_forms(tmp_path, spec, expected):
    (tmp_path / "classes.json").write_text(json.dumps(spec))
    assert read_classes(tmp_path / "classes.json") == expected


def test_written_classes_json_reads_back_in_the_dataset_form(tmp_path):
    write_classes(tmp_path, ["sky", "road"], [(4, 5, 6), (1, 2, 3)])
    assert json.loads((tmp_path / "classes.json").read_text())["classes"][1] == {
        "id": 1,
        "name": "road",
        "color": [1, 2, 3],
    }
    assert read_classes(tmp_path / "classes.json") == ClassList(["sky", "road"], [(4, 5, 6), (1, 2, 3)])


@pytest.mark.parametrize(
    "text",
    ['{"classes": ["a", "b"], "palette": [[1, 2, 3]]}', '[{"id": 1, "name": "a"}]', "{", '{"classes": 3}'],
)
def test_a_malformed_classes_json_is_named(tmp_path, text):
    (tmp_path / "classes.json").write_text(text)
    with pytest.raises(
        DataError, match=r"classes\.json is not a valid classes\.json \(.*\); expected a list"
    ):
        read_classes(tmp_path / "classes.json")


def test_dataset_files_normalise_with_the_imagenet_statistics():
    """The conf/data files spell mean and std out (users see and override them there); they must be the
    values of segattn.images, the one Python home of the statistics."""
    for path in sorted((CONF / "data").glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        assert (tuple(config["mean"]), tuple(config["std"])) == (IMAGENET_MEAN, IMAGENET_STD), path.name


def test_images_and_predict_io_import_without_torch_lightning_or_hydra():
    code = (
        "import sys; import segattn.images, segattn.inference.image_io; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pytorch_lightning', 'hydra')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_an_image_name_that_is_no_file_says_what_it_is(tmp_path):
    """A folder, a FIFO or a symbolic link loop named *.png was "does not exist"."""
    (tmp_path / "folder.png").mkdir()
    os.mkfifo(tmp_path / "fifo.png")
    (tmp_path / "loop.png").symlink_to(tmp_path / "loop.png")
    (tmp_path / "broken.png").symlink_to(tmp_path / "gone")
    said = {
        "folder.png": "is a folder, not a file",
        "fifo.png": "is not a regular file (a FIFO, socket or device)",
        "loop.png": "is a symbolic link loop",
        "broken.png": "is a broken symbolic link",
        "missing.png": "does not exist",
    }
    for name, what in said.items():
        with pytest.raises(DataError, match=f"^image {re.escape(str(tmp_path / name))} {re.escape(what)}$"):
            read_image(tmp_path / name)
