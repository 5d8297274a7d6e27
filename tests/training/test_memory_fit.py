"""The GPU memory check before training (segattn/training/memory_fit.py): which runs it measures, the one
line that refuses a step too large for the device before anything is written, and (on CUDA) the step it
measures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from reliability_fixtures import BASE, VIT, compose_run

from segattn.config import plain
from segattn.data import SegDataModule
from segattn.errors import SegattnError
from segattn.training import memory_fit
from segattn.training import run as train

GIB = 2**30


class FakeDevice:
    total_memory = 80 * GIB


@pytest.fixture
def one_fake_gpu(monkeypatch):
    """This process sees one 80 GiB GPU; any real CUDA call would fail the test."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: FakeDevice())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def trainer_cfg(**trainer):
    return OmegaConf.create({"trainer": {"accelerator": "auto", "devices": 1, "strategy": "auto", **trainer}})


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        ({}, torch.device("cuda", 0)),
        ({"devices": [3]}, torch.device("cuda", 3)),
        ({"devices": "auto"}, torch.device("cuda", 0)),  # one visible GPU
        ({"devices": 2, "strategy": "ddp"}, None),  # each rank's device is chosen by Lightning later
        ({"accelerator": "cpu"}, None),
        ({"strategy": {"name": "spatial", "bands": 2}}, None),  # a step split over devices
        ({"strategy": {"name": "fsdp"}}, None),
        ({"num_nodes": 2}, None),
    ],
)
def test_the_check_measures_single_gpu_runs_only(one_fake_gpu, trainer, expected):
    assert memory_fit.training_device(trainer_cfg(**trainer)) == expected


def test_no_gpu_no_check():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert memory_fit.training_device(trainer_cfg()) is None


def test_a_step_too_large_is_refused_before_anything_is_written(tmp_path, monkeypatch, one_fake_gpu):
    def out_of_memory(module, shape, device, dtype):
        assert shape == (2, 3, 32, 32) and device == torch.device("cuda", 0) and dtype is None
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    monkeypatch.setattr(memory_fit, "step_peak_bytes", out_of_memory)
    monkeypatch.setattr(train, "build_loggers", pytest.fail)  # no logger, no trainer, no checkpoint
    cfg = compose_run(tmp_path, *BASE, *VIT, "data.batch_size=2", "trainer.accelerator=auto")
    with pytest.raises(SegattnError) as error:
        train.run(cfg)
    assert str(error.value) == (
        "data.crop_size=[32, 32] at data.batch_size=2: one training step does not fit in cuda:0 (Fake GPU, "
        "80.0 GiB); set model.grad_checkpointing=true, loss.chunk_rows=256, trainer.precision=bf16-mixed, "
        "data.batch_size=1, a smaller data.crop_size; or check_memory=false to try anyway"
    )
    assert not (tmp_path / "run").exists()


def test_remedies_leave_out_what_the_run_already_uses():
    cfg = OmegaConf.create({"trainer": {"precision": "bf16-mixed"}})
    module = SimpleNamespace(
        model=SimpleNamespace(config={"grad_checkpointing": True}), criterion=SimpleNamespace(chunk_rows=128)
    )
    datamodule = SimpleNamespace(
        batch_size=1, crop_size=None, downsample=2, source=SimpleNamespace(downsample=2)
    )
    assert memory_fit.remedies(cfg, module, datamodule) == "set data.downsample=4"


def test_a_step_that_fits_is_said_with_its_peak(monkeypatch, one_fake_gpu, caplog):
    monkeypatch.setattr(memory_fit, "step_peak_bytes", lambda *args: int(75 * GIB))
    cfg = OmegaConf.merge(trainer_cfg(precision="bf16-mixed"), {"check_memory": True})
    datamodule = SimpleNamespace(batch_size=1)
    with caplog.at_level("INFO"):
        peak = memory_fit.check_memory_fits(cfg, None, datamodule, {"data.crop_size=[64, 64]": (64, 64)})
    assert peak == 75 * GIB
    assert "peaks at 75.00 GiB of 80.0 GiB on cuda:0; tight: optimizer state comes on top" in caplog.text
    unchecked = OmegaConf.merge(cfg, {"check_memory": False})
    assert memory_fit.check_memory_fits(unchecked, None, datamodule, {}) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_step_on_cuda_measures_a_peak_and_leaves_no_gradients(tmp_path):
    cfg = compose_run(tmp_path, *BASE, *VIT, "data.batch_size=2", "trainer.accelerator=gpu")
    datamodule = SegDataModule(**plain(cfg.data))
    module = train.build_module(cfg, datamodule)
    peak = memory_fit.step_peak_bytes(module, (2, 3, 64, 64), torch.device("cuda", 0), torch.bfloat16)
    assert peak > 2 * 3 * 64 * 64 * 4  # at least the input
    assert all(p.grad is None for p in module.parameters())
    torch.cuda.set_per_process_memory_fraction(peak / 4 / torch.cuda.get_device_properties(0).total_memory)
    try:
        with pytest.raises(SegattnError, match="one training step does not fit in cuda:0"):
            memory_fit.check_memory_fits(cfg, module, datamodule, {"data.crop_size=[512, 512]": (512, 512)})
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
