"""Where and in what precision a trained model runs: ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) and
``inference.precision`` (``auto``, ``fp32``, ``bf16``, ``fp16``) resolved against this machine, with one line
naming the setting for what it cannot run.

torch is imported only to place a torch model; an ONNX model is placed by onnxruntime's providers, so the
ONNX path stays free of torch.
"""

from __future__ import annotations

from typing import Any

from ..tiling import PRECISIONS

DEVICE_FORMS = "auto, cpu, cuda or cuda:N"
GPU_EXTRA = "pip install 'segattn[gpu]' (onnxruntime-gpu)"
CUDA_PROVIDER = "CUDAExecutionProvider"


def is_device(value: Any) -> bool:
    """``value`` is one of ``DEVICE_FORMS``."""
    if not isinstance(value, str):
        return False
    kind, _, index = value.partition(":")
    return value in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit())


def check_device(device: str) -> str:
    """``device`` itself when it is one of ``DEVICE_FORMS``; a ValueError naming it otherwise."""
    if not is_device(device):
        raise ValueError(f"device={device!r}: expected {DEVICE_FORMS}")
    return device


def cuda_index(device: str, count: int) -> int:
    """The index of the CUDA device ``device`` (cuda, cuda:N) names among ``count``; a ValueError naming
    the setting when there is no such device."""
    index = int(device.partition(":")[2] or 0)
    if count == 0:
        raise ValueError(f"device={device}: this machine has no CUDA device; use device=cpu (or device=auto)")
    if index >= count:
        raise ValueError(
            f"device={device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}; "
            "pick one of them (or device=auto)"
        )
    return index


def torch_device(device: str) -> str:
    """The torch device ``device`` names here: ``auto`` is the first CUDA device if there is one, else the
    CPU; a CUDA device this machine lacks is a ValueError naming the setting and how many there are."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if check_device(device) == "cpu" or (device == "auto" and count == 0):
        return "cpu"
    return f"cuda:{cuda_index('cuda' if device == 'auto' else device, count)}"


def onnx_providers(device: str, available: list[str]) -> list[Any]:
    """onnxruntime's providers for ``device`` among the ``available`` ones: the CUDA provider (with the CPU
    behind it) for a CUDA device, or ``auto`` where onnxruntime-gpu is installed; the CPU's otherwise. A CUDA
    device without onnxruntime-gpu is a ValueError naming the setting and the extra to install."""
    if check_device(device) == "cpu" or (device == "auto" and CUDA_PROVIDER not in available):
        return ["CPUExecutionProvider"]
    if CUDA_PROVIDER not in available:
        raise ValueError(
            f"device={device}: an ONNX model runs on a GPU through onnxruntime-gpu, which is not installed; "
            f"{GPU_EXTRA}, or use device=cpu"
        )
    index = int(device.partition(":")[2] or 0)
    return [(CUDA_PROVIDER, {"device_id": index}), "CPUExecutionProvider"]


def resolved_precision(precision: str, device: str, onnx: bool, bf16_supported: bool) -> str:
    """``fp32``, ``bf16`` or ``fp16`` for ``inference.precision`` on the resolved ``device``: ``auto`` is bf16
    on a CUDA device that supports it, fp32 otherwise. A precision the model or device cannot run is a
    ValueError naming the setting (an ONNX model runs as exported, in fp32; fp16 needs a CUDA device)."""
    on_cuda = device.startswith("cuda")
    if precision == "auto":
        return "bf16" if on_cuda and bf16_supported and not onnx else "fp32"
    if onnx and precision != "fp32":
        raise ValueError(
            f"inference.precision={precision}: an ONNX model runs in the precision it was exported in "
            "(fp32); set inference.precision=auto or fp32, or use the checkpoint or its safetensors export"
        )
    if precision == "fp16" and not on_cuda:
        raise ValueError(
            f"inference.precision=fp16 on device={device}: half precision runs on a CUDA device; "
            "on the CPU use inference.precision=fp32 or bf16"
        )
    if precision == "bf16" and on_cuda and not bf16_supported:
        raise ValueError(
            f"inference.precision=bf16: {device} does not support bfloat16; "
            "use inference.precision=fp16 or fp32"
        )
    return precision


__all__ = [
    "DEVICE_FORMS",
    "PRECISIONS",
    "check_device",
    "cuda_index",
    "is_device",
    "onnx_providers",
    "resolved_precision",
    "torch_device",
]
