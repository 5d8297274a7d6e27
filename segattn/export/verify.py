"""Proof that an export reproduces PyTorch: the sizes it is checked and traced at, the max abs difference
on random inputs of each, and a CPU latency comparison. Each export is checked as eval and predict run it:
opened by ``open_model``, run through ``TrainedModel.run``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import SegattnError
from ..inference.trained import INFERENCE_DEFAULTS, TrainedModel


class ExportError(SegattnError, RuntimeError):
    """An export that failed or did not reproduce PyTorch; the message names the variant and the cause."""


def check_sizes(height: int, width: int) -> list[tuple[int, int, int, int]]:
    """The export size at batch 1, then batch 2 at a second size: non-square, no multiple of a patch stride
    (so the model's padding runs), and not the size tracing exporters trace at."""
    second = (height * 3 // 4 + 3, width * 5 // 4 + 5)
    return [(1, 3, height, width), (2, 3, second[0], second[1] + (second[0] == second[1]))]


def trace_size(height: int, width: int) -> tuple[int, int]:
    """Where tracing exporters trace: not the export size, not a multiple of any patch stride.

    Tracing records only the branch taken; at the export (= training) size a ViT skips resampling its
    position embedding and needs no padding, and that trace would fail at any other size.
    """
    return height * 3 // 4 + 1, width * 5 // 4 - 1


def run_opened(model: TrainedModel) -> Callable[[Tensor], np.ndarray]:
    """``images -> logits`` of an export opened by ``open_model``, as eval and predict run it
    (``TrainedModel.run``), in one whole-image pass: the settings its record holds for validation (slide,
    flip) are left out, since the check compares the network with PyTorch's, not the inference around it."""
    return lambda images: model.run(images.numpy(), **INFERENCE_DEFAULTS)


def compare(
    reference: nn.Module, run: Any, shapes: list[tuple[int, ...]], atol: float, label: str
) -> list[dict[str, Any]]:
    """Max abs difference between PyTorch and an export on random inputs of each shape; raises above atol."""
    generator = torch.Generator().manual_seed(0)
    results = []
    for shape in shapes:
        images = torch.randn(shape, generator=generator)
        with torch.inference_mode():
            expected = reference(images)
        try:
            actual = torch.as_tensor(run(images))
        except Exception as error:
            raise ExportError(f"{label}: the export fails on input {list(shape)}: {error}") from None
        if actual.shape != expected.shape:
            raise ExportError(
                f"{label}: output {list(actual.shape)} for input {list(shape)}; "
                f"expected {list(expected.shape)}"
            )
        diff = (actual - expected).abs().max().item()
        print(f"{label}: max abs diff {diff:.2e} at input {'x'.join(map(str, shape))} (tolerance {atol:.0e})")
        if not diff <= atol:
            raise ExportError(
                f"{label}: max abs diff {diff:.3e} at input {list(shape)} exceeds tolerance {atol:.0e}"
            )
        results.append({"shape": list(shape), "max_abs_diff": diff})
    return results


def latency(runs: dict[str, Any], images: Tensor, repeats: int = 5) -> dict[str, float]:
    """Median wall time in ms of each ``run(images)``, after a warm-up; runs alternate so that load from
    other processes falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(repeats + 1):
        for name, run in runs.items():
            start = time.perf_counter()
            run(images)
            if step:
                times[name].append(1000 * (time.perf_counter() - start))
    return {name: sorted(values)[len(values) // 2] for name, values in times.items()}
