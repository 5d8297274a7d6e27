"""Segment images with a trained or exported model: index masks and colour overlays at the original size.

    python -m segattn.predict checkpoint=<ckpt | exported dir | model.onnx> input=<file|dir|glob> out=<dir>

Writes ``out/masks/<stem>.png`` (class index per pixel) and ``out/overlays/<stem>.png``. Two inputs whose
outputs would share a name (``a.png`` and ``a.jpg``) are refused, naming both, before anything is written.
An ONNX model runs without torch (onnxruntime, numpy, Pillow; Hydra for this command line): torch is
imported only for checkpoints and safetensors directories. Every image goes through
``TrainedModel.predict``, which shrinks it as the model was trained (``data.downsample``). Unreadable images
are named, skipped, and make the command exit with status 1 at the end.

How an image is predicted is the ``inference`` config group, shared with train.py's validation and eval.py
(``inference.mode=slide inference.crop=[512,512]``). In slide mode a TIFF input (GeoTIFF, BigTIFF) is streamed
(``stream=true``, the default): read by window, inferred strip by strip and written as a tiled GeoTIFF mask
with an overview PNG (``segattn.inference.raster_predict``), so its size is not limited by memory.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig

from .cli import run_command
from .config import plain
from .cpu_memory import reuse_freed_memory
from .images import is_raster
from .inference.image_io import drawn_classes, find_images, overlay, read_input, save_mask, save_rgb
from .inference.trained import TrainedModel, is_onnx, open_model

if TYPE_CHECKING:
    from .tiling import SlideSettings

MAX_WRITERS = 8  # threads writing masks and overlays at most (``writer_threads``)


def streams(path: Path, args: DictConfig) -> bool:
    """Whether ``path`` is read by window: a TIFF in slide mode with ``stream=true``."""
    return bool(args.stream) and args.inference.mode == "slide" and is_raster(path)


def raster_settings(inference: dict[str, Any], model_path: Path) -> SlideSettings:
    """The streamed rasters' slide settings, checked before the model is opened; ValueError naming the key
    when they cannot be streamed."""
    from .tiling import slide_settings

    if is_onnx(model_path):
        raise ValueError(
            f"checkpoint={model_path}: streaming a TIFF by window needs a checkpoint or safetensors "
            "model; use one, or stream=false to read the image whole"
        )
    return slide_settings(inference)


def planned_outputs(
    images: list[Path], rasters: list[Path], out: Path, overlays: bool = True
) -> list[tuple[Path, Path]]:
    """(input, output) for every file this run writes into ``out``, in the order it writes them: an image's
    ``masks/<stem>.png`` and, with ``overlays``, ``overlays/<stem>.png``, a streamed raster's
    ``masks/<stem>.tif``. The one list that the name check and the note on replaced files both read."""
    folders = ("masks", "overlays") if overlays else ("masks",)
    planned = [(path, out / folder / f"{path.stem}.png") for path in images for folder in folders]
    return planned + [(path, out / "masks" / f"{path.stem}.tif") for path in rasters]


def check_output_names(planned: list[tuple[Path, Path]]) -> None:
    """Refuse, with a ValueError naming both, two inputs whose outputs would share a name (``a.png`` and
    ``a.jpg``, or one file name in two folders of a glob)."""
    seen: dict[Path, Path] = {}
    for source, target in planned:
        if target in seen:
            raise ValueError(
                f"input: {seen[target]} and {source} would both be written as {target}; "
                "rename one, or predict them into different out= folders"
            )
        seen[target] = source


def say_replaced(planned: list[tuple[Path, Path]], out: Path) -> None:
    """Print, before anything is written, the files of an earlier run in ``out`` that this run overwrites."""
    existing = [target for _, target in planned if target.exists()]
    if existing:
        names = ", ".join(str(path.relative_to(out)) for path in existing[:5])
        more = f" and {len(existing) - 5} more" if len(existing) > 5 else ""
        print(f"segattn.predict: replacing {len(existing)} file(s) of an earlier run in {out}: {names}{more}")


def progress(items: list[Path], description: str) -> Iterator[Path]:
    """A rich progress bar when rich is installed (it is a segattn dependency); plain iteration otherwise."""
    try:
        from rich.progress import track
    except ImportError:
        return iter(items)
    return iter(track(items, description=description, transient=False))


class DecodedImages:
    """The files as a map-style dataset: each one's RGB image (``read_input``), or the line saying why it
    could not be read."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> np.ndarray | str:
        try:  # writable, so that the loader hands it over as a tensor in shared memory
            return np.require(read_input(self.files[index]), requirements="W")
        except ValueError as error:
            return str(error)


def decoded(files: list[Path], num_workers: int) -> Iterator[np.ndarray | str]:
    """``DecodedImages`` of ``files`` in order, decoded by ``num_workers`` DataLoader processes (0: in this
    one) so that decoding overlaps the network; in this process, one by one, where torch is not installed
    (an ONNX model)."""
    images = DecodedImages(files)
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        return (images[index] for index in range(len(images)))
    loader = DataLoader(images, batch_size=None, num_workers=num_workers)  # arrays come back as tensors
    return (item if isinstance(item, str) else item.numpy() for item in loader)


def write_outputs(
    model: TrainedModel,
    path: Path,
    rgb: np.ndarray,
    mask: np.ndarray,
    out: Path,
    alpha: float,
    drawn: list[int] | None,
) -> None:
    """The mask and overlay (the ``drawn`` classes coloured; None: no overlay) of ``path``'s RGB image."""
    save_mask(mask, out / "masks" / f"{path.stem}.png")
    if drawn is not None:
        save_rgb(
            overlay(rgb, mask, model.record.palette, alpha, drawn), out / "overlays" / f"{path.stem}.png"
        )


