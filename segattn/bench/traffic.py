"""Bytes a training step moves, by component and phase, counted op by op on fake tensors: nothing is
allocated or computed, so a 4096² step of any model is counted on a CPU in seconds.

Each ATen op is charged the bytes of its tensor inputs and outputs (it reads each input and writes each output
once; an out argument of its schema, ``out=`` or ``grad_input=``, is written, not read, an input taken for its
shape alone (``SHAPE_ONLY``) not read either, one read at an index's elements (``INDEXED``: gather, NLL)
charged those elements alone; views and ``empty`` allocations move nothing). A forward op is
charged to the innermost module running it, a module's output to that module; a backward op to the module
whose forward created the autograd node it belongs to (a node made inside an autograd Function or by a view
takes the component of the node that consumed its output). Ops of a forward recomputed in backward
(``model.grad_checkpointing``) count as backward. The step is the LightningModule's own
(``SegmentationModule.head_losses``: the configured loss, chunked or not, auxiliary head included), with
``bf16-mixed`` as autocast on the CPU (which casts the same matmuls and convolutions as CUDA's).
``paths="gpu"`` takes the paths a CUDA device would (``fast_path.paths_of_a_gpu``): each Triton operator is
one op, charged its inputs and outputs, as its kernels read and write them, and CUDA's autocast rules where
they differ from the CPU's (``CudaAutocast``; LayerNorm's own output dtype); ``paths="cpu"`` the PyTorch
paths this CPU runs under the CPU's rules.

The same pass counts the most bytes of tensors alive at once (``HeldBytes``): each storage from the op that
returns it until eager PyTorch frees it.
"""

from __future__ import annotations

import collections
import sys
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import _engine_run_backward as run_backward
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

# Components in the order a table lists them; ``component_of`` maps a module path to one.
FEED_FORWARD = "feed-forward (Mix-FFN / MLP)"
HEAD = "decode head"
LOSS = "loss (upsampling to the image, cross-entropy)"
PROJECTIONS = "qkv and proj linears"
NORMS = "norms and residual adds"
ATTENTION = "attention core"
REST = "patch embeddings and the rest"
COMPONENTS = (FEED_FORWARD, HEAD, LOSS, PROJECTIONS, NORMS, ATTENTION, REST)
PROJECTION_NAMES = {"qkv", "q", "k", "v", "kv", "proj"}
PHASES = ("forward", "backward")
MOVES_NOTHING = {  # allocations, and the view matmul reshapes its result by (not marked a view)
    torch.ops.aten._unsafe_view,
    torch.ops.aten.empty,
    torch.ops.aten.empty_like,
    torch.ops.aten.empty_strided,
    torch.ops.aten.new_empty,
}
SHAPE_ONLY = {  # inputs an op takes for their shape, dtype or device alone: not read
    torch.ops.aten.new_zeros: "self",
    torch.ops.aten.new_ones: "self",
    torch.ops.aten.new_full: "self",
    torch.ops.aten.zeros_like: "self",
    torch.ops.aten.ones_like: "self",
    torch.ops.aten.full_like: "self",
    torch.ops.aten.nll_loss_backward: "self",  # fills ∂input from the target alone
    torch.ops.aten.nll_loss2d_backward: "self",
}
INDEXED = {  # (input, index): the input is read at one element per element of the index, charged those alone
    torch.ops.aten.gather: ("self", "index"),
    torch.ops.aten.scatter_add_: ("self", "index"),  # in place: those elements read and written
    torch.ops.aten.nll_loss_forward: ("self", "target"),
    torch.ops.aten.nll_loss2d_forward: ("self", "target"),
}


def component_of(path: str) -> str:
    """The component of a module path of a SegmentationModule (``model.encoder.stages.0.blocks.1.mlp.fc1``;
    ``criterion``; ``model`` for the Segmentor's own ops, the upsampling of the logits to the image)."""
    parts = path.split(".")
    if parts[0] == "criterion" or path == "model":
        return LOSS
    if "head" in parts or "aux_head" in parts:
        return HEAD
    if "mlp" in parts:
        return FEED_FORWARD
    if "attn" in parts:
        return PROJECTIONS if parts[-1] in PROJECTION_NAMES else ATTENTION
    if parts[-1] in ("norm1", "norm2") or (len(parts) > 1 and parts[-2] == "blocks"):
        return NORMS  # a block's own ops are its residual adds
    return REST


