"""model=efficientvit with litemla (timm's block) and with flatten in its place: one training step, then
ONNX with dynamic H, W that onnxruntime runs as PyTorch does (litemla through the default dynamo exporter,
about 10 s here; flatten through the TorchScript-based one, under 1 s)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from export_fixtures import CLASSES, SECOND, SIZE, tiny_record

from segattn.export import export
from segattn.models import build_model

TOLERANCE = 1e-4


@pytest.mark.parametrize(
    ("attention", "exporter"),
    [pytest.param("litemla", "auto", marks=pytest.mark.slow), ("flatten", "torchscript")],  # slow: dynamo
)
def test_efficientvit_trains_a_step_and_exports_to_onnx(attention: str, exporter: str, tmp_path) -> None:
    torch.manual_seed(0)
    model = build_model(
        "efficientvit",
        num_classes=len(CLASSES),
        attention=attention,
        widths=[8, 8, 16, 16, 32],
        depths=[1, 1, 1, 1, 1],
        head_channels=16,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    images, target = torch.randn(2, 3, 64, 96), torch.randint(0, len(CLASSES), (2, 64, 96))
    loss = F.cross_entropy(model(images), target)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert all(not torch.equal(p, before[name]) for name, p in model.named_parameters()), "a parameter froze"

    # BatchNorm running statistics := those of one batch, so that eval outputs are O(1), not the O(1e-2) of
    # a fresh network, and the absolute tolerance is a tight one
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.momentum = 1.0
    with torch.no_grad():
        model(images)
    model.eval()
    report = export(model, tiny_record(model), "onnx", tmp_path, size=SIZE, exporter=exporter)
    assert report["dynamic"]
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in [(1, 3, *SIZE), SECOND]:
        batch = rng.standard_normal(shape, dtype=np.float32)
        with torch.inference_mode():
            expected = model(torch.from_numpy(batch)).numpy()
        assert np.abs(expected).max() > 1000 * TOLERANCE
        np.testing.assert_allclose(session.run(None, {"images": batch})[0], expected, atol=TOLERANCE)
