"""model=pvt_v1 exports to ONNX with dynamic H, W: its learned position encodings (stage embeddings and
FLatten's key encoding, stored for the 64² pretraining grid here) are resampled inside the graph, so
onnxruntime matches PyTorch at another, non-square size."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from export_fixtures import CLASSES, SECOND, tiny_record

from segattn.export import export
from segattn.models import build_model

V1 = {"patch_embed": "plain", "ffn": "mlp", "position_encoding": "learned", "stage_norm": False}


def test_pvt_v1_exports_with_resampled_position_encodings(tmp_path) -> None:
    torch.manual_seed(0)
    model = build_model(
        "pvt",
        num_classes=len(CLASSES),
        attention="flatten",
        embed_dims=[16, 32, 32, 64],
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 2, 2],
        head_channels=16,
        img_size=64,
        **V1,
    ).eval()
    with torch.no_grad():  # position encodings and FLatten's scale away from their zero init
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    report = export(model, tiny_record(model), "onnx", tmp_path, size=(64, 64), exporter="torchscript")
    assert report["dynamic"]
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    batch = np.random.default_rng(0).standard_normal(SECOND, dtype=np.float32)  # 27×45: resampled grids
    with torch.inference_mode():
        expected = model(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(session.run(None, {"images": batch})[0], expected, atol=1e-4)