@dataclass
class StepTraffic:
    """Bytes moved per (component, phase), and per (component, ATen op name, phase) for the curious; the
    most bytes of tensors alive at once (``HeldBytes``) and the phase that reached it."""

    bytes: collections.Counter[tuple[str, str]]
    by_op: collections.Counter[tuple[str, str, str]]
    peak_held: int = 0
    peak_phase: str = "forward"

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def rows(self, bandwidth: float) -> list[dict[str, Any]]:
        """One row per component (and a total): GB forward, backward and together, share, and the ms those
        bytes take at ``bandwidth`` bytes/s."""
        total = self.total
        rows = []
        for component in (*COMPONENTS, "total"):
            if component == "total":
                fwd = sum(b for (_, phase), b in self.bytes.items() if phase == "forward")
                bwd = total - fwd
            else:
                fwd, bwd = self.bytes[(component, "forward")], self.bytes[(component, "backward")]
            rows.append(
                {
                    "component": component,
                    "forward_gb": round(fwd / 1e9, 2),
                    "backward_gb": round(bwd / 1e9, 2),
                    "total_gb": round((fwd + bwd) / 1e9, 2),
                    "share_percent": round(100 * (fwd + bwd) / max(total, 1), 1),
                    "ms_at_bandwidth": round(1e3 * (fwd + bwd) / bandwidth, 2),
                }
            )
        return rows


