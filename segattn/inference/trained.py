"""``open_model(path, device=...)``: a train.py checkpoint or an export (safetensors, ONNX, TorchScript),
opened to run on a device; ``TrainedModel.predict`` / ``.logits``: one way to run it on an image or a batch
of them.

eval, predict (streamed rasters included) and export open every model here, so each accepts the same
files and says the same thing about a wrong one. A checkpoint or a safetensors directory is rebuilt in
torch (``segattn.checkpoints.loading``, ``weights_only=True``) and a TorchScript export loaded by
``torch.jit.load``; both run through the same torch inference. An ONNX model gets an onnxruntime session
and torch is never imported, so predict runs where torch is not installed.

    import segattn
    model = segattn.open_model("outputs/runs/<run>/checkpoints/best.ckpt")   # device="auto": a GPU if any
    classes = model.predict(rgb)        # numpy uint8 [H, W, 3] (or a path) -> class ids [H, W]
    masks = model.predict([rgb, path], batch_size=8)   # a list or [N, H, W, 3] -> a list, batched by size

A model trained on shrunk images (``data.downsample`` = f, recorded in the checkpoint) is given the image
shrunk f times, as in training, and its logits are resized back to the image's size, as eval.py scores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..images import as_hw, indivisible, shrink_image
from ..record import MODEL_SOURCES, RECORD_FILE, WEIGHTS_FILE, ModelRecord
from ..tiling import INFERENCE, INFERENCE_DEFAULTS, RUNTIME_KEYS, image_settings
from .device import resolved_precision, torch_device
from .image_io import normalize, read_input
from .onnx import ONNX_FILE, OnnxSegmentor, infer_numpy

if TYPE_CHECKING:
    import torch
    from torch import Tensor
    from torch.nn import Module


@dataclass(frozen=True)
class TrainedModel:
    """An opened model: what it is (``record``), the file it came from (``path``; for ONNX the .onnx file),
    its ``format`` (``checkpoint``, ``safetensors``, ``segformer``, ``torchscript`` or ``onnx``), what runs
    it (``network``, the Segmentor or the TorchScript module in eval mode, or ``session``, the onnxruntime
    session of an ONNX model) and where (``device``: ``cpu`` or ``cuda:N``)."""

    record: ModelRecord
    path: Path
    format: str
    network: Module | None = None
    session: OnnxSegmentor | None = None
    device: str = "cpu"

    @property
    def downsample(self) -> int:
        """The shrink factor the model was trained at (``data.downsample``; 1 when not recorded)."""
        return self.record.downsample

    def to(self, device: str) -> TrainedModel:
        """This model on ``device`` (auto, cpu, cuda, cuda:N; ``segattn.inference.device``): the network
        moved there (it is shared with this one), or an ONNX model's session rebuilt with that provider."""
        if self.session is not None:
            session = OnnxSegmentor(self.path, self.session.threads, device)
            return replace(self, session=session, device=session.device)
        where = torch_device(device)
        return replace(self, network=self.network.to(where), device=where)

    def settings(self, **inference: Any) -> dict[str, Any]:
        """``INFERENCE_DEFAULTS``, overlaid with how the model was validated (where its record has it),
        overlaid with ``inference``; a ValueError naming the key for an unknown setting or one this model
        cannot run here (multi-scale testing of an ONNX model, a precision its device lacks)."""
        recorded = {
            key: value
            for key, value in (self.record.inference or {}).items()
            if key in INFERENCE_DEFAULTS and key not in RUNTIME_KEYS
        }
        settings = inference_settings({**recorded, **inference})
        if self.session is not None and list(settings["scales"]) != [1.0]:
            raise ValueError(
                f"inference.scales={list(settings['scales'])}: multi-scale testing runs on the torch path; "
                f"use the checkpoint or its safetensors export instead of {self.path}, or set "
                "inference.scales=[1.0]"
            )
        self.precision(settings)
        return settings

    def precision(self, settings: dict[str, Any]) -> str:
        """``inference.precision`` of ``settings`` on this model's device (``resolved_precision``)."""
        bf16_supported = False
        if self.device.startswith("cuda") and self.network is not None:
            import torch

            bf16_supported = torch.cuda.is_bf16_supported()
        return resolved_precision(
            settings["precision"], self.device, self.session is not None, bf16_supported
        )

    def run(self, images: np.ndarray, **inference: Any) -> np.ndarray:
        """float32 logits [B, K, h, w] of normalised float32 ``images`` [B, 3, h, w], at their own size, by
        ``inference`` (the config group's keys): torch on the model's device for a checkpoint, a safetensors
        or a TorchScript export, onnxruntime for ONNX. No shrinking here: eval's datasets shrink as training
        did; ``logits`` shrinks an image."""
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
        return self.run_torch(images, settings).cpu().numpy()

    def run_torch(
        self, images: np.ndarray | Tensor, settings: dict[str, Any], size: tuple[int, int] | None = None
    ) -> Tensor:
        """``run``'s torch path: fp32 logits on the model's device of a numpy batch (or a tensor), under
        autocast in ``settings``' precision, resized bilinearly (half-pixel centres, as validation scores a
        shrunk model) to ``size``."""
        import torch
        import torch.nn.functional as F

        from .infer import infer

        with torch.inference_mode(), self.autocast(settings):
            tensor = torch.as_tensor(images, device=self.device)
            logits = infer(self.network, tensor, self.record.num_classes, **image_settings(settings)).float()
            if size is not None and tuple(logits.shape[-2:]) != size:
                logits = F.interpolate(logits, size, mode="bilinear", align_corners=False)
        return logits

    def autocast(self, settings: dict[str, Any]) -> torch.autocast:
        """torch's autocast on this model's device in ``settings``' precision (off for fp32)."""
        import torch

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision(settings))
        return torch.autocast(self.device.partition(":")[0], dtype=dtype, enabled=dtype is not None)

    def windows_network(self, precision: str = INFERENCE_DEFAULTS["precision"]) -> Callable[[Tensor], Tensor]:
        """The torch network for windows held on the host (streamed rasters): moved to the model's device,
        run in ``precision`` (``inference.precision``), fp32 logits back on the host."""
        autocast = self.autocast(self.settings(precision=precision))

        def run(windows: Tensor) -> Tensor:
            with autocast:
                return self.network(windows.to(self.device)).float().cpu()

        return run

    def batch_logits(self, rgbs: list[np.ndarray], settings: dict[str, Any]) -> Any:
        """float32 logits [B, K, H, W] of RGB images of one size (a torch tensor on the model's device, or
        numpy for ONNX): normalised by the record's statistics, shrunk by ``downsample`` and the logits
        resized back, predicted by ``settings``."""
        height, width = rgbs[0].shape[:2]
        factor = self.downsample
        if problem := indivisible(height, width, factor):
            raise ValueError(
                f"data.downsample={factor} (recorded in {self.path}): the image {problem}; the model was "
                f"trained on images shrunk {factor}x, so crop or pad the image to a multiple of {factor}"
            )
        shrunk = [shrink_image(rgb, factor) for rgb in rgbs]
        if self.session is None:
            return self.run_torch(self.normalized(shrunk), settings, (height, width))
        images = np.concatenate([normalize(rgb, self.record.mean, self.record.std) for rgb in shrunk])
        logits = self.run(images, **settings)
        if factor == 1:
            return logits
        import cv2  # bilinear with half-pixel centres, as the torch path resizes, without torch

        resize = partial(cv2.resize, dsize=(width, height), interpolation=cv2.INTER_LINEAR)
        return np.stack([np.stack([resize(plane) for plane in image]) for image in logits])

    def normalized(self, rgbs: list[np.ndarray]) -> Tensor:
        """``normalize`` of RGB images of one size, in float32 on this model's device: sent there as uint8."""
        import torch

        images = torch.as_tensor(np.stack(rgbs), device=self.device).permute(0, 3, 1, 2).contiguous().float()
        mean, std = images.new_tensor([self.record.mean, self.record.std])[..., None, None]
        return images.div_(255).sub_(mean).div_(std)

    def batches(
        self, images: Images, inference: dict[str, Any]
    ) -> tuple[Iterator[tuple[list[int], Any]], bool]:
        """((indices, ``batch_logits`` of those images) for each batch, whether ``images`` was one image):
        the images in batches of ``inference.batch_size`` (null: 1) of one size each, run as they are read."""
        rgbs, single = image_list(images)
        settings = self.settings(**inference)
        groups = size_batches(rgbs, settings["batch_size"] or 1)
        return (
            (indices, self.batch_logits([rgbs[i] for i in indices], settings)) for indices in groups
        ), single

    def logits(self, images: Images, **inference: Any) -> np.ndarray | list[np.ndarray]:
        """float32 logits [K, H, W] of one RGB image (uint8 [H, W, 3], or a path read as training reads it)
        at its own size (``batch_logits``); a list of them for a list of images or an [N, H, W, 3] array."""
        batches, single = self.batches(images, inference)
        results = scattered((indices, list(as_numpy(logits))) for indices, logits in batches)
        return results[0] if single else results

    def predict(self, images: Images, probabilities: bool = False, **inference: Any) -> Any:
        """Class ids [H, W] (uint8 up to 256 classes, else int64) of one RGB image (``logits``), or a list for
        a list of images or an [N, H, W, 3] array; with ``probabilities`` each is (ids, the softmax over
        classes, float32 [K, H, W])."""
        if not isinstance(probabilities, bool):
            raise ValueError(f"probabilities={probabilities!r}: expected True or False")
        dtype = np.uint8 if self.record.num_classes <= 256 else np.int64
        batches, single = self.batches(images, inference)
        per_batch = []
        for indices, logits in batches:
            ids = logits.argmax(1)
            if dtype == np.uint8 and not isinstance(ids, np.ndarray):
                ids = ids.byte()  # on the model's device: a byte a pixel copied back, not int64's eight
            per_image = list(as_numpy(ids).astype(dtype, copy=False))
            if probabilities:
                scores = as_numpy(logits)
                shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
                per_image = list(zip(per_image, shifted / shifted.sum(axis=1, keepdims=True), strict=True))
            per_batch.append((indices, per_image))
        results = scattered(per_batch)
        return results[0] if single else results


