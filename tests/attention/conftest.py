"""Triton's interpreter for the Triton kernel tests on machines without a CUDA device.

TRITON_INTERPRET is read when triton is first imported, which any import of torch._dynamo does: it is set
here, when pytest loads this file, before the attention tests import segattn. Harmless to the other tests
on such a machine: nothing else runs Triton kernels on the CPU. With a CUDA device the kernels run compiled.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
