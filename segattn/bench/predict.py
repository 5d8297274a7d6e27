"""Throughput of a trained model, torch and ONNX side by side: images/s, megapixels/s and peak memory per
image size, batch (``inference.batch_size``), loader workers and precision, in two scopes:

- ``files``: generated JPEG files on disk to PNG masks (and overlays, ``overlays``) on disk, through
  ``python -m segattn.predict``'s own ``predict_files`` (its DataLoader decoding, batches and writer threads);
- ``network``: the network alone on an in-memory batch already on the device (logits stay there).

Each row is one warm-up pass and ``repeats`` timed passes; their median is reported. Peak memory is torch's
``max_memory_allocated`` on a CUDA device, and on the CPU this process's resident high-water mark, reset
before each row (decoding workers hold their own memory, not counted). Without a checkpoint a pvt-b0 with
random weights is exported to a temporary folder as safetensors and ONNX, so the part needs no files; the
ONNX rows of a checkpoint come from its export by ``segattn.export`` (checked against torch).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoints.loading import save_exported
from ..export.command import export
from ..images import default_palette
from ..inference.image_io import drawn_classes, save_rgb
from ..inference.trained import TrainedModel, open_model
from ..models import build_model
from ..predict import predict_files
from ..record import ModelRecord
from . import report
from .peak import peak_bytes, reset_peak_bytes
from .specs import format_image_size, parse_image_size, size_label

ALPHA = 0.5  # overlay opacity: predict's default (conf/predict.yaml)
EXPORT_SIZE = (64, 64)  # the ONNX export's check size (its graph takes any size)


@dataclass(frozen=True)
class PredictSettings:
    """What is measured: the model (None: a random pvt-b0), its formats and every grid axis."""

    model: TrainedModel | None
    formats: list[str]  # torch, onnx
    image_sizes: list[tuple[int, int]]  # (height, width)
    batch: list[int]
    num_workers: list[int]
    precisions: list[str]  # fp32, bf16, fp16
    images: int  # files per timed pass
    overlays: bool  # scope files: overlay PNGs written beside the masks
    repeats: int
    threads: int  # onnxruntime threads (0: its default)


def random_model(directory: Path) -> Path:
    """A random pvt-b0 (linear attention, 2 classes) exported as safetensors into ``directory``."""
    torch.manual_seed(0)
    network = build_model("pvt", num_classes=2, attention="linear", size="b0").eval()
    record = ModelRecord(network.config, ["background", "plant"], default_palette(2), dataset="generated")
    save_exported(network, record, directory)
    return directory


def opened_formats(settings: PredictSettings, device: str, work: Path) -> dict[str, TrainedModel]:
    """The model of each format of ``settings``: the given one, or the random pvt-b0; its ONNX form exported
    into ``work`` where the given model is not ONNX already."""
    source = settings.model or open_model(random_model(work / "safetensors"), settings.threads, device)
    opened = {"torch": source} if "torch" in settings.formats else {}
    if "onnx" in settings.formats:
        if source.session is None:
            on_cpu = open_model(source.path, device="cpu").network  # export and its check run on the CPU
            export(on_cpu, source.record, "onnx", work / "onnx", EXPORT_SIZE)
            source = open_model(work / "onnx" / "model.onnx", settings.threads, device)
        opened["onnx"] = source
    return opened


def write_images(folder: Path, count: int, height: int, width: int) -> list[Path]:
    """``count`` JPEG files of smooth gradients and noise (they compress and decode as photos do)."""
    rng = np.random.default_rng(0)
    rows, columns = np.mgrid[0:height, 0:width]
    smooth = np.stack([rows * 255 // height, columns * 255 // width, (rows + columns) % 256], axis=-1)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for index in range(count):
        noisy = smooth + rng.integers(-24, 24, smooth.shape)
        files.append(folder / f"image{index:03d}.jpg")
        save_rgb(np.clip(noisy, 0, 255).astype(np.uint8), files[-1])
    return files


def median_seconds(call: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """The median wall time of ``repeats`` calls after one warm-up call, each waited for by ``sync``."""
    call()
    sync()
    seconds = []
    for _ in range(repeats):
        begin = time.perf_counter()
        call()
        sync()
        seconds.append(time.perf_counter() - begin)
    return statistics.median(seconds)


def files_pass(
    model: TrainedModel,
    files: list[Path],
    out: Path,
    inference: dict[str, Any],
    workers: int,
    overlays: bool,
) -> Callable[[], None]:
    """One pass of predict's ``predict_files`` over ``files`` into ``out`` (masks, and ``overlays``); an
    unreadable file fails it."""
    drawn = drawn_classes(model.record.classes, None) if overlays else None

    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()):  # predict's progress bar, once a pass
            _, failed = predict_files(model, inference, files, out, ALPHA, drawn, workers)
        if failed:
            raise RuntimeError(f"{failed[0][0]}: {failed[0][1]}")

    return run


def network_pass(
    model: TrainedModel, batch: int, size: tuple[int, int], inference: dict[str, Any]
) -> Callable:
    """One forward pass of a normalised random batch of ``batch`` images held on the model's device."""
    images = np.random.default_rng(0).standard_normal((batch, 3, *size), dtype=np.float32)
    if model.session is not None:
        return lambda: model.run(images, **inference)
    on_device = torch.from_numpy(images).to(model.device)
    settings = model.settings(**inference)
    return lambda: model.run_torch(on_device, settings)