def writer_threads() -> int:
    """Threads encoding masks and overlays (Pillow's encoders release the GIL, and a large overlay's PNG
    costs more than its prediction; docs/performance.md): half the cores, from 1 to ``MAX_WRITERS``."""
    return max(1, min(MAX_WRITERS, (os.cpu_count() or 2) // 2))


def predict_files(
    model: TrainedModel,
    inference: dict[str, Any],
    files: list[Path],
    out: Path,
    alpha: float,
    drawn: list[int] | None,
    num_workers: int,
) -> tuple[int, list[tuple[Path, str]]]:
    """Write the mask and overlay (the ``drawn`` classes coloured; None: the mask alone) of every readable
    file; returns (written count, [(file, reason) for skipped files]). ``model.predict`` takes
    ``inference.batch_size`` consecutive images at a time (batched by size) while ``writer_threads`` write
    the images before them, at most that many images waiting (memory stays bounded)."""
    batch_size = model.settings(**inference)["batch_size"] or 1
    written, failed, batch = 0, [], []
    pending: deque[Future[None]] = deque()
    writers = writer_threads()
    with ThreadPoolExecutor(max_workers=writers) as writer:
        for number, (path, image) in enumerate(
            zip(progress(files, "segmenting"), decoded(files, num_workers), strict=True)
        ):
            if isinstance(image, str):
                print(f"segattn.predict: skipping {path}: {image}", file=sys.stderr)
                failed.append((path, image))
            else:
                batch.append((path, image))
            if batch and (len(batch) == batch_size or number == len(files) - 1):
                masks = model.predict([rgb for _, rgb in batch], **inference)
                while len(pending) > writers:
                    pending.popleft().result()
                for (done, rgb), mask in zip(batch, masks, strict=True):
                    pending.append(writer.submit(write_outputs, model, done, rgb, mask, out, alpha, drawn))
                written, batch = written + len(batch), []
        for future in pending:
            future.result()
    return written, failed


def resume_note(path: Path) -> Callable[[int, int, Path], None]:
    """``on_resume`` of a streamed raster: say where the run continues an earlier one's partial mask."""

    def note(row: int, height: int, partial: Path) -> None:
        print(
            f"segattn.predict: {path}: continuing at row {row} of {height} in {partial}, where an "
            "earlier run with the same input, model and settings stopped",
            file=sys.stderr,
        )

    return note


def predict_rasters(
    model: TrainedModel, files: list[Path], out: Path, settings: SlideSettings
) -> tuple[int, list[tuple[Path, str]]]:
    """Stream every raster into ``out/masks/<stem>.tif``; (written count, [(file, reason) for failures])."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .inference.raster_predict import predict_raster

    written, failed = 0, []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    for path in files:
        with Progress(*columns) as bar:
            task = bar.add_task(f"{path.name} (windows)", total=None)
            try:
                predict_raster(
                    model,
                    path,
                    out,
                    settings,
                    lambda done, total, task=task: bar.update(task, completed=done, total=total),
                    on_resume=resume_note(path),
                )
            except ValueError as error:
                print(f"segattn.predict: skipping {path}: {error}", file=sys.stderr)
                failed.append((path, str(error)))
                continue
        written += 1
    return written, failed


def main(argv: list[str] | None = None) -> int:
    """``python -m segattn.predict`` / ``segattn-predict``: compose conf/predict.yaml with ``argv``."""
    return run_command("segattn.predict", "predict", run, argv, groups=("inference",))


def run(args: DictConfig) -> int:
    """Predict every image of ``args.input``; 1 when the model, the input or an image could not be read."""
    model_path, out, inference = Path(args.checkpoint), Path(args.out), plain(args.inference)
    reuse_freed_memory()
    try:
        files = find_images(args.input)
        rasters = [path for path in files if streams(path, args)]
        images = [path for path in files if path not in rasters]
        planned = planned_outputs(images, rasters, out, args.overlays)
        check_output_names(planned)
        settings = raster_settings(inference, model_path) if rasters else None
        model = open_model(model_path, args.threads, args.device)
        model.settings(**inference)  # what this model cannot run is refused before the first image
        drawn = drawn_classes(model.record.classes, plain(args.overlay_classes)) if args.overlays else None
        if rasters and model.downsample > 1:
            raise ValueError(
                f"checkpoint={model_path}: trained on images shrunk {model.downsample}x (data.downsample), "
                f"which a TIFF streamed by window does not do yet; set stream=false to read {rasters[0]} "
                "whole, or shrink it first"
            )
        if args.threads and model.network is not None:
            import torch

            torch.set_num_threads(args.threads)
    except (FileNotFoundError, ValueError) as error:
        print(f"segattn.predict: {error}", file=sys.stderr)
        return 1
    say_replaced(planned, out)
    written, failed = predict_files(model, inference, images, out, args.alpha, drawn, args.num_workers)
    streamed = 0
    if rasters:
        streamed, raster_failures = predict_rasters(model, rasters, out, settings)
        failed += raster_failures
    views = [f"overlays to {out / 'overlays'}"] if written and drawn is not None else []  # what was written
    views += [f"overviews to {out / 'overviews'}"] if streamed else []
    print(
        f"segattn.predict: wrote {written + streamed} masks to {out / 'masks'}"
        + "".join(f" and {view}" for view in views)
    )
    if failed:
        names = ", ".join(str(path) for path, _ in failed)
        print(f"segattn.predict: {len(failed)} unreadable image(s) skipped: {names}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
