"""Inference: whole-image, sliding-window and test-time-augmented prediction in torch (``infer``), the
same geometry in numpy around onnxruntime (``onnx``), window tiling and image I/O.

``infer`` and ``MODES`` are imported on first use, so the onnxruntime path (``segattn.predict`` with an
ONNX model) runs where torch is not installed.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("infer", "infer_slide", "infer_whole", "MODES"):
        from . import infer

        return getattr(infer, name)
    raise AttributeError(f"module 'segattn.inference' has no attribute {name!r}")
