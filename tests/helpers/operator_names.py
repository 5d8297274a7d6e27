"""Which operators a module ran, for the tests that check the path it took: a dispatch mode recording them
in eager mode (``OperatorNames``), and those of its compiled graph (``compiled_segattn_targets``)."""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode


class OperatorNames(TorchDispatchMode):
    """Records the name of every operator dispatched inside (``segattn.mix_ffn.default``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def compiled_segattn_targets(module: torch.nn.Module, *args: Any) -> list[str]:
    """``module(*args)`` (whose first argument requires grad) compiled with AOT autograd: asserts one graph
    whose outputs and gradients (of the first argument and every parameter) equal eager mode's, and
    returns the ``segattn`` operators in it, an autograd Function's forward and backward included."""
    inputs = [args[0], *module.parameters()]
    out = module(*args)
    grads = torch.autograd.grad(out.sum(), inputs)
    counter = CompileCounterWithBackend("aot_eager")
    compiled_out = torch.compile(module, backend=counter)(*args)
    compiled_grads = torch.autograd.grad(compiled_out.sum(), inputs)
    assert counter.frame_count == 1
    for actual, expected in zip([compiled_out, *compiled_grads], [out, *grads], strict=True):
        torch.testing.assert_close(actual, expected)
    graphs = [counter.graphs[0], *counter.graphs[0].children()]  # a Function's subgraphs are children
    targets = [str(node.target) for g in graphs for node in g.graph.nodes if node.op == "call_function"]
    return [target for target in targets if target.startswith("segattn.")]
