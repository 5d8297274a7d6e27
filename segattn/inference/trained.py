"""``open_model(path)``: a train.py checkpoint, an exported directory or an ONNX file, opened to run.

eval, predict (streamed rasters included) and export open every model here, so each accepts the same
files and says the same thing about a wrong one. A checkpoint or a safetensors directory is rebuilt in
torch (``segattn.checkpoints.loading``, ``weights_only=True``); an ONNX model gets an onnxruntime session
and torch is never imported, so predict runs where torch is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..record import WEIGHTS_FILE, ModelRecord
from .onnx import ONNX_FILE, OnnxSegmentor

if TYPE_CHECKING:
    from torch.nn import Module


@dataclass(frozen=True)
class TrainedModel:
    """An opened model: what it is (``record``), the file it came from (``path``; for ONNX the .onnx file),
    its ``format`` (``checkpoint``, ``safetensors`` or ``onnx``) and what runs it: ``network``, the
    Segmentor in eval mode on the CPU, or ``session``, the onnxruntime session of an ONNX model."""

    record: ModelRecord
    path: Path
    format: str
    network: Module | None = None
    session: OnnxSegmentor | None = None


def is_onnx(path: Path) -> bool:
    """A ``.onnx`` file, or a directory holding ``model.onnx`` but no safetensors export."""
    if path.is_dir():
        return (path / ONNX_FILE).is_file() and not (path / WEIGHTS_FILE).is_file()
    return path.suffix == ".onnx"


def open_model(path: str | Path, threads: int = 0) -> TrainedModel:
    """Open ``path``: a train.py checkpoint, an exported safetensors directory or an ONNX model (a .onnx
    file, or a directory holding model.onnx alone); ``threads`` sets onnxruntime's (0: its default).

    Raises FileNotFoundError for a missing path and ValueError for a file that is not such a model, one
    line naming the path and what was expected.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint={path}: no such file or directory; expected a train.py .ckpt, an exported "
            "safetensors directory or a model.onnx"
        )
    if is_onnx(path):
        session = OnnxSegmentor(path, threads)
        return TrainedModel(session.record, session.path, "onnx", session=session)
    from ..checkpoints.loading import load_checkpoint, load_exported

    if path.is_dir():
        network, record = load_exported(path)
        return TrainedModel(record, path, "safetensors", network=network)
    network, record = load_checkpoint(path)
    return TrainedModel(record, path, "checkpoint", network=network)


__all__ = ["TrainedModel", "is_onnx", "open_model"]
