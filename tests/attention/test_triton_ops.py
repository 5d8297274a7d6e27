"""The Triton path as torch operators (``segattn.attention.triton.ops``): ``torch.library.opcheck`` on every
operator (schema, autograd registration, fake tensors against real results, AOT dispatch with dynamic
shapes), ``torch.compile`` of a module on the Triton path keeping the operators (one graph, outputs and
gradients as in eager), and exporters never seeing them.

On the CPU through Triton's interpreter (tests/conftest.py); with a CUDA device, compiled. Inputs
are tiny: the interpreter runs programs one by one, and opcheck calls each operator several times.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from attention_reference import build_perturbed
from torch import Tensor
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from segattn.attention.triton import load_kernels, ops
from segattn.attention.triton.functions import heads_view
from segattn.layers import KERNEL_ENV

DEVICE = torch.device("cpu" if load_kernels().INTERPRETED else "cuda")
pytestmark = pytest.mark.usefixtures("exact_fp32")
HEADS = 2


def leaf(*shape: int, seed: int, grad: bool = True) -> Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    return x.requires_grad_(grad)


def qkv(tokens: int, d: int, keys: int | None = None, grad: bool = True) -> list[Tensor]:
    """q, k, v [1, h, N, d] as head views of [1, N, C] column blocks (k, v: ``keys`` tokens if given)."""
    x = leaf(1, tokens, 3 * HEADS * d, seed=0, grad=grad)
    q, k, v = (heads_view(t, HEADS) for t in x.chunk(3, dim=-1))
    if keys is not None:
        k, v = k[..., :keys, :], v[..., :keys, :]
    return [q, k, v]


def opcheck(name: str, args: tuple) -> None:
    results = torch.library.opcheck(getattr(torch.ops.segattn, name).default, args, raise_exception=False)
    failures = {test: str(result) for test, result in results.items() if result != "SUCCESS"}
    assert not failures, failures


@pytest.mark.parametrize(
    ("names", "scalars", "tokens", "normalize", "taylor", "keys"),
    [
        # efficient: unnormalised, the key softmax's statistics; taylor: normalised, β = Σv
        (["softmax_channels", "softmax_tokens"], [0.5, 0.0, 0.5, 0.0, 1.0, 0.0], 1, False, False, None),
        (["l2", "l2"], [1.0, 1e-6, 1.0, 1e-6, 1.0, 1e-6], 1, True, True, None),
        (["identity", "identity"], [1.0, 0.0, 1.0, 0.0, 1.0, 1e-6], 3, True, False, 3),  # mean; fewer keys
    ],
)
def test_kernel_attention_operators_pass_opcheck(
    names: list[str], scalars: list[float], tokens: int, normalize: bool, taylor: bool, keys: int | None
) -> None:
    q, k, v = qkv(5, 16, keys)
    maps = [ops.MAP_KINDS.index(name) for name in names]
    args = (maps, scalars, tokens, normalize, taylor, 0)
    opcheck("kernel_attention", (q, k, v, *args))
    with torch.no_grad():
        out, *saved = torch.ops.segattn.kernel_attention(q, k, v, *args)
    q, k, v = (t.detach() for t in (q, k, v))
    grad = leaf(*out.shape, seed=1, grad=False)
    opcheck("kernel_attention_backward", (q, k, v, grad, saved, maps, scalars, tokens, taylor, 0))


@pytest.mark.parametrize("packed", [False, True], ids=["q, k, v", "qkv"])
def test_kernel_attention_operators_take_tokens_by_channels(packed: bool) -> None:
    """[B, N, C] q, k, v whose heads the kernels read through strides, or their [B, N, 3C] qkv (k, v None),
    whose gradient the backward returns as one tensor: the output is [B, N, C] too."""
    if packed:
        q, k, v = leaf(1, 5, 3 * HEADS * 16, seed=0), None, None
    else:
        q, k, v = (leaf(1, 5, HEADS * 16, seed=i) for i in range(3))
    args = ([1, 1], [1.0, 0.0, 1.0, 0.0, 1.0, 1e-6], 1, True, False, HEADS)
    opcheck("kernel_attention", (q, k, v, *args))
    with torch.no_grad():
        out, *saved = torch.ops.segattn.kernel_attention(q, k, v, *args)
    assert out.shape == (1, 5, HEADS * 16)
    q, k, v = (None if t is None else t.detach() for t in (q, k, v))
    grad = leaf(*out.shape, seed=1, grad=False)
    opcheck("kernel_attention_backward", (q, k, v, grad, saved, *args[:2], 1, False, HEADS))
    grads = torch.ops.segattn.kernel_attention_backward(q, k, v, grad, saved, *args[:2], 1, False, HEADS)
    assert [g.shape for g in grads] == [t.shape for t in (q, k, v) if t is not None]


def test_focused_attention_operators_pass_opcheck() -> None:
    q, k, v = (leaf(1, 5, HEADS * 16, seed=i) for i in range(3))
    local, scale = leaf(1, HEADS, 5, 16, seed=3), leaf(HEADS * 16, seed=4)
    opcheck("focused_attention", (q, k, v, local, scale, 3.0, 1e-6, HEADS))
    with torch.no_grad():
        out, kv, inv = torch.ops.segattn.focused_attention(q, k, v, local, scale, 3.0, 1e-6, HEADS)
    q, k, v, scale = (t.detach() for t in (q, k, v, scale))
    grad = leaf(*out.shape, seed=5, grad=False)
    opcheck("focused_attention_backward", (q, k, v, grad, [kv, inv], scale, 3.0, HEADS, 5))


@pytest.mark.parametrize(("keys", "needs"), [(None, [True, True, True]), (3, [False, True, False])])
def test_polarity_attention_operators_pass_opcheck(keys: int | None, needs: list[bool]) -> None:
    q, k, v = qkv(5, 8, keys)
    power = (1.5 + torch.rand(HEADS, 8, generator=torch.Generator().manual_seed(7))).to(DEVICE)
    power.requires_grad_()
    opcheck("polarity_attention", (q, k, v, power, 1e-6))
    with torch.no_grad():
        out, *saved = torch.ops.segattn.polarity_attention(q, k, v, power, 1e-6)
    q, k, v, power = (t.detach() for t in (q, k, v, power))
    grad = leaf(*out.shape, seed=8, grad=False)
    opcheck("polarity_attention_backward", (grad, q, k, v, power, saved, needs))


def record_operators(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each eager call of the Triton path's operator functions (``triton.ops``, which eager mode
    calls directly), by name; the originals still run."""
    calls: list[str] = []

    def recorder(name: str, original):
        def recorded(*args):
            calls.append(name)
            return original(*args)

        return recorded

    for name in ops.OPERATORS:
        monkeypatch.setattr(ops, name, recorder(name, getattr(ops, name)))
    return calls