Images = np.ndarray | str | Path | Sequence[np.ndarray | str | Path]


def is_one_image(images: Images) -> bool:
    """One image: a path, or an array that is not [N, H, W, 3]."""
    return isinstance(images, str | Path) or (isinstance(images, np.ndarray) and images.ndim != 4)


def image_list(images: Images) -> tuple[list[np.ndarray], bool]:
    """(RGB uint8 [H, W, 3] arrays, whether ``images`` was one image) of a path or an array, a list of
    them, or an [N, H, W, 3] array; paths are read as training reads them."""
    one = is_one_image(images)
    items = [images] if one else list(images)
    return [
        read_input(Path(item)) if isinstance(item, str | Path) else check_rgb(item) for item in items
    ], one


def size_batches(rgbs: list[np.ndarray], batch_size: int) -> list[list[int]]:
    """Indices of ``rgbs`` grouped by image size (in order of first appearance), ``batch_size`` at most."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, rgb in enumerate(rgbs):
        groups.setdefault(rgb.shape, []).append(index)
    return [
        part[start : start + batch_size]
        for part in groups.values()
        for start in range(0, len(part), batch_size)
    ]


def scattered(batches: Iterable[tuple[list[int], list[Any]]]) -> list[Any]:
    """The results of ``batches`` ((indices, one result per index)) back in the images' order."""
    placed = {
        index: result for indices, results in batches for index, result in zip(indices, results, strict=True)
    }
    return [placed[index] for index in range(len(placed))]


