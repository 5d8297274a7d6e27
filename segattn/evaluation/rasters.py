"""Score a ``data=raster`` split: each whole raster predicted strip by strip, counted strip by strip.

The prediction of a strip is exactly what ``segattn.predict`` streams into its mask (``slide_strips``,
the windows and TTA of ``infer(mode="slide")``); its label rows are read by window and added to the
confusion matrix before the next strip is inferred, so memory follows the window and the raster width,
not its area, as in streaming prediction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..data.raster import RasterLayout, read_labels
from ..inference.raster_predict import raster_strips
from ..inference.trained import TrainedModel
from ..raster_io import RasterImage, describe_window, raster_env
from ..tiling import SlideSettings, slide_settings
from .average_precision import AveragePrecisionMetric, score_logits
from .metrics import SegmentationMetric


def raster_settings(inference: dict[str, Any]) -> SlideSettings:
    """The inference group as slide settings; ValueError naming the key when a raster cannot stream."""
    if inference.get("mode") != "slide" or inference.get("crop") is None:
        raise ValueError(
            f"inference.mode={inference.get('mode')!r}: data=raster scores whole rasters strip by strip; "
            "set inference.mode=slide inference.crop=[H,W]"
        )
    return slide_settings(inference)


def score_rasters(
    model: TrainedModel,
    source: RasterLayout,
    split: str,
    inference: dict[str, Any],
    metric: SegmentationMetric,
    ap: AveragePrecisionMetric,
    on_raster: Callable[[str], None] | None = None,
) -> int:
    """Add every raster of ``split`` to ``metric`` and ``ap``; returns how many rasters were scored."""
    if model.network is None:
        raise ValueError(
            f"checkpoint={model.path}: data=raster streams through torch; evaluate the checkpoint "
            "or its safetensors export instead of the ONNX model"
        )
    settings = raster_settings(inference)
    network = model.windows_network(settings.precision)
    samples = source.samples(split)
    if not samples:
        raise ValueError(f"split={split!r} of dataset 'raster' at {source.root} has no rasters")
    for sample in samples:
        if on_raster is not None:
            on_raster(sample.image.name)
        with raster_env(), torch.inference_mode():
            image = RasterImage(sample.image)
            try:
                row, width = 0, image.size[1]
                for logits in raster_strips(network, image, model.record, settings):
                    window = (row, row + logits.shape[1], 0, width)
                    where = f"{sample.mask} at {describe_window(window)}"
                    labels = sample.decoder(read_labels(sample.mask, window), where)
                    score_logits(logits[None], torch.from_numpy(labels)[None].long(), metric, ap)
                    row = window[1]
            finally:
                image.close()
    return len(samples)


__all__ = ["raster_settings", "score_rasters"]
