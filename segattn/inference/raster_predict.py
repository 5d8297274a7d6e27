"""Predict a raster larger than memory: read by window, infer strip by strip, write a GeoTIFF mask.

    out/masks/<stem>.tif       class index per pixel: tiled, deflate-compressed, the input's CRS/transform
    out/overviews/<stem>.png   the mask in palette colours, longest side at most ``OVERVIEW_SIDE``

The mask grows in ``out/masks/.<stem>.tif.partial``; after each strip (one row of output tiles) is on
disk, ``.<stem>.tif.progress.json`` records how many rows are done and under which settings. A killed
run started again with the same input, model and settings continues at the first missing strip; the
mask appears under its real name only when complete (fsync + rename), so it is never half-valid.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..files import atomic_write, fsync_replace
from ..raster_io import (
    BLOCK,
    RasterImage,
    create_mask,
    has_size,
    raster_env,
    read_overview,
    write_rows,
)
from ..record import ModelRecord
from ..tiling import SlideSettings, Window, slide_windows
from .image_io import normalize, save_rgb
from .strips import first_job, slide_strips
from .trained import TrainedModel

OVERVIEW_SIDE = 1024


def outputs(out: Path, path: Path) -> dict[str, Path]:
    """Where the mask, its partial file, the progress record and the overview of ``path`` go."""
    masks = out / "masks"
    return {
        "mask": masks / f"{path.stem}.tif",
        "partial": masks / f".{path.stem}.tif.partial",
        "progress": masks / f".{path.stem}.tif.progress.json",
        "overview": out / "overviews" / f"{path.stem}.png",
    }


def run_key(path: Path, model: TrainedModel, settings: SlideSettings) -> dict[str, Any]:
    """What a partial mask was computed from; a resume needs all of it unchanged."""
    image, model_path = path.stat(), model.path
    return {
        "input": str(path.resolve()),
        "input_bytes": image.st_size,
        "input_mtime_ns": image.st_mtime_ns,
        "model": str(model_path.resolve()),
        "model_mtime_ns": model_path.stat().st_mtime_ns if model_path.exists() else None,
        "num_classes": model.record.num_classes,
        **{
            key: list(value) if isinstance(value, tuple) else value for key, value in asdict(settings).items()
        },
    }


def resume_row(files: dict[str, Path], key: dict[str, Any], size: tuple[int, int]) -> int:
    """Rows already in the partial mask when its progress record matches ``key`` and the partial still
    opens at the raster's size; 0 (start over) otherwise, e.g. after a kill in the middle of a write."""
    try:
        record = json.loads(files["progress"].read_text())
    except (OSError, ValueError):
        return 0
    rows, height = record.get("rows"), size[0]
    whole_strips = isinstance(rows, int) and 0 < rows <= height and (rows % BLOCK == 0 or rows == height)
    if record.get("key") != key or not whole_strips or not has_size(files["partial"], size):
        return 0
    return rows


def record_progress(files: dict[str, Path], key: dict[str, Any], rows: int) -> None:
    """Write the progress record crash-safe: a kill leaves the old record or the new."""
    record = json.dumps({"key": key, "rows": rows}).encode()
    atomic_write(files["progress"], lambda handle: handle.write(record))


def raster_strips(
    network: Callable[[Tensor], Tensor],
    image: RasterImage,
    record: ModelRecord,
    settings: SlideSettings,
    start_row: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[Tensor]:
    """``slide_strips`` of ``network`` over a raster: windows read and normalised by ``record``'s mean and
    std as the model was trained, strips of one output tile row (``BLOCK``); what predict writes and eval
    scores."""

    def read(window: Window) -> Tensor:
        return torch.from_numpy(normalize(image.read(window), record.mean, record.std)[0])

    return slide_strips(network, read, image.size, record.num_classes, settings, BLOCK, start_row, on_batch)


def predict_raster(
    model: TrainedModel,
    path: Path,
    out: Path,
    settings: SlideSettings,
    on_windows: Callable[[int, int], None] | None = None,
    after_strip: Callable[[int], None] | None = None,
    on_resume: Callable[[int, int, Path], None] | None = None,
) -> Path:
    """Segment the raster ``path`` with ``model``'s torch network into ``out/masks/<stem>.tif`` (and its
    overview); returns the mask path.

    ``on_windows(done, total)`` follows progress in windows; ``after_strip(rows_done)`` runs after each
    strip is recorded (tests stop a run there); ``on_resume(row, height, partial)`` is told where a run
    continues an earlier one's partial mask. Raises ValueError naming the file (and window) on bad input.
    """
    files = outputs(out, path)
    with raster_env(), torch.inference_mode():
        image = RasterImage(path)
        try:
            key = run_key(path, model, settings)
            height, width = image.size
            start = resume_row(files, key, image.size)
            if start == 0:
                files["mask"].parent.mkdir(parents=True, exist_ok=True)
                create_mask(files["partial"], image.size, model.record.num_classes, image.profile)
            elif on_resume is not None:
                on_resume(start, height, files["partial"])
            windows = slide_windows(height, width, settings.crop, settings.stride)
            views = 2 if settings.flip else 1
            total, done = len(windows) * views, first_job(windows, start, settings.crop_batch_size) * views

            def counted(n: int) -> None:
                nonlocal done
                done += n
                if on_windows is not None:
                    on_windows(done, total)

            strips = raster_strips(
                model.windows_network(settings.precision), image, model.record, settings, start, counted
            )
            row = start
            for logits in strips if start < height else ():  # start == height: only the rename was missing
                write_rows(files["partial"], row, logits.argmax(dim=0).numpy(), model.record.palette)
                row += logits.shape[1]
                record_progress(files, key, row)
                if after_strip is not None:
                    after_strip(row)
        finally:
            image.close()
        overview = np.asarray(model.record.palette, dtype=np.uint8)[
            read_overview(files["partial"], OVERVIEW_SIDE)
        ]
    save_rgb(overview, files["overview"])
    fsync_replace(files["partial"], files["mask"])
    os.remove(files["progress"])
    return files["mask"]


__all__ = ["OVERVIEW_SIDE", "outputs", "predict_raster", "raster_strips"]
