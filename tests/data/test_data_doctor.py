"""Bad data: the doctor and ``validate=true`` list every planted problem by file; loading fails by file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import H, W, label_grid, make_folder, rgb, save
from PIL import Image

from segattn.data import DataError, SegDataModule
from segattn.doctor import main as doctor

REPO = Path(__file__).resolve().parents[2]


def corrupt_image(root):
    path = root / "images" / "train" / "train01.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(200)))
    return path, "cannot be decoded"


def truncated_png(root):
    path = root / "images" / "val" / "val00.png"
    path.write_bytes(path.read_bytes()[:300])
    return path, "corrupt or truncated"


def size_mismatch(root):
    save(root / "masks" / "train" / "train02.png", np.zeros((H + 2, W), np.uint8))
    return root / "images" / "train" / "train02.png", f"is {W}x{H} but its mask is {W}x{H + 2}"


def unknown_labels(root):
    return save(
        root / "masks" / "test" / "test00.png", label_grid([0, 1, 7, 9])
    ), "unknown label values {7, 9}"


def binary_mask(root):
    return save(root / "masks" / "train" / "train00.png", label_grid([0, 255])), "binary 0/255 mask"


def missing_mask(root):
    (root / "masks" / "val" / "val01.png").unlink()
    return root / "masks" / "val" / "val01.png", "has no mask"


def empty_split(root):
    for path in (root / "images" / "test").iterdir():
        path.unlink()
    return root, "split 'test' of dataset 'folder'"


def mask_16_bit_out_of_range(root):
    path = root / "masks" / "test" / "test01.png"
    Image.fromarray(np.full((H, W), 1000, np.uint16)).save(path)
    return path, "unknown label values {1000}"


def colour_mask(root):
    return save(root / "masks" / "val" / "val00.png", rgb(9)), "is a colour image"


PROBLEMS = [
    corrupt_image,
    truncated_png,
    size_mismatch,
    unknown_labels,
    binary_mask,
    missing_mask,
    empty_split,
    mask_16_bit_out_of_range,
    colour_mask,
]


def _args(root: Path) -> list[str]:
    return ["data=folder", f"data.root={root}", "data.num_classes=3"]


def test_clean_fixture_and_documented_conversions_pass(tmp_path, capsys):
    root = make_folder(tmp_path)
    save(root / "images" / "train" / "train00.png", rgb(1)[..., 0])  # grey: replicated to RGB
    rgba = np.concatenate([rgb(2), np.full((H, W, 1), 128, np.uint8)], axis=2)
    save(root / "images" / "train" / "train01.png", rgba)  # RGBA: alpha dropped
    Image.fromarray(label_grid([0, 1, 2, 255]).astype(np.uint16)).save(root / "masks" / "val" / "val00.png")
    assert doctor(_args(root)) == 0
    out = capsys.readouterr().out
    assert "no problems found" in out and f"{W}x{H} (3)" in out
    # columns cycle 0, 1, 2, 255 over 16 columns: each class is a third of the labelled pixels
    assert out.count("33.33%") == 3 * 3 and out.count("25.00%") == 3
    dm = SegDataModule("folder", root=root, num_classes=3, validate=True, crop_size=8)
    dm.setup()
    assert dm.datasets["train"][0]["image"].shape == (3, 8, 8)


@pytest.mark.parametrize("plant", PROBLEMS)
def test_each_planted_problem_is_found_and_named(tmp_path, capsys, plant):
    root = make_folder(tmp_path)
    path, message = plant(root)
    assert doctor(_args(root)) == 1
    out = capsys.readouterr().out
    assert "1 problem(s):" in out
    problem = next(line for line in out.splitlines() if line.startswith("  - "))
    assert str(path) in problem and message in problem

    with pytest.raises(DataError) as failure:  # validate=true: fail at setup, naming the file
        SegDataModule("folder", root=root, num_classes=3, validate=True).setup()
    assert str(path) in str(failure.value) and message in str(failure.value)

    dm = SegDataModule("folder", root=root, num_classes=3)  # without validate: fail when that item loads
    if plant is empty_split:
        with pytest.raises(DataError, match="is empty"):
            dm.setup()
        return
    dm.setup()
    split = path.parent.name
    dataset = dm.datasets[{"train": "train", "val": "val", "test": "test"}[split]]
    index = next(i for i, s in enumerate(dataset.samples) if s.image.stem == path.stem)
    with pytest.raises(DataError) as failure:
        dataset[index]
    assert str(path) in str(failure.value)


def test_all_problems_are_listed_at_once(tmp_path, capsys):
    root = make_folder(tmp_path)
    planted = [plant(root) for plant in PROBLEMS if plant is not empty_split]  # it would hide two others
    assert doctor(_args(root)) == 1
    out = capsys.readouterr().out
    assert f"{len(planted)} problem(s):" in out
    for path, message in planted:
        assert any(str(path) in line and message in line for line in out.splitlines()), (path, message)


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        (["data.crop_size=null", "data.batch_size=2"], "data.crop_size=null with data.batch_size=2: a batch"),
        (["data.downsample=5"], "data.downsample=5: training image "),
    ],
    ids=["whole images of mixed sizes", "downsample not dividing"],
)
def test_doctor_reports_what_train_refuses_in_the_training_images(tmp_path, capsys, settings, refusal):
    """The doctor runs train.py's checks of the training images (``preflight.train_sizes``): a configuration
    train.py refuses before training is a problem here too, in train.py's words."""
    root = make_folder(tmp_path)
    save(root / "images" / "train" / "odd.png", rgb(7, 20, 10))
    save(root / "masks" / "train" / "odd.png", label_grid([0, 1], 20, 10))
    assert doctor([*_args(root), f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    assert "no problems found" in capsys.readouterr().out
    assert doctor([*_args(root), f"data.cache_dir={tmp_path / 'cache'}", *settings]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith(f"  - {refusal}"), problems


def test_configuration_errors_exit_2(tmp_path, capsys):
    assert doctor(["data=folder", f"data.root={make_folder(tmp_path)}", "data.num_classes=4"]) == 2
    assert "num_classes=4" in capsys.readouterr().err
    assert doctor(["data=nope"]) == 2


@pytest.mark.slow
def test_doctor_command_line(tmp_path):
    root = make_folder(tmp_path)
    path, _ = missing_mask(root)
    run = subprocess.run(
        [sys.executable, "-m", "segattn.doctor", *_args(root), "model=vit"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stderr
    assert str(path) in run.stdout and "ignoring 'model=vit'" in run.stderr