class SegattnOps(TorchDispatchMode):
    """Records the names of the ``torch.ops.segattn`` operators called inside."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "segattn":
            self.names.append(func._schema.name.split("::")[1])
        return func(*args, **(kwargs or {}))


def relative_error(actual: Tensor, expected: Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


# (variant, options, its forward operator, its backward operators)
COMPILED = [
    ("linear", {}, "kernel_attention", ["kernel_attention_backward"]),
    ("flatten", {}, "focused_attention", ["focused_attention_backward"]),
    ("pola", {}, "polarity_attention", ["polarity_attention_backward"]),
]


@pytest.mark.parametrize(("name", "options", "forward_op", "backward_ops"), COMPILED)
def test_compiled_module_keeps_the_triton_operators(
    monkeypatch: pytest.MonkeyPatch, name: str, options: dict, forward_op: str, backward_ops: list[str]
) -> None:
    """``torch.compile`` (fullgraph=False, AOT autograd) of a module built under SEGATTN_KERNEL=triton: one
    graph holding the forward operator (no graph break, no plain formula), the backward operators in the
    compiled backward, and the outputs and gradients of eager mode (which calls the same functions)."""
    monkeypatch.setenv(KERNEL_ENV, "triton")
    module = build_perturbed(name, options, 32, HEADS, 15).to(DEVICE)
    assert module.kernel_backend == "triton"
    hw, x = (3, 5), leaf(2, 15, 32, seed=9)
    eager = record_operators(monkeypatch)  # eager mode calls the operators' functions directly
    out = module(x, hw)
    grads = torch.autograd.grad(out, [x, *module.parameters()], torch.ones_like(out))
    assert eager == [forward_op, *backward_ops]

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(copy.deepcopy(module), backend=counter, fullgraph=False)
    compiled_out = compiled(x, hw)
    with SegattnOps() as backward:
        compiled_grads = torch.autograd.grad(
            compiled_out, [x, *compiled.parameters()], torch.ones_like(compiled_out)
        )
    assert counter.frame_count == 1 and len(counter.graphs) == 1
    targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t.startswith("segattn.")] == [f"segattn.{forward_op}.default"]
    assert backward.names == backward_ops
    for actual, expected in zip([compiled_out, *compiled_grads], [out, *grads], strict=True):
        assert relative_error(actual, expected) < 1e-5


def test_compiled_module_with_dynamic_shapes_keeps_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile(dynamic=True)`` of ``efficient`` (normalization: scale, the context divided by N) on
    the Triton path over three grids: one graph with the operator (N reaches it as an integer, kept symbolic;
    a float 1/N would be specialised on, a graph per size), and eager's outputs."""
    monkeypatch.setenv(KERNEL_ENV, "triton")
    module = build_perturbed("efficient", {"normalization": "scale"}, 32, HEADS, 16).to(DEVICE)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, backend=counter, dynamic=True)
    for seed, hw in enumerate([(4, 4), (3, 5), (6, 7)]):
        x = leaf(2, hw[0] * hw[1], 32, seed=seed, grad=False)
        assert relative_error(compiled(x, hw), module(x, hw)) < 1e-5
    graphs = [graph for graph in counter.graphs if len(graph.graph.nodes)]  # dynamo may add an empty one
    assert len(graphs) == 1
    assert "segattn.kernel_attention.default" in [str(n.target) for n in graphs[0].graph.nodes]


def test_exporters_see_the_plain_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built under SEGATTN_KERNEL=triton, a module exports (``torch.export``) and traces (TorchScript) to
    plain ops: no segattn operator in either graph, and the same output as eager."""
    monkeypatch.setenv(KERNEL_ENV, "triton")
    module = build_perturbed("linear", {}, 32, HEADS, 15).to(DEVICE).eval()
    x = leaf(1, 15, 32, seed=10, grad=False)
    wrapper = Wrapper(module)
    eager = record_operators(monkeypatch)
    expected = wrapper(x)
    assert eager == ["kernel_attention"]
    exported = torch.export.export(wrapper, (x,))
    assert not [n for n in exported.graph.nodes if str(n.target).startswith("segattn.")]
    traced = torch.jit.trace(wrapper, (x,), check_trace=False)
    assert not [n for n in traced.inlined_graph.nodes() if n.kind().startswith("segattn::")]
    for actual in (exported.module()(x), traced(x)):
        assert relative_error(actual, expected) < 1e-5


class Wrapper(torch.nn.Module):
    """Tensor in, tensor out: the module on a 3×5 grid."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        return self.module(x, (3, 5))
