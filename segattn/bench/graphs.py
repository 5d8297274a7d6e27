"""``bench op cuda_graphs=true``: each variant also as ``<variant>+graphs``, one call captured into a CUDA
graph and replayed. A replay launches the same kernels on the same (static) inputs without the Python,
dispatcher and Triton launch work of an eager call, so the pair of rows shows how much of a layer's time is
host work. CUDA only; a captured call cannot change shape, so the rows are for fixed-size training steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

GRAPHS = "+graphs"  # label suffix of the replayed rows
CAPTURE_WARMUP = 3  # eager calls on a side stream before capture: JIT, autotuning, allocator blocks


class GraphedCase:
    """``case`` (a ``bench op`` call on fixed inputs) captured into a CUDA graph at its first call, then
    replayed. The first call (capture included) is a warm-up call of the timing, never a sample."""

    def __init__(self, case: Callable[[], None]) -> None:
        self.case = case
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self) -> None:
        if self.graph is None:
            self.graph = capture(self.case)
        self.graph.replay()


def capture(call: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``call`` recorded into a CUDA graph after ``CAPTURE_WARMUP`` eager calls on a side stream, as
    capture requires (nothing compiles, tunes or synchronises while it records)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(CAPTURE_WARMUP):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def graphed(label: str, case: Callable[[], None]) -> Callable[[], None]:
    """The call a row label times: ``case`` itself, or its CUDA graph for a ``+graphs`` label."""
    return GraphedCase(case) if label.endswith(GRAPHS) else case


__all__ = ["GRAPHS", "GraphedCase", "capture", "graphed"]
