"""A band-split image with the Triton kernels gives one process's logits, loss and gradients: the kernels'
context reduction and application are separate steps, with the sum over the bands (and, in backward, of the
context gradient) in between.

Two gloo processes on the CPU (``tests/helpers/band_workers``: one computes the single-process reference for
both, then each its band), spawned with SEGATTN_KERNEL=triton and Triton's interpreter, pvt with each
band-parallel variant that has a Triton path for bands (efficient's key softmax over all tokens takes the
plain formula on bands, as on the PyTorch path). fp32: the interpreter's dot products have no float64;
errors are relative to the largest value of the compared quantity (all gradients together).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from band_workers import run_world

from segattn.layers import KERNEL_ENV

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]
VARIANTS = ["linear", "taylor", "flatten"]
TOLERANCE = 1e-4  # fp32; measured at most 4.2e-6 (gradients: the sums over bands add in another order)
LOSS_TOLERANCE = 1e-6


def test_two_bands_with_the_triton_kernels_equal_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KERNEL_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the spawned processes compute on the CPU
    # Mix-FFN's own kernel runs on whole images only (tests/layers), and slowly in the interpreter
    case = {"model": "pvt", "size": [200, 72], "dtype": "float32", "mix_ffn_backend": "torch"}
    cases = [{**case, "attention": attention} for attention in VARIANTS]
    results = run_world(tmp_path, world=2, phases=[(2, cases)], start_method="spawn")  # with this environment
    checked = [r for rank_results in results for r in rank_results]
    assert len(checked) == 2 * len(VARIANTS) and all("errors" in r for r in checked), checked
    for result in checked:
        for key, error in result["errors"].items():
            assert error < (LOSS_TOLERANCE if key == "loss" else TOLERANCE), result
