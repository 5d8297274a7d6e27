"""EfficientViT's ReLU linear attention (Cai et al., ICCV 2023, arXiv 2205.14756): the core of LiteMLA.

out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / (φ(q_i)ᵀ Σ_j φ(k_j) + eps) per head, φ = relu. Numerator and normaliser
come from one product: v is padded with a channel of ones, so φ(k)ᵀ[v, 1] ([d, d + 1] per head) holds
Σ_j φ(k_j) v_jᵀ and Σ_j φ(k_j) side by side, and φ(q) times it gives both at once. No N×N tensor. As in
the paper's code, the products and the division run in fp32 even under bf16/fp16 autocast (float64 stays
float64); the result comes back in the dtype of ``v``. Plain matmul, pad and elementwise ops only, so
ONNX export, TorchScript tracing and torch.compile see ordinary ops. The Triton kernels take it where
``layers.choose_path`` says so (``functional.run_kernel_core``: CUDA tensors by default).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .functional import FeatureMap, KernelCore, full_precision, run_kernel_core

__all__ = ["LITE_KERNELS", "lite_linear_attention"]

LITE_KERNELS = ("relu", "elu")  # relu: the paper's; elu: elu(x) + 1 (Katharopoulos et al. 2020)


def lite_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, kernel: str = "relu", eps: float = 1e-5, backend: str | None = None
) -> Tensor:
    """LiteMLA's linear attention on [B, heads, N, d] q, k (before φ) and v; returns [B, heads, N, d]."""
    if kernel not in LITE_KERNELS:
        raise ValueError(f"lite_linear_attention: kernel={kernel!r}; expected one of {LITE_KERNELS}")
    core = KernelCore(FeatureMap(kernel), FeatureMap(kernel), eps=eps, function=False)
    return run_kernel_core(
        core, q, k, v, backend, lambda q, k, v: _lite_linear_attention(q, k, v, kernel, eps)
    )


@full_precision
def _lite_linear_attention(q: Tensor, k: Tensor, v: Tensor, kernel: str, eps: float) -> Tensor:
    if kernel == "relu":
        q, k = F.relu(q), F.relu(k)
    else:
        q, k = F.elu(q) + 1.0, F.elu(k) + 1.0
    v = F.pad(v, (0, 1), mode="constant", value=1.0)  # [B, h, N, d + 1]
    out = q @ (k.transpose(-2, -1) @ v)  # [B, h, N, d + 1]: numerator | normaliser
    return out[..., :-1] / (out[..., -1:] + eps)
