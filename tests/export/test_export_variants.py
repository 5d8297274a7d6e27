"""Every attention variant exports: ONNX and TorchScript reproduce PyTorch, safetensors reloads exactly,
every variant traces and compiles, and the onnx_dynamic flag is what the variant really does."""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from export_fixtures import CLASSES, PALETTE, SECOND, SIZE, tiny_model, tiny_record

import segattn
from segattn.attention import attention_class, available_attention
from segattn.export import export
from segattn.inference.onnx import OnnxSegmentor, infer_numpy

VARIANTS = available_attention()
TOLERANCE = 1e-4


def reference(model: torch.nn.Module, images: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(images)).numpy()


@pytest.mark.parametrize("name", VARIANTS)
def test_onnx_export_matches_pytorch_in_onnxruntime(name, tmp_path):
    model = tiny_model(name)
    report = export(model, tiny_record(model), "onnx", tmp_path, size=SIZE)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    batch, _, height, width = session.get_inputs()[0].shape
    meta = json.loads(session.get_modelmeta().custom_metadata_map["segattn"])["data"]
    assert meta["classes"] == CLASSES and [tuple(c) for c in meta["palette"]] == PALETTE
    rng = np.random.default_rng(0)
    first = rng.standard_normal((1, 3, *SIZE), dtype=np.float32)
    np.testing.assert_allclose(
        session.run(None, {"images": first})[0], reference(model, first), atol=TOLERANCE
    )
    if attention_class(name).onnx_dynamic:
        assert report["dynamic"] and all(isinstance(dim, str) for dim in (batch, height, width))
        second = rng.standard_normal(SECOND, dtype=np.float32)
        np.testing.assert_allclose(
            session.run(None, {"images": second})[0], reference(model, second), atol=TOLERANCE
        )
    else:
        # Fixed shape: another size is refused by onnxruntime, and predict slides the export-size crop.
        assert (height, width) == SIZE and isinstance(batch, str)
        with pytest.raises(Exception, match="images"):
            session.run(None, {"images": rng.standard_normal(SECOND, dtype=np.float32)})
        big = rng.standard_normal((1, 3, 40, 56), dtype=np.float32)
        logits = infer_numpy(OnnxSegmentor(tmp_path), big)
        assert logits.shape == (1, len(CLASSES), 40, 56)
        # 32 × 32 windows at stride 16 start at rows 0, 8 and columns 0, 16, 24: only the first sees [:8, :16]
        first_window = reference(model, np.ascontiguousarray(big[..., :32, :32]))
        np.testing.assert_allclose(logits[..., :8, :16], first_window[..., :8, :16], atol=TOLERANCE)


@pytest.mark.parametrize("name", VARIANTS)
def test_torchscript_trace_matches_pytorch(name, tmp_path):
    model = tiny_model(name)
    export(model, tiny_record(model), "torchscript", tmp_path, size=SIZE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        traced = torch.jit.load(str(tmp_path / "model.pt"))
    generator = torch.Generator().manual_seed(1)
    for shape in [(1, 3, *SIZE), SECOND]:
        images = torch.randn(shape, generator=generator)
        with torch.inference_mode():
            torch.testing.assert_close(traced(images), model(images), atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_safetensors_reload_gives_identical_outputs(name, tmp_path):
    model = tiny_model(name)
    export(model, tiny_record(model), "safetensors", tmp_path, size=SIZE)
    opened = segattn.open_model(tmp_path)
    reloaded, record = opened.network, opened.record
    assert record.classes == CLASSES and record.palette == PALETTE and record.model == model.config
    state, reloaded_state = model.state_dict(), reloaded.state_dict()
    assert state.keys() == reloaded_state.keys()
    assert all(torch.equal(state[key], reloaded_state[key]) for key in state)
    images = torch.randn(*SECOND)
    with torch.inference_mode():
        assert torch.equal(reloaded(images), model(images))


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_compiles_with_a_full_graph(name):
    """torch.compile(fullgraph=True) captures the whole model with this variant and reproduces eager.

    backend="aot_eager" runs capture and AOTAutograd decomposition without inductor's C++ codegen
    (minutes per variant on 2 CPU cores); static shapes keep it to about a second.
    """
    torch._dynamo.reset()  # every variant is a fresh graph, not a recompile against the cache limit
    model = tiny_model(name)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)
    images = torch.randn(*SECOND)
    with torch.no_grad():
        torch.testing.assert_close(compiled(images), model(images), atol=1e-5, rtol=1e-5)
