"""``open_model(path)``: a train.py checkpoint, an exported directory or an ONNX file, opened to run;
``TrainedModel.predict`` / ``.logits``: one way to run it on an image.

eval, predict (streamed rasters included) and export open every model here, so each accepts the same
files and says the same thing about a wrong one. A checkpoint or a safetensors directory is rebuilt in
torch (``segattn.checkpoints.loading``, ``weights_only=True``); an ONNX model gets an onnxruntime session
and torch is never imported, so predict runs where torch is not installed.

    import segattn
    model = segattn.open_model("outputs/runs/<run>/checkpoints/best.ckpt")
    classes = model.predict(rgb)        # numpy uint8 [H, W, 3] (or a path) -> class ids [H, W]

A model trained on shrunk images (``data.downsample`` = f, recorded in the checkpoint) is given the image
shrunk f times, as in training, and its logits are resized back to the image's size, as eval.py scores.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..images import as_hw, shrink_image
from ..record import WEIGHTS_FILE, ModelRecord
from ..tiling import INFERENCE
from .image_io import normalize, read_input
from .onnx import ONNX_FILE, OnnxSegmentor, infer_numpy

# The ``inference`` config group's keys and defaults (conf/inference/default.yaml): how a whole image is
# predicted. ``TrainedModel.logits`` takes them as keyword arguments.
INFERENCE_DEFAULTS: dict[str, Any] = {
    "mode": "whole",
    "crop": None,
    "stride": None,
    "crop_batch_size": 4,
    "scales": [1.0],
    "flip": False,
}

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

    @property
    def downsample(self) -> int:
        """The shrink factor the model was trained at (``data.downsample``; 1 when not recorded)."""
        return self.record.downsample

    def settings(self, **inference: Any) -> dict[str, Any]:
        """``INFERENCE_DEFAULTS``, overlaid with the settings the model was validated with (where its record
        has them), overlaid with ``inference``; a ValueError naming the key for an unknown setting or one
        this model cannot run (multi-scale testing of an ONNX model)."""
        recorded = {k: v for k, v in (self.record.inference or {}).items() if k in INFERENCE_DEFAULTS}
        settings = inference_settings({**recorded, **inference})
        if self.session is not None and list(settings["scales"]) != [1.0]:
            raise ValueError(
                f"inference.scales={list(settings['scales'])}: multi-scale testing runs on the torch path; "
                f"use the checkpoint or its safetensors export instead of {self.path}, or set "
                "inference.scales=[1.0]"
            )
        return settings

    def run(self, images: np.ndarray, **inference: Any) -> np.ndarray:
        """float32 logits [B, K, h, w] of normalised float32 ``images`` [B, 3, h, w], at their own size, by
        ``inference`` (the config group's keys): torch for a checkpoint or safetensors export, onnxruntime
        for ONNX. No shrinking here: eval's datasets shrink as training did; ``logits`` shrinks an image."""
        settings = self.settings(**inference)
        if self.session is not None:
            crop, stride = settings["crop"], settings["stride"]
            return infer_numpy(
                self.session,
                images,
                settings["mode"],
                None if crop is None else as_hw(crop, "inference.crop"),
                None if stride is None else as_hw(stride, "inference.stride"),
                int(settings["crop_batch_size"]),
                bool(settings["flip"]),
            ).astype(np.float32, copy=False)
        import torch

        from .infer import infer

        with torch.inference_mode():
            logits = infer(self.network, torch.from_numpy(images), self.record.num_classes, **settings)
        return logits.float().numpy()

    def logits(self, image: np.ndarray | str | Path, **inference: Any) -> np.ndarray:
        """float32 logits [K, H, W] of one RGB image (uint8 [H, W, 3], or a path read as training reads
        it) at its own size: normalised by the record's statistics, shrunk by ``downsample`` and the logits
        resized back (bilinear, as eval.py scores a shrunk model), predicted by ``inference``."""
        rgb = read_input(Path(image)) if isinstance(image, str | Path) else check_rgb(image)
        height, width = rgb.shape[:2]
        factor = self.downsample
        if factor > 1 and (height % factor or width % factor):
            raise ValueError(
                f"data.downsample={factor} (recorded in {self.path}): the image is {width}x{height}, not a "
                f"multiple of {factor} on each side; the model was trained on images shrunk {factor}x, so "
                f"crop or pad the image to a multiple of {factor}"
            )
        small = shrink_image(rgb, factor)
        logits = self.run(normalize(small, self.record.mean, self.record.std), **inference)
        if factor == 1:
            return logits[0]
        return resized_logits(logits[0], height, width, torch_path=self.network is not None)

    def predict(
        self, image: np.ndarray | str | Path, probabilities: bool = False, **inference: Any
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Class ids [H, W] (uint8 up to 256 classes, else int64) of one RGB image (``logits``); with
        ``probabilities`` also the softmax over classes, float32 [K, H, W]."""
        if not isinstance(probabilities, bool):
            raise ValueError(f"probabilities={probabilities!r}: expected True or False")
        logits = self.logits(image, **inference)
        ids = logits.argmax(axis=0)
        ids = ids.astype(np.uint8 if self.record.num_classes <= 256 else np.int64)
        if not probabilities:
            return ids
        shifted = np.exp(logits - logits.max(axis=0, keepdims=True))
        return ids, shifted / shifted.sum(axis=0, keepdims=True)


def resized_logits(logits: np.ndarray, height: int, width: int, torch_path: bool) -> np.ndarray:
    """Logits [K, h, w] resized bilinearly (half-pixel centres) to [K, height, width]: with torch's
    ``interpolate`` where the model runs in torch, which is how validation and eval.py score a shrunk
    model, so predict gives the masks they score; with OpenCV per class for an ONNX model (no torch)."""
    if torch_path:
        import torch
        import torch.nn.functional as F

        tensor = torch.from_numpy(logits)[None]
        return F.interpolate(tensor, (height, width), mode="bilinear", align_corners=False)[0].numpy()
    import cv2

    return np.stack([cv2.resize(c, (width, height), interpolation=cv2.INTER_LINEAR) for c in logits])


def inference_settings(inference: Mapping[str, Any]) -> dict[str, Any]:
    """``INFERENCE_DEFAULTS`` overlaid with ``inference``; an unknown key, or a value its rule refuses
    (``tiling.INFERENCE``: ``flip="no"`` is not a boolean), is a ValueError naming it."""
    unknown = sorted(set(inference) - set(INFERENCE_DEFAULTS))
    if unknown:
        raise ValueError(
            f"inference.{unknown[0]}: not an inference setting; expected among "
            f"{', '.join(INFERENCE_DEFAULTS)}"
        )
    bad = [
        f"inference.{key}={value!r}: expected {INFERENCE[key][0]}"
        for key, value in inference.items()
        if not INFERENCE[key][1](value)
    ]
    if bad:
        raise ValueError("; ".join(bad))
    return {**INFERENCE_DEFAULTS, **inference}


def check_rgb(image: np.ndarray) -> np.ndarray:
    """``image`` as uint8 [H, W, 3]; anything else is a ValueError saying what was given."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(
            f"image: {image.dtype} array of shape {list(image.shape)}; expected RGB uint8 [H, W, 3] "
            "(or a path to an image file)"
        )
    return image


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


__all__ = ["INFERENCE_DEFAULTS", "TrainedModel", "inference_settings", "is_onnx", "open_model"]
