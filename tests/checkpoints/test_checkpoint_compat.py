"""A checkpoint is compared with the requested model before anything is restored: resuming into another
attention, size, attention option or class count fails naming both values; ``init_from`` with another
class count reports the skipped head tensors and trains; files that are not checkpoints, or truncated
ones, fail with the path and what was expected."""

from __future__ import annotations

import shutil

import pytest
import torch
from reliability_fixtures import BASE, VIT, compose_run

from segattn.models import build_model
from segattn.training import run as train

ONE_STEP = [*BASE, *VIT, "logger=none", "trainer.max_epochs=1", "trainer.limit_train_batches=1"]
ONE_STEP += ["trainer.limit_val_batches=1", "test_after_fit=false"]
VIT_OPTIONS = {"embed_dim": 32, "depth": 2, "num_heads": 2, "patch_size": 8, "head_channels": 16}  # = VIT


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """last.ckpt of a one-step vit + linear run on the 5-class synthetic data."""
    folder = tmp_path_factory.mktemp("trained")
    train.run(compose_run(folder, *ONE_STEP))
    return folder / "run" / "checkpoints" / "last.ckpt"


def refused(tmp_path, monkeypatch, *overrides: str) -> str:
    """The one-line error of a run refused before any logger, trainer or output exists."""
    monkeypatch.setattr(train, "build_loggers", pytest.fail)
    with pytest.raises(ValueError) as error:
        train.run(compose_run(tmp_path, *ONE_STEP, *overrides))
    assert not (tmp_path / "run").exists()
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize(
    ("overrides", "difference"),
    [
        (["attention=taylor"], "attention=linear vs taylor"),
        (["model.size=small"], "model.size=tiny vs small"),
        (["attention.options.feature_map=relu"], "attention.options.feature_map=elu vs relu"),
        (["model.depth=3"], "model.depth=2 vs 3"),
    ],
)
def test_resuming_into_another_model_names_both_values(trained, tmp_path, monkeypatch, overrides, difference):
    message = refused(tmp_path, monkeypatch, f"ckpt_path={trained}", *overrides)
    assert message.startswith(f"ckpt_path={trained}: the checkpoint was trained with a different model")
    assert difference in message and f"init_from={trained}" in message


def test_resuming_with_another_class_count_names_both_counts(trained, tmp_path, monkeypatch):
    checkpoint = torch.load(trained, map_location="cpu", weights_only=True)
    checkpoint["segattn"]["model"]["num_classes"] = 7
    seven = tmp_path / "seven.ckpt"
    torch.save(checkpoint, seven)
    assert "data.num_classes (class count)=7 vs 5" in refused(tmp_path, monkeypatch, f"ckpt_path={seven}")


def test_init_from_another_class_count_lists_the_skipped_head_and_trains(tmp_path, monkeypatch):
    model = build_model("vit", num_classes=7, attention="linear", **VIT_OPTIONS)
    source = tmp_path / "seven_classes.ckpt"
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    torch.save({"state_dict": state, "segattn": {"model": dict(model.config)}}, source)
    said = []
    monkeypatch.setattr(train, "rank_zero_info", said.append)
    summary = train.run(compose_run(tmp_path, *ONE_STEP, f"init_from={source}"))
    assert summary["steps"] == 1
    report = next(line for line in said if line.startswith(f"init_from={source}"))
    assert "data.num_classes (class count)=7 vs 5" in report
    assert "skipped (shape) ['head.classifier.bias', 'head.classifier.weight']" in report


def bad_files(tmp_path, trained) -> dict[str, tuple]:
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(trained.read_bytes()[: trained.stat().st_size // 2])
    listing = tmp_path / "list.ckpt"
    torch.save([1, 2], listing)
    size = truncated.stat().st_size
    return {
        "text": (text, "not a segattn/Lightning checkpoint: a file of 17 bytes starting with b'not '"),
        "empty": (empty, "not a segattn/Lightning checkpoint: an empty file"),
        "truncated": (truncated, f"truncated checkpoint: {size} bytes, the end of the archive is missing"),
        "list": (listing, "not a segattn/Lightning checkpoint: no 'state_dict' entry (found list)"),
    }


@pytest.mark.parametrize("key", ["ckpt_path", "init_from"])
def test_files_that_are_not_checkpoints_are_named(trained, tmp_path, monkeypatch, key):
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(trained, copy / "last.ckpt")
    for path, expected in bad_files(copy, trained).values():
        message = refused(tmp_path, monkeypatch, f"{key}={path}")
        assert message.startswith(f"{key}={path}: {expected}"), message