def as_numpy(values: Any) -> np.ndarray:
    """A numpy array of a torch tensor (copied to the host) or of a numpy array (itself)."""
    return values if isinstance(values, np.ndarray) else values.cpu().numpy()


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


def open_model(path: str | Path, threads: int = 0, device: str = "auto") -> TrainedModel:
    """Open ``path``: a train.py checkpoint, an exported safetensors directory, a Hugging Face SegFormer
    folder (config.json + weights), an ONNX model (a .onnx file, or a directory holding model.onnx alone) or
    a TorchScript export (model.pt, or a directory holding it alone), to run on ``device`` (auto: the first
    CUDA device if there is one, else the CPU; cpu, cuda, cuda:N); ``threads`` sets onnxruntime's (0: its
    default).

    Raises FileNotFoundError for a missing path and ValueError for a file that is not such a model or a
    device this machine lacks, one line naming the path or setting and what was expected.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint={path}: no such file or directory; expected {MODEL_SOURCES}")
    if is_onnx(path):
        session = OnnxSegmentor(path, threads, device)
        return TrainedModel(session.record, session.path, "onnx", session=session, device=session.device)
    from ..checkpoints import loading
    from ..checkpoints.resume import is_torchscript

    where = torch_device(device)  # a device this machine lacks is refused before the model is read
    if is_torchscript(path):
        (network, record), kind = loading.load_torchscript(path, where), "torchscript"
    elif path.is_dir() and (path / "config.json").is_file() and not (path / RECORD_FILE).is_file():
        (network, record), kind = loading.load_segformer_folder(path), "segformer"
    elif path.is_dir():
        (network, record), kind = loading.load_exported(path), "safetensors"
    else:
        (network, record), kind = loading.load_checkpoint(path), "checkpoint"
    return TrainedModel(record, path, kind, network=network.to(where), device=where)


__all__ = ["INFERENCE_DEFAULTS", "TrainedModel", "inference_settings", "is_onnx", "open_model"]
