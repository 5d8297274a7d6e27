"""``model.compile=true``: the network trains and validates under torch.compile (real inductor), compiled
in place, so checkpoints look exactly like eager ones and rebuild without the ``compile`` key.

Inductor compiles C++ for every fused kernel of every graph (forward, backward and the validation forward of
encoder and head) and that is nearly all of this test's time, so the network is the smallest that has both
parts: a one-block ViT with plain linear attention (the default flatten PVT had 4 stages of kernels to build,
148 s on a cold cache on a 2-core CI machine)."""

from typing import ClassVar

import pytest
import pytorch_lightning as pl
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from train_overrides import QUIET, TINY_DATA, TINY_MODEL

import segattn
from segattn.training.run import run


class KeepModule(pl.Callback):
    """Keeps the trained LightningModule where the test can look at it."""

    modules: ClassVar[list[pl.LightningModule]] = []

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.modules.append(pl_module)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_training_writes_eager_checkpoints(train_config, tmp_path, monkeypatch, fresh_dynamo):
    monkeypatch.setattr(KeepModule, "modules", [])
    cfg = train_config(
        *QUIET,
        *TINY_DATA,
        *TINY_MODEL["vit"],
        "model.depth=1",
        "attention=linear",
        "logger=none",
        "model.compile=true",
        "trainer.max_epochs=1",
        "trainer.num_sanity_val_steps=0",
        f"+callbacks.keep_module._target_={__name__}.KeepModule",
    )
    summary = run(cfg)
    assert summary["steps"] == 2  # 8 images, batch 4

    # Compiled in place, once: encoder and head (forward_with_aux goes through them), graphs were built.
    (module,) = KeepModule.modules
    assert module.compiled
    for part in (module.model.encoder, module.model.head):
        assert part._compiled_call_impl is not None
    assert module.model._compiled_call_impl is None  # Segmentor.compile compiles its parts
    assert counters["frames"]["ok"] > 0

    # The checkpoint is an eager one: plain keys, and a model config without the training-only key.
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert not [key for key in ckpt["state_dict"] if "_orig_mod" in key]
    assert "compile" not in ckpt["segattn"]["model"]
    opened = segattn.open_model(path)  # strict: every tensor matched by name
    model = opened.network
    assert "compile" not in opened.record.model
    images = torch.randn(1, 3, 40, 48)
    with torch.no_grad():
        assert model(images).shape == (1, 5, 40, 48)


def test_compile_must_be_a_boolean(train_config):
    with pytest.raises(ValueError, match=r"model\.compile='yes'; expected true or false"):
        run(train_config(*QUIET, *TINY_DATA, *TINY_MODEL["pvt"], "logger=none", "model.compile=yes"))
