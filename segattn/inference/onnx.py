"""Run an exported ``model.onnx`` with onnxruntime and numpy only: whole, slide and flip inference.

This mirrors ``segattn.inference.infer`` (same window geometry from ``segattn.tiling``) for machines
without torch. A fixed-shape export (a variant whose ``onnx_dynamic`` flag is False) can only see crops
of its export size, so it always runs in slide mode with that crop, padding images smaller than it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import FileFormatError, one_line
from ..record import RECORD_KEY, ModelRecord
from ..tiling import INFERENCE_DEFAULTS, default_stride, slide_windows
from .device import CUDA_PROVIDER, onnx_providers

ONNX_FILE = "model.onnx"


class OnnxSegmentor:
    """``model.onnx`` in an onnxruntime session on ``device`` (``segattn.inference.device``: the CUDA
    provider where onnxruntime-gpu has one); ``record``: the ``ModelRecord`` embedded in it; ``device``: where
    the session runs (``cpu`` or ``cuda:N``)."""

    def __init__(self, path: str | Path, threads: int = 0, device: str = "auto") -> None:
        import onnxruntime as ort

        path = Path(path)
        self.path = path / ONNX_FILE if path.is_dir() else path
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such ONNX model (python -m segattn.export format=onnx)")
        providers = onnx_providers(device, ort.get_available_providers())
        self.threads = threads
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 4  # fatal only: its errors surface as exceptions, said in one line
        again = "export it again with python -m segattn.export format=onnx"
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as error:  # onnxruntime's InvalidProtobuf, InvalidGraph, Fail: no ONNX model
            raise FileFormatError(
                f"{self.path}: not an ONNX model onnxruntime can load ({one_line(error)}); {again}", self.path
            ) from None
        on_cuda = CUDA_PROVIDER in self.session.get_providers()
        if device not in ("auto", "cpu") and not on_cuda:
            raise ValueError(f"device={device}: onnxruntime-gpu found no CUDA device here; use device=cpu")
        self.device = f"cuda:{providers[0][1]['device_id']}" if on_cuda else "cpu"
        raw = self.session.get_modelmeta().custom_metadata_map.get(RECORD_KEY)
        self.record = ModelRecord.read(raw, str(self.path), RECORD_KEY, f"'{RECORD_KEY}' metadata", again)
        self.input_name = self.session.get_inputs()[0].name
        _, _, height, width = self.session.get_inputs()[0].shape
        self.fixed_size = (height, width) if isinstance(height, int) and isinstance(width, int) else None

    def __call__(self, images: np.ndarray) -> np.ndarray:
        """float32 [B, 3, H, W] -> logits [B, K, H, W]."""
        return self.session.run(None, {self.input_name: np.ascontiguousarray(images, dtype=np.float32)})[0]


def slide_numpy(
    model: OnnxSegmentor,
    images: np.ndarray,
    num_classes: int,
    crop: tuple[int, int],
    stride: tuple[int, int],
    crop_batch_size: int,
) -> np.ndarray:
    """Crops batched ``crop_batch_size`` at a time, overlaps averaged with a count map (as in infer_slide)."""
    batch, _, height, width = images.shape
    windows = slide_windows(height, width, crop, stride)
    jobs = [(index, window) for index in range(batch) for window in windows]
    logits = np.zeros((batch, num_classes, height, width), dtype=np.float32)
    count = np.zeros((height, width), dtype=np.float32)
    for top, bottom, left, right in windows:
        count[top:bottom, left:right] += 1
    for start in range(0, len(jobs), crop_batch_size):
        chunk = jobs[start : start + crop_batch_size]
        crops = np.stack([images[i, :, top:bottom, left:right] for i, (top, bottom, left, right) in chunk])
        for crop_logits, (i, (top, bottom, left, right)) in zip(model(crops), chunk, strict=True):
            logits[i, :, top:bottom, left:right] += crop_logits
    return logits / count


def infer_numpy(
    model: OnnxSegmentor,
    images: np.ndarray,
    mode: str = INFERENCE_DEFAULTS["mode"],
    crop: tuple[int, int] | None = None,
    stride: tuple[int, int] | None = None,
    crop_batch_size: int = INFERENCE_DEFAULTS["crop_batch_size"],
    flip: bool = INFERENCE_DEFAULTS["flip"],
) -> np.ndarray:
    """Logits [B, K, H, W] for normalised float32 ``images`` [B, 3, H, W]; flip TTA averages the mirror."""
    num_classes = model.record.num_classes
    height, width = images.shape[-2:]
    if model.fixed_size is not None:
        # A fixed-shape graph sees only crops of its export size: pad small images up to it, then slide.
        mode, crop = "slide", model.fixed_size
        stride = stride or default_stride(crop)
        pad_h, pad_w = max(0, crop[0] - height), max(0, crop[1] - width)
        images = np.pad(images, ((0, 0), (0, 0), (0, pad_h), (0, pad_w)))

    def run(x: np.ndarray) -> np.ndarray:
        if mode == "slide":
            if crop is None:
                raise ValueError("infer_numpy: mode='slide' needs crop (height, width)")
            step = stride or default_stride(crop)
            return slide_numpy(model, x, num_classes, crop, step, crop_batch_size)
        if mode != "whole":
            raise ValueError(f"mode={mode!r}; expected 'whole' or 'slide'")
        return model(x)

    logits = run(images)
    if flip:
        logits = (logits + run(images[..., ::-1])[..., ::-1]) / 2
    return logits[..., :height, :width]


__all__ = ["ONNX_FILE", "OnnxSegmentor", "infer_numpy", "slide_numpy"]
