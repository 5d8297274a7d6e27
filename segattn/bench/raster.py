"""Streaming prediction of a generated gigapixel GeoTIFF: peak resident memory and windows per second.

The raster (tiled, deflate-compressed RGB, 256-pixel tiles, a UTM CRS) is written strip by strip, so making it
needs no more memory than predicting it. ``python -m segattn.predict`` runs a tiny random ViT on it in a child
that reports its own peak resident set (``segattn.bench.peak``: the whole command, from import to the renamed
mask). The same command on a one-window raster gives the fixed part (imports, model, a first forward pass);
the difference is what streaming the wide raster holds. windows/s counts the slide windows over the large
run's wall time, start-up included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import torch
from rasterio.crs import CRS
from rasterio.transform import Affine
from rasterio.windows import Window

from ..checkpoints.loading import save_exported
from ..images import default_palette
from ..models import build_model
from ..raster_io import BLOCK
from ..record import ModelRecord
from ..tiling import slide_windows
from . import report

LIMIT_BYTES = int(1.5 * (1 << 30))  # the bound on a 20k² raster's peak resident memory


@dataclass(frozen=True)
class RasterSettings:
    """The generated raster and how it is predicted."""

    size: int  # pixels per side
    crop: int  # slide window side
    stride: int  # slide stride (default half the window)
    crop_batch_size: int
    classes: int
    threads: int  # torch threads in the predict child (0: torch's default)
    baseline: bool = True  # also measure the command on a one-window raster (its fixed cost)


def make_raster(path: Path, size: int) -> None:
    """A size × size RGB GeoTIFF of smooth gradients and noise (tiles compress as photos do, not as
    constant fields), written a strip of tiles at a time."""
    rng = np.random.default_rng(0)
    profile = {
        "driver": "GTiff",
        "height": size,
        "width": size,
        "count": 3,
        "dtype": "uint8",
        "crs": CRS.from_epsg(32633),
        "transform": Affine(0.5, 0.0, 500000.0, 0.0, -0.5, 4650000.0),  # 0.5 m pixels, north up
        "tiled": True,
        "blockxsize": BLOCK,
        "blockysize": BLOCK,
        "compress": "deflate",
        "BIGTIFF": "IF_SAFER",
    }
    columns = np.arange(size)[None, :]
    with rasterio.open(path, "w", **profile) as dataset:
        for top in range(0, size, BLOCK):
            rows = np.arange(top, min(top + BLOCK, size))[:, None]
            gradients = (rows * 255 // size, columns * 255 // size, (rows + columns) % 256)
            smooth = np.stack(np.broadcast_arrays(*gradients))
            strip = np.clip(smooth + rng.integers(-24, 24, smooth.shape, dtype=np.int16), 0, 255)
            dataset.write(strip.astype(np.uint8), window=Window(0, top, size, len(rows)))


def tiny_model(directory: Path, classes: int) -> None:
    """A one-block ViT (dim 16, 2 heads, patch 8, linear attention) with random weights, exported."""
    torch.manual_seed(0)
    config = {"name": "vit", "num_classes": classes, "attention": "linear", "embed_dim": 16, "depth": 1}
    config |= {"num_heads": 2, "patch_size": 8, "img_size": 32}
    model = build_model(**config)
    names = [f"class{index}" for index in range(classes)]
    record = ModelRecord(model.config, names, default_palette(classes), dataset="generated")
    save_exported(model.eval(), record, directory)


def predict_child(settings: RasterSettings, raster: Path, model: Path, out: Path) -> dict[str, Any]:
    """``python -m segattn.predict`` on the raster in a child (through ``segattn.bench.peak``): wall
    seconds, its peak resident set in bytes and its exit status."""
    report = out.with_suffix(".peak")
    command = [
        sys.executable, "-m", "segattn.bench.peak", str(report), "segattn.predict", f"checkpoint={model}",
        f"input={raster}", f"out={out}", "inference.mode=slide", f"inference.crop={settings.crop}",
        f"inference.stride={settings.stride}", f"inference.crop_batch_size={settings.crop_batch_size}",
        f"threads={settings.threads}",
    ]  # fmt: skip
    begin = time.perf_counter()
    status = subprocess.run(command, stdout=subprocess.DEVNULL, check=False).returncode
    seconds = time.perf_counter() - begin
    return {"seconds": seconds, "peak_bytes": int(report.read_text()), "status": status}


def run(settings: RasterSettings, out_dir: Path) -> dict[str, Any]:
    """Generate, predict, report; the row is also written to ``raster.json`` and ``raster.csv``."""
    work = out_dir / "raster"
    work.mkdir(parents=True, exist_ok=True)
    raster, model = work / f"scene_{settings.size}.tif", work / "model"
    report.progress(f"raster: writing a {settings.size}² tiled GeoTIFF to {raster}")
    begin = time.perf_counter()
    make_raster(raster, settings.size)
    make_seconds = time.perf_counter() - begin
    tiny_model(model, settings.classes)
    small = work / f"scene_{settings.crop}.tif"
    baseline: dict[str, Any] = {"peak_bytes": None, "status": 0}  # not measured
    if settings.baseline:
        make_raster(small, settings.crop)
        report.progress("raster: the command's fixed cost (imports, model) on a one-window raster")
        baseline = predict_child(settings, small, model, work / "baseline")
    report.progress("raster: streaming prediction in a child process")
    result = predict_child(settings, raster, model, work / "prediction")
    crop, stride = (settings.crop, settings.crop), (settings.stride, settings.stride)
    windows = len(slide_windows(settings.size, settings.size, crop, stride))
    fixed = baseline["peak_bytes"]
    row = asdict(settings) | result
    row |= {
        "raster_bytes": raster.stat().st_size,
        "make_seconds": make_seconds,
        "windows": windows,
        "windows_per_second": windows / result["seconds"],
        "within_limit": result["peak_bytes"] < LIMIT_BYTES,
        "baseline_peak_bytes": fixed,
        "streaming_bytes": None if fixed is None else result["peak_bytes"] - fixed,
    }
    (out_dir / "raster.json").write_text(json.dumps(row, indent=2) + "\n")
    report.write_csv(out_dir / "raster.csv", [row])
    cells = [
        f"{settings.crop} / {settings.stride} / {settings.crop_batch_size}",
        str(windows),
        report.format_seconds(result["seconds"]),
        f"{row['windows_per_second']:.2f}",
        report.format_bytes(result["peak_bytes"]),
        "–" if fixed is None else report.format_bytes(fixed),
        "yes" if row["within_limit"] else "NO",
        str(result["status"]),
    ]
    disk = report.format_bytes(row["raster_bytes"])
    report.print_table(
        f"streaming predict of a {settings.size}² GeoTIFF ({disk} on disk)",
        [
            "window / stride / batch",
            "windows",
            "wall",
            "windows/s",
            "peak RSS",
            "of it fixed",
            "< 1.5 GiB",
            "exit",
        ],
        [cells],
        caption=f"tiny ViT (dim 16, patch 8, linear attention), {settings.classes} classes, "
        f"{settings.threads or 'default'} torch threads; generating the raster took {make_seconds:.0f} s",
    )
    for run_result, path in ((baseline, small), (result, raster)):
        if run_result["status"] != 0:
            raise RuntimeError(f"segattn.predict exited with status {run_result['status']} on {path}")
    return row


__all__ = ["LIMIT_BYTES", "RasterSettings", "make_raster", "run"]
