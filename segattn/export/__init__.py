"""Export a trained model to ONNX, TorchScript or safetensors, each checked against PyTorch right after
it is written: ``python -m segattn.export checkpoint=... format=onnx out=...``."""

from .command import export, main
from .verify import ExportError

__all__ = ["ExportError", "export", "main"]