def measure(
    call: Callable[[], object], count: int, pixels: int, settings: PredictSettings, device: torch.device
) -> dict[str, Any]:
    """The row's measured columns: ``count`` images of ``pixels`` each per call."""
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_bytes()
    seconds = median_seconds(call, settings.repeats, sync)
    return {
        "images_per_s": count / seconds,
        "megapixels_per_s": count * pixels / seconds / 1e6,
        "seconds": seconds,
        "repeats": settings.repeats,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else peak_bytes(),
        "status": "ok",
        "note": "",
    }


def measured_row(
    model: TrainedModel,
    row: dict[str, Any],
    files: list[Path],
    settings: PredictSettings,
    device: torch.device,
) -> dict[str, Any]:
    """``row`` (format, size, batch, workers, precision, scope) with its measurement, or the reason it was
    skipped (a precision the model cannot run) or failed (out of memory among them)."""
    height, width = parse_image_size(row["size"])
    inference = {"batch_size": row["batch"], "precision": row["precision"]}
    try:
        model.settings(**inference)  # an ONNX model runs in fp32 alone
        if row["scope"] == "files":
            out = files[0].parent.with_name("predicted")
            call = files_pass(model, files, out, inference, row["num_workers"], settings.overlays)
            return row | measure(call, len(files), height * width, settings, device)
        call = network_pass(model, row["batch"], (height, width), inference)
        return row | measure(call, row["batch"], height * width, settings, device)
    except ValueError as error:
        return row | {"status": "skipped", "note": str(error)}
    except RuntimeError as error:
        return row | {"status": "failed", "note": str(error).splitlines()[0]}


def run(settings: PredictSettings, device: torch.device, out_dir: Path) -> list[dict[str, Any]]:
    """Every row of ``settings``, written to ``predict.csv`` as it comes, then printed as a table."""
    rows: list[dict[str, Any]] = []
    scopes = [("network", None)] + [("files", workers) for workers in settings.num_workers]  # quick first
    with tempfile.TemporaryDirectory(prefix="segattn-bench-predict-") as temp:
        work = Path(temp)
        if settings.model is None:
            report.progress(
                "predict: no checkpoint given: a pvt-b0 (linear attention, 2 classes) with random weights, "
                f"exported as safetensors{' and ONNX' if 'onnx' in settings.formats else ''} to {work}"
            )
        models = opened_formats(settings, str(device), work)
        for height, width in settings.image_sizes:
            files = write_images(work / f"images_{width}x{height}" / "jpeg", settings.images, height, width)
            grid = itertools.product(models.items(), settings.precisions, scopes, settings.batch)
            for (fmt, model), precision, (scope, workers), batch in grid:
                row = {"format": fmt, "size": size_label(height, width), "batch": batch}
                row |= {"num_workers": workers, "precision": precision, "scope": scope}
                row |= {"overlays": settings.overlays if scope == "files" else None}
                report.progress(f"predict: {', '.join(f'{key}={value}' for key, value in row.items())}")
                rows.append(measured_row(model, row, files, settings, device))
                report.write_csv(out_dir / "predict.csv", rows)
    print_rows(rows, settings, device)
    return rows


def cells(row: dict[str, Any]) -> list[str]:
    """A table row: its grid point, then its measurement or why there is none."""
    workers = "–" if row["num_workers"] is None else str(row["num_workers"])
    point = [row["format"], row["size"], row["precision"], row["scope"], str(row["batch"]), workers]
    if row["status"] != "ok":
        return [*point, row["status"], row["note"][:60], "", ""]
    speed = [f"{row['images_per_s']:.2f}", f"{row['megapixels_per_s']:.1f}"]
    return [*point, *speed, report.format_seconds(row["seconds"]), report.format_bytes(row["peak_bytes"])]


def print_rows(rows: list[dict[str, Any]], settings: PredictSettings, device: torch.device) -> None:
    sizes = ", ".join(format_image_size(*size) for size in settings.image_sizes)
    model = "pvt-b0 with random weights" if settings.model is None else str(settings.model.path)
    peak = "torch CUDA allocations" if device.type == "cuda" else "process resident set"
    report.print_table(
        f"predict throughput on {report.device_name(device)}: {model}",
        ["format", "size", "precision", "scope", "batch", "workers", "images/s", "MP/s", "median", "peak"],
        [cells(row) for row in rows],
        caption=f"{sizes}; files: {settings.images} JPEG files to PNG masks"
        f"{' and overlays' if settings.overlays else ''} a pass; network: "
        f"one batch on the device; median of {settings.repeats} after a warm-up; peak: {peak}",
    )


__all__ = ["PredictSettings", "run"]
