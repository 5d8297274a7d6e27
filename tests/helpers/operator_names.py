"""A dispatch mode that records the operators a block of code calls (``OperatorNames``), for the tests that
check which path a module took."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OperatorNames(TorchDispatchMode):
    """Records the name of every operator dispatched inside (``segattn.mix_ffn.default``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
