"""Sliding-window inference strip by strip: ``infer(mode="slide")`` for images read by window.

The windows, their batches (``slide_batches``), the overlap averaging and flip TTA are those of
``infer``; only the bookkeeping differs. Logit sums are kept for the rows between the first row not yet
returned and the bottom of the window being added, so memory grows with the window, the batch and the
image width, never with the image height. Rows above the next window's top are final and leave as a
strip. Every pixel receives the same additions in the same order as in ``infer_slide``, so the logits are
equal bit for bit, not just close.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from ..tiling import SlideSettings, Window, slide_windows
from .infer import Job, slide_batches

ReadCrop = Callable[[Window], Tensor]  # (top, bottom, left, right) -> normalised float32 [3, h, w]
Model = Callable[[Tensor], Tensor]  # [n, 3, h, w] -> logits [n, K, h, w]


def first_job(windows: list[Window], start_row: int, crop_batch_size: int) -> int:
    """Index of the batch that holds the first window reaching below ``start_row``: a resumed stream
    starts there, so its batches are the uninterrupted run's (rows above ``start_row`` are discarded)."""
    index = next((i for i, (_, bottom, _, _) in enumerate(windows) if bottom > start_row), len(windows))
    return index - index % crop_batch_size


def strip_count(windows: list[Window], top: int, bottom: int, width: int) -> Tensor:
    """How many windows cover each pixel of rows [top, bottom): ``infer_slide``'s count map for a strip."""
    count = torch.zeros((1, bottom - top, width))
    for w_top, w_bottom, left, right in windows:
        if w_top < bottom and w_bottom > top:
            count[:, max(w_top, top) - top : min(w_bottom, bottom) - top, left:right] += 1
    return count


def view_strips(
    model: Model,
    read: ReadCrop,
    size: tuple[int, int],
    num_classes: int,
    settings: SlideSettings,
    strip_rows: int,
    start_row: int,
    flip: bool,
    on_batch: Callable[[int], None] | None,
) -> Iterator[Tensor]:
    """Averaged logits [K, rows, W] of rows [start_row, H) in strips of ``strip_rows`` (the last shorter)
    for one view: the image, or its mirror (``flip``: windows tile the mirrored image, as in ``infer``,
    and each strip is un-mirrored before it leaves). ``on_batch(n)`` is told of every n windows run.

    Sums live in blocks of ``strip_rows`` rows from the first row not yet returned down to the bottom of
    the window being added; a block leaves as soon as a window starts below it. At most
    ``strip_rows + settings.crop[0]`` rows are held, whatever the batch straddles.
    """
    height, width = size
    windows = slide_windows(height, width, settings.crop, settings.stride)
    batch = settings.crop_batch_size
    jobs: list[Job] = [(0, window) for window in windows]
    base, blocks = start_row, []  # blocks[j] holds rows base + j * strip_rows onwards

    def crops_of(chunk: list[Job]) -> Tensor:
        if not flip:
            return torch.stack([read(window) for _, window in chunk])
        mirrored = [(top, bottom, width - right, width - left) for _, (top, bottom, left, right) in chunk]
        return torch.stack([read(window).flip(-1) for window in mirrored])

    def new_block() -> Tensor:
        top = base + len(blocks) * strip_rows
        return torch.zeros((num_classes, min(strip_rows, height - top), width))

    def strips_above(final: int) -> Iterator[Tensor]:
        """Whole strips above row ``final`` (the next window's top); at ``final == H``, all that is left."""
        nonlocal base
        while base < final and (final - base >= strip_rows or final == height):
            block = blocks.pop(0) if blocks else new_block()
            rows = block.shape[1]
            block /= strip_count(windows, base, base + rows, width)  # in place: no second strip in memory
            base += rows
            yield block.flip(-1) if flip else block

    def add(window: Window, logits: Tensor) -> None:
        top, bottom, left, right = window
        while base + len(blocks) * strip_rows < bottom:
            blocks.append(new_block())
        for index, block in enumerate(blocks):
            block_top = base + index * strip_rows
            low, high = max(top, block_top), min(bottom, block_top + block.shape[1])
            if low < high:  # rows above start_row (a resumed stream's first batch) have no block
                block[:, low - block_top : high - block_top, left:right] += logits[:, low - top : high - top]

    start = first_job(windows, start_row, batch)
    for chunk, out in slide_batches(model, crops_of, jobs, num_classes, batch, start):
        for crop_logits, (_, window) in zip(out, chunk, strict=True):
            yield from strips_above(window[0])  # windows come row-major: rows above this top are final
            add(window, crop_logits)
        if on_batch is not None:
            on_batch(len(chunk))
    yield from strips_above(height)


def slide_strips(
    model: Model,
    read: ReadCrop,
    size: tuple[int, int],
    num_classes: int,
    settings: SlideSettings,
    strip_rows: int = 256,
    start_row: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[Tensor]:
    """Logits [K, rows, W] of consecutive strips of rows [start_row, H), equal to the same rows of
    ``infer(model, image, K, "slide", crop, stride, crop_batch_size, flip=flip)`` with ``settings``'s
    values; ``start_row`` a multiple of ``strip_rows`` resumes a stream. With flip both views advance
    together, a strip at a time."""
    if strip_rows < 1 or start_row % strip_rows:
        raise ValueError(f"slide_strips: start_row={start_row}, strip_rows={strip_rows}; expected a multiple")
    args = (model, read, size, num_classes, settings, strip_rows, start_row)
    views = [view_strips(*args, False, on_batch)]
    if settings.flip:
        views.append(view_strips(*args, True, on_batch))
    for strips in zip(*views, strict=True):
        if len(strips) == 1:
            yield strips[0]
            continue
        total = torch.zeros_like(strips[0])
        for strip in strips:  # summed and divided as infer sums its TTA views
            total += strip
        yield total / len(strips)


__all__ = ["first_job", "slide_strips", "strip_count"]
