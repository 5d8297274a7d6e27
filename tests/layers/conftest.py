"""Triton's interpreter for the Mix-FFN operator's tests on machines without a CUDA device: set when pytest
loads this file, before triton is first imported (as tests/attention/conftest.py does for the attention
kernels)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
