"""Fixtures every test folder can use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def exact_fp32() -> Iterator[None]:
    """TF32 off for matmuls and convolutions, so fp32 on a GPU means fp32 (cuDNN convolutions default to
    TF32); restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