class ModulePaths:
    """The path of the innermost module whose forward is running (global forward hooks), and a tag of the
    same path on each autograd node created there (a torch-function mode sees each op's outputs)."""

    def __init__(self, root: nn.Module) -> None:
        self.names = {id(module): name for name, module in root.named_modules()}
        self.stack: list[tuple[str, FrameType]] = []  # (path, the frame calling its forward)
        self.node_paths: dict[Any, str] = {}
        # off in backward: a recompute's nodes never run, and a tag would keep them and what they saved
        self.tagging = True

    def pre_hook(self, module: nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        if name is not None:
            self.stack.append((name, sys._getframe(1)))

    def post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        self.tag(output)  # before the pop: an output made by an autograd Function is the module's own
        if self.names.get(id(module)) is not None:
            self.stack.pop()

    def running(self) -> str | None:
        """The path of the innermost module whose forward is running, if any. A recompute in backward that
        checkpointing stops once it has what backward needs exits its modules without their post hooks:
        entries whose frame has returned are dropped first."""
        live, frame = set(), sys._getframe(1)
        while frame is not None:
            live.add(id(frame))
            frame = frame.f_back
        while self.stack and id(self.stack[-1][1]) not in live:
            self.stack.pop()
        return self.stack[-1][0] if self.stack else None

    def tag(self, output: Any) -> None:
        if not (self.tagging and self.stack):
            return
        for tensor in tree_leaves(output):
            node = getattr(tensor, "grad_fn", None) if isinstance(tensor, torch.Tensor) else None
            if node is not None and node not in self.node_paths:
                self.node_paths[node] = self.stack[-1][0]

    def inherit(self, loss_node: Any) -> None:
        """Give each untagged node of the backward graph its consumer's path (an autograd Function's node,
        a view's), walking from the loss."""
        queue = collections.deque([(loss_node, "model")])
        seen = set()
        while queue:
            node, consumer_path = queue.popleft()
            if node is None or node in seen:
                continue
            seen.add(node)
            path = self.node_paths.setdefault(node, consumer_path)
            queue.extend((child, path) for child, _ in node.next_functions)


class TagOutputs(TorchFunctionMode):
    def __init__(self, paths: ModulePaths) -> None:
        super().__init__()
        self.paths = paths

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        self.paths.tag(output)
        return output


# Functions whose ops CUDA's autocast runs in fp32 and the CPU's in their input's dtype (torch's
# autocast_mode.h, AT_FORALL_FP32 against the CPU's list): interpolate's upsample_*, the norms
CUDA_FP32_ONLY = {"interpolate", "layer_norm", "group_norm"}


class CudaAutocast(TorchFunctionMode):
    """Under the CPU's autocast, the ops CUDA's autocast alone runs in fp32 (``CUDA_FP32_ONLY``) get their
    lower-precision inputs cast to fp32 first, as CUDA's autocast casts them: the casts and the fp32 maps a
    GPU step writes are counted."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", None) in CUDA_FP32_ONLY and torch.is_autocast_enabled("cpu"):
            args, kwargs = tree_map_only(torch.Tensor, upcast, (args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


class HeldBytes:
    """The bytes of the tensors alive, counted by storage: a storage from when an op first returns it (or
    ``hold`` is given a tensor on it) until it is freed, which a weak reference to it tells (PyTorch keeps
    one Python object per live storage). Eager PyTorch's lifetimes, with no allocator rounding, caching or
    workspaces: a floor for a device's peak."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.seen: set[int] = set()  # ids of the live storages counted

    def hold(self, tensor: torch.Tensor) -> bool:
        """Count ``tensor``'s storage if it is new; whether the total reached a new peak."""
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.seen:
            return False
        size = storage.nbytes()
        self.seen.add(key)
        weakref.finalize(storage, self.release, key, size)
        self.now += size
        if self.now <= self.peak:
            return False
        self.peak = self.now
        return True

    def release(self, key: int, size: int) -> None:
        self.seen.discard(key)
        self.now -= size


class CountBytes(TorchDispatchMode):
    """Charges each ATen op its tensors' bytes, to the running module (forward) or the module of the autograd
    node being run (backward), and holds its outputs (``HeldBytes``)."""

    def __init__(self, paths: ModulePaths, held: HeldBytes) -> None:
        super().__init__()
        self.paths = paths
        self.held = held
        self.traffic = StepTraffic(collections.Counter(), collections.Counter())
        self.in_backward = False  # set by the caller around ``loss.backward()``

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(output):
            if isinstance(tensor, torch.Tensor) and self.held.hold(tensor):
                self.traffic.peak_phase = "backward" if self.in_backward else "forward"
        if func.namespace not in ("aten", "segattn") or func.is_view or func.overloadpacket in MOVES_NOTHING:
            return output  # metadata queries, views and allocations move no bytes
        arguments = func._schema.arguments
        # named arguments; the rest take their defaults
        named = dict(zip((arg.name for arg in arguments), args, strict=False)) | (kwargs or {})
        if named.get("output_read") is False:
            return output  # a segattn operator whose output goes unread launches nothing
        indexed, index = INDEXED.get(func.overloadpacket, (None, None))
        unread = {arg.name for arg in arguments if arg.is_out} | {
            SHAPE_ONLY.get(func.overloadpacket),
            indexed,
        }
        reads = [value for name, value in named.items() if name not in unread]
        in_place = indexed is not None and output is named[indexed]
        tensors = [t for t in tree_leaves((reads, [] if in_place else output)) if isinstance(t, torch.Tensor)]
        moved = sum(t.numel() * t.element_size() for t in tensors)
        if indexed is not None:
            moved += named[index].numel() * named[indexed].element_size() * (2 if in_place else 1)
        node = torch._C._current_autograd_node()
        # the running module (a forward, or one recomputed in backward), else the node's (None: the loss's
        # own gradient, or ops between modules in forward)
        path = self.paths.running() or self.paths.node_paths.get(node, "model")
        phase = "backward" if self.in_backward else "forward"
        component = component_of(path)
        self.traffic.bytes[(component, phase)] += moved
        self.traffic.by_op[(component, str(func.overloadpacket), phase)] += moved
        return output


@contextmanager
def module_hooks(paths: ModulePaths) -> Iterator[None]:
    pre = nn.modules.module.register_module_forward_pre_hook(paths.pre_hook)
    post = nn.modules.module.register_module_forward_hook(paths.post_hook)
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def step_traffic(
    module: nn.Module,
    batch: int,
    height: int,
    width: int,
    precision: str = "bf16-mixed",
    device_paths: str = "gpu",
) -> StepTraffic:
    """The bytes one training step of ``module`` (a SegmentationModule) moves on a batch of ``batch``
    images of ``height`` × ``width``: the loss of ``head_losses`` (plus the auxiliary head's, weighted) and
    its backward; and the most it holds at once: parameters, buffers, the batch, activations and
    gradients (not the optimizer's state). ``precision``: ``bf16-mixed`` (autocast) or ``32-true``;
    ``device_paths``: ``gpu`` (the Triton operators where a CUDA device takes them) or ``cpu``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..layers.fast_path import paths_of_a_gpu

    if precision not in ("bf16-mixed", "32-true"):
        raise ValueError(f"precision={precision!r}: expected bf16-mixed or 32-true")
    paths = ModulePaths(module)
    with ExitStack() as stack:
        if device_paths == "gpu":
            stack.enter_context(paths_of_a_gpu())
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        images = torch.empty(batch, 3, height, width)
        masks = torch.zeros(batch, height, width, dtype=torch.long)
        held = HeldBytes()
        for tensor in (*module.parameters(), *module.buffers(), images, masks):
            held.hold(tensor)
        counter = stack.enter_context(CountBytes(paths, held))
        stack.enter_context(module_hooks(paths))
        if device_paths == "gpu":
            stack.enter_context(CudaAutocast())
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
        with autocast, TagOutputs(paths):
            loss, aux_loss = module.head_losses(images, masks)
            if aux_loss is not None:
                loss = loss + module.model.aux_weight * aux_loss
        paths.inherit(loss.grad_fn)
        paths.tagging, counter.in_backward = False, True
        # the engine itself: loss.backward() is a torch function, and a mode steps aside while one runs, so a
        # checkpoint's recompute inside it would miss CudaAutocast's rules
        run_backward(
            (loss,), (torch.ones_like(loss),), False, False, (), allow_unreachable=True, accumulate_grad=True
        )
    counter.traffic.peak_held = held.peak
    return counter.traffic


def run(module: nn.Module, values: dict[str, Any], out_dir: Path) -> list[dict[str, Any]]:
    """``bench traffic``: the step of ``module`` at the part's ``size``, ``batch`` and ``precision``;
    traffic.csv (a row per component and the total, with the settings that change the bytes) and the
    table."""
    from .report import print_table, write_csv

    size, batch, precision = values["size"], values["batch"], values["precision"]
    traffic = step_traffic(module, batch, size, size, precision, values["paths"])
    setting = {"model": values["model"]["name"], "attention": values["attention"]["name"], "size": size}
    setting |= {"batch": batch, "precision": precision, "paths": values["paths"], "kernel": values["kernel"]}
    setting |= {"grad_checkpointing": values["model"].get("grad_checkpointing", False)}
    setting |= {"chunk_rows": values["loss"].get("chunk_rows")}
    setting |= {"peak_held_gib": round(traffic.peak_held / 2**30, 2), "peak_phase": traffic.peak_phase}
    rows = [setting | row for row in traffic.rows(values["bandwidth"])]
    write_csv(out_dir / "traffic.csv", rows)
    columns = [
        "component",
        "forward GB",
        "backward GB",
        "total GB",
        "share",
        f"ms at {values['bandwidth']:.3g} B/s",
    ]
    body = [
        [
            row["component"],
            *(f"{row[key]:.2f}" for key in ("forward_gb", "backward_gb", "total_gb")),
            f"{row['share_percent']:.1f} %",
            f"{row['ms_at_bandwidth']:.2f}",
        ]
        for row in rows
    ]
    caption = (
        f"one training step of {setting['model']} with {setting['attention']} at {batch}×{size}², "
        f"{precision}, {values['paths']} paths, counted op by op on fake tensors on the CPU; at most "
        f"{setting['peak_held_gib']} GiB of tensors held at once (in {traffic.peak_phase}; "
        "no optimizer state)"
    )
    print_table("traffic", columns, body, caption)
    return rows


__all__ = ["COMPONENTS", "StepTraffic", "component_of", "run", "step_traffic"]
