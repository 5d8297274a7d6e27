"""Every Triton kernel compiles for an H100 (sm_90), on a machine without a GPU: the interpreter that runs
the numerical tests (test_triton_kernels.py) executes the kernels as Python and does not catch what only the
compiler rejects (types of loop-carried values, shapes ``tl.dot`` refuses, shared memory over the limit).

``triton.compile`` to a cubin needs no device, only triton's bundled ptxas. It runs in a child process:
this one has TRITON_INTERPRET=1 (tests/conftest.py), under which ``triton.jit`` makes interpreted functions.
Each feature map's forward and backward code is compiled once (``backward_kernel``'s second phase uses both),
each kernel with its branches on, the widest head dim with its block size, and the stats and focusing
kernels. A second child counts the binaries a sweep of token counts needs, from Triton's own specialisation
keys. The fused loss's kernels (``training.loss_kernels``), Mix-FFN's (``layers.depthwise_triton``, and
the ``ffn`` form's, ``layers.mix_ffn_triton``), LayerNorm's (``layers.layer_norm_triton``), the decode
head's (``layers.head_triton``) are checked for spills here too.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

# the kernels' float arguments; other scalars are i32
FLOATS = {"q_scale", "q_eps", "k_scale", "k_eps", "eps", "power", "factor"}
SM90 = 90
SHARED_LIMIT = 227 * 1024  # bytes of shared memory one H100 block may use


def arg_type(name: str, constants: dict, half: tuple[str, ...]) -> str:
    """A kernel argument's type by the kernels' naming: constants, ``*_ptr`` pointers (bf16 for the names
    in ``half``, i32 for the counters ``sync_ptr``, else fp32), ``FLOATS``, and i32 for every other scalar
    (sizes, strides)."""
    if name in constants:
        return "constexpr"
    if name == "sync_ptr":
        return "*i32"
    if name.endswith("_ptr"):
        return "*bf16" if name in half else "*fp32"
    return "fp32" if name in FLOATS else "i32"


def compile_all() -> list[str]:
    """Compile every case for sm_90; one line per case (kernel, constants, shared bytes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from segattn.attention.triton import kernels as K
    from segattn.attention.triton.launch import Blocks, focus_blocks

    target = GPUTarget("cuda", SM90, 32)

    def build(fn, constants: dict, num_warps: int, half: tuple[str, ...] = ()) -> str:
        signature = {name: arg_type(name, constants, half) for name in fn.arg_names}
        kernel = triton.compile(
            ASTSource(fn, signature, constexprs=constants), target=target, options={"num_warps": num_warps}
        )
        assert kernel.metadata.shared <= SHARED_LIMIT, (fn.__name__, constants, kernel.metadata.shared)
        return f"{fn.__name__} {constants} shared={kernel.metadata.shared}"

    bf16 = Blocks(32, 32, 64, 4, "tf32")  # what the launchers pick for bf16 heads of 32 on a GPU
    fp32_wide = Blocks(128, 128, 16, 8, "ieee")  # fp32 heads of 128 with TF32 off
    inputs = ("q_ptr", "k_ptr", "v_ptr", "g_ptr", "x_ptr", "out_ptr", "dq_ptr", "dk_ptr", "dv_ptr", "add_ptr")
    lines = []
    for kind in range(K.POLARITY_SWAPPED + 1):  # every map forward and backward (the keys' half)
        flags = {
            "Q_KIND": kind,
            "K_KIND": kind,
            "NORMALIZED": True,
            "HAS_BIAS": kind == K.L2,
            "PHASES": K.BOTH,
        }
        lines.append(build(K.backward_kernel, {**bf16.constants(), **flags}, bf16.num_warps, inputs))
    for query_kind, key_kind, normalized in ((K.FOCUS, K.FOCUS, True), (K.SOFTMAX_D, K.SOFTMAX_N, False)):
        flags = {"Q_KIND": query_kind, "K_KIND": key_kind, "NORMALIZED": normalized, "HAS_BIAS": normalized}
        constants = {**bf16.constants(), **flags, "PHASES": K.BOTH}
        lines.append(build(K.forward_kernel, {**constants, "HAS_ADDEND": normalized}, 4, inputs))
        if not normalized:
            lines.append(build(K.backward_kernel, constants, bf16.num_warps, inputs))
    polarity = Blocks(64, 16, 32, 8, "tf32")  # pola's bf16 heads of 32: 64 features, half of v per call
    flags = {"Q_KIND": K.POLARITY, "K_KIND": K.POLARITY_SWAPPED, "NORMALIZED": True, "HAS_BIAS": False}
    constants, warps = {**polarity.constants(), **flags, "PHASES": K.BOTH}, polarity.num_warps
    lines.append(build(K.forward_kernel, {**constants, "HAS_ADDEND": False}, warps, inputs))
    lines.append(build(K.backward_kernel, constants, warps, inputs))
    wide = {"Q_KIND": K.L2, "K_KIND": K.L2, "NORMALIZED": True, "HAS_BIAS": True, "PHASES": K.BOTH}
    lines.append(build(K.backward_kernel, {**fp32_wide.constants(), **wide}, fp32_wide.num_warps))
    lines.append(build(K.key_softmax_stats_kernel, {"D": 32, "BLOCK_N": 64}, 4, inputs))
    width, block, warps = focus_blocks(512)
    for fn in (K.focus_stats_kernel, K.focus_backward_kernel):
        lines.append(build(fn, {"CP": width, "BLOCK_N": block}, warps, inputs))
    return lines


def spills() -> list[str]:
    """Registers and spill stores a thread of each attention kernel uses on sm_90 at the blocks the launcher
    plans for heads of 32 (pvt-b0) and 64 (vit) in bf16, and 64 in fp32: ptxas's own report (``-v``) of the
    PTX Triton generates. One line per kernel: "name head dtype registers spills"."""
    from segattn.attention.triton import kernels as K
    from segattn.attention.triton.launch import Tuning, planned_blocks

    half = ("q_ptr", "k_ptr", "v_ptr", "g_ptr", "x_ptr", "out_ptr", "dq_ptr", "dk_ptr", "dv_ptr", "add_ptr")
    elu = {"Q_KIND": K.ELU, "K_KIND": K.ELU, "NORMALIZED": True, "HAS_BIAS": False, "PHASES": K.BOTH}
    cases = {K.backward_kernel: elu, K.forward_kernel: {**elu, "HAS_ADDEND": False}}
    lines = []
    for head, dtype in ((32, "bf16"), (64, "bf16"), (64, "fp32")):
        blocks = planned_blocks(head, head, dtype == "bf16", Tuning())
        for fn, flags in cases.items():
            constants = {**blocks.constants(), **flags}
            halves = half if dtype == "bf16" else ()
            registers, spilled = ptxas_report(fn, constants, blocks.num_warps, halves, {})
            lines.append(f"{fn.__name__} {head} {dtype} {registers} {spilled}")
    return lines


def ptxas_report(fn, constants: dict, num_warps: int, half: tuple[str, ...], types: dict) -> tuple[str, str]:
    """Registers and spill-store bytes a thread of ``fn`` uses on sm_90 (ptxas ``-v`` on Triton's PTX);
    argument types by ``arg_type``, except those given in ``types``."""
    import re
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    signature = {name: types.get(name) or arg_type(name, constants, half) for name in fn.arg_names}
    kernel = triton.compile(
        ASTSource(fn, signature, constexprs=constants),
        target=GPUTarget("cuda", SM90, 32),
        options={"num_warps": num_warps},
    )
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(kernel.asm["ptx"])
        ptx.flush()
        report = subprocess.run(
            [ptxas, "-v", "--gpu-name=sm_90a", ptx.name, "-o", os.devnull],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    registers = re.search(r"Used (\d+) registers", report).group(1)
    return registers, re.search(r"(\d+) bytes spill stores", report).group(1)


def loss_spills() -> list[str]:
    """The fused loss's kernels at the blocks ``fused_loss.loss_blocks`` plans for 19 classes (Cityscapes)
    and 128 (the most it takes), bf16 logits with Dice: "name classes registers spills" per kernel."""
    from segattn.training import loss_kernels as L
    from segattn.training.fused_loss import BLOCK_IN, loss_blocks

    half = ("logits_ptr", "dlogits_ptr")
    tables = ("row_low", "row_high", "col_low", "col_high", "row_start", "row_stop", "col_start", "col_stop")
    types = {"target_ptr": "*i64", "smoothing": "fp32", **{f"{name}_ptr": "*i32" for name in tables}}
    lines = []
    for classes in (19, 128):
        padded, block, warps = loss_blocks(classes)
        constants = {"DICE": True, "KP": padded, "BLOCK": block}
        for fn, extra in ((L.loss_sums_kernel, {}), (L.loss_backward_kernel, {"BLOCK_IN": BLOCK_IN})):
            registers, spilled = ptxas_report(fn, {**constants, **extra}, warps, half, types)
            lines.append(f"{fn.__name__} {classes} {registers} {spilled}")
    return lines


def mix_ffn_spills() -> list[str]:
    """Mix-FFN's conv + GELU kernels at their blocks for 256 channels (pvt-b0's stage 1), bf16 and fp32: the
    forward, ∂x (the forward's kernel without GELU) and ĝ with the weight and bias partials; "name dtype
    registers spills" per launch."""
    from segattn.layers import depthwise_triton as D

    forward = dict(zip(("BLOCK_P", "BLOCK_C"), D.blocks(256, compiled=True), strict=True))
    backward = dict(zip(("BLOCK_P", "BLOCK_C"), D.blocks(256, compiled=True, accumulating=True), strict=True))
    cases = {
        "forward": (D.conv_gelu_kernel, {**forward, "GELU": True}),
        "grad_x": (D.conv_gelu_kernel, {**forward, "GELU": False}),
        "grad_pre": (D.gelu_backward_kernel, backward),
    }
    lines = []
    for dtype in ("bf16", "fp32"):
        half = ("x_ptr", "g_ptr", "out_ptr", "dpre_ptr") if dtype == "bf16" else ()
        for name, (fn, constants) in cases.items():
            registers, spilled = ptxas_report(fn, constants, D.NUM_WARPS, half, {})
            lines.append(f"{name} {dtype} {registers} {spilled}")
    return lines


def ffn_spills() -> list[str]:
    """The ``ffn`` form's kernels (``layers.mix_ffn_triton``) at their blocks for pvt-b0's first stage (32
    channels, 256 hidden) and the widest tokens they take (256, 1024 hidden), bf16 and fp32: "name channels
    dtype registers spills" per kernel."""
    from segattn.layers import mix_ffn_triton as M
    from segattn.layers.depthwise import MAX_FFN_CHANNELS

    walking = (M.gelu_backward_kernel, M.fc1_grad_kernel)
    lines = []
    for channels in (32, MAX_FFN_CHANNELS):
        for dtype in ("bf16", "fp32"):
            half = ("h_ptr", "g_ptr", "out_ptr", "dpre_ptr", "dx_ptr", "x_ptr") if dtype == "bf16" else ()
            for fn in (M.forward_kernel, M.input_grad_kernel, *walking):
                block_p, block_h, block_c = M.blocks(4 * channels, channels, True, walking=fn in walking)
                constants = {"BLOCK_P": block_p, "BLOCK_H": block_h, "BLOCK_C": block_c, "COMPILED": True}
                registers, spilled = ptxas_report(fn, constants, M.NUM_WARPS, half, {})
                lines.append(f"{fn.__name__} {channels} {dtype} {registers} {spilled}")
    return lines


def layer_norm_spills() -> list[str]:
    """LayerNorm's kernels at their tiles for 32 channels (pvt-b0's stage 1) and 1024 (the widest), fp32 rows
    normalised into bf16 (autocast) and fp32 throughout, alone and with the residual add (a bf16 branch, its
    factor per image, s's gradient; fp32 throughout): "name channels dtype registers spills" per kernel."""
    from segattn.layers import layer_norm_triton as N

    halves = {"bf16": ("y_ptr", "grad_ptr", "branch_ptr", "dbranch_ptr"), "fp32": ()}
    lines = []
    for channels in (32, 1024):
        rows, padded = N.tile(channels)
        for residual in (False, True):
            constants = {"BLOCK_ROWS": rows, "BLOCK_C": padded, "RESIDUAL": residual, "SCALED": residual}
            for dtype, half in halves.items():
                for fn in (N.layer_norm_kernel, N.layer_norm_backward_kernel):
                    backward = {"GRAD_SUM": residual} if fn is N.layer_norm_backward_kernel else {}
                    warps = N.RESIDUAL_BACKWARD_WARPS if residual and backward else 4
                    registers, spilled = ptxas_report(fn, constants | backward, warps, half, {})
                    name = fn.__name__ + ("+residual" if residual else "")
                    lines.append(f"{name} {channels} {dtype} {registers} {spilled}")
    return lines


def head_spills() -> list[str]:
    """The decode head's kernels (``layers.head_triton``) at their blocks for 256 channels (pvt-b0's head)
    and 19 classes (Cityscapes) and 128 (the most it takes), bf16 maps: "name classes registers spills"."""
    from segattn.layers import head_triton as H

    half = ("x_ptr", "out_ptr", "grad_ptr", "dx_ptr")
    lines = []
    for classes in (19, 128):
        for fn in (H.stats_kernel, H.classifier_kernel, H.classifier_backward_kernel, H.input_grad_kernel):
            accumulating = fn is H.classifier_backward_kernel
            block_p, block_c, block_k = H.blocks(256, classes, compiled=True, accumulating=accumulating)
            constants = {"BLOCK_P": block_p, "BLOCK_C": block_c}
            if fn is not H.stats_kernel:
                constants |= {"BLOCK_K": block_k, "COMPILED": True}
            registers, spilled = ptxas_report(fn, constants, H.NUM_WARPS, half, {})
            lines.append(f"{fn.__name__} {classes} {registers} {spilled}")
    return lines


def test_the_head_kernels_compile_for_sm90_without_spilling() -> None:
    rows = [line.split() for line in run_child("head").stdout.splitlines()]
    assert len(rows) == 8, rows
    assert [row for row in rows if row[3] != "0"] == []


def test_the_layer_norm_kernels_compile_for_sm90_without_spilling() -> None:
    rows = [line.split() for line in run_child("layer_norm").stdout.splitlines()]
    assert len(rows) == 16, rows
    assert [row for row in rows if row[4] != "0"] == []


def test_the_mix_ffn_kernels_compile_for_sm90_without_spilling() -> None:
    """With their nine taps unrolled, at 32 pixels × 64 channels, they spilled: 254 registers and 32 bytes a
    thread in the forward, 18 KiB in the strip-walking backward of before; ``gelu_backward_kernel``'s ten
    accumulators at 16 pixels spilled 4 bytes in fp32."""
    rows = [line.split() for line in run_child("mix_ffn").stdout.splitlines()]
    assert len(rows) == 6, rows
    assert [row for row in rows if row[3] != "0"] == []


def test_the_ffn_form_kernels_compile_for_sm90_without_spilling() -> None:
    """At 32 hidden channels and 4 warps the walking kernels spilled in fp32 (24 bytes a thread at 32 token
    channels, 292 at 64); at 512 token channels ``gelu_backward_kernel`` spilled 88 bytes in fp32."""
    rows = [line.split() for line in run_child("ffn").stdout.splitlines()]
    assert len(rows) == 16, rows
    assert [row for row in rows if row[4] != "0"] == []


def test_the_loss_kernels_compile_for_sm90_without_spilling() -> None:
    rows = [line.split() for line in run_child("loss").stdout.splitlines()]
    assert len(rows) == 4, rows
    assert [row for row in rows if row[3] != "0"] == []


def test_no_kernel_spills_registers_at_the_planned_blocks() -> None:
    """Heads of 64 at 64 tokens a block and 4 warps spilled 648 bytes a thread in the query backward kernel
    (bf16); the launcher's plan keeps every kernel within the registers at heads of 32 and 64."""
    rows = [line.split() for line in run_child("spills").stdout.splitlines()]
    assert len(rows) == 6, rows
    assert [row for row in rows if row[4] != "0"] == []


def variants_over_token_counts() -> list[str]:
    """How many binaries (Triton's specialisation keys for sm_90) each attention kernel needs over forward and
    backward at ten token counts N (1, multiples of 16 and not, 65539): the launches are captured with CPU
    tensors and keyed by Triton's own argument binder, on a grid planned for an H100's 132 multiprocessors.
    One line per kernel, "name count"."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    from segattn.attention.functional import FeatureMap, KernelCore
    from segattn.attention.triton import launch, load_kernels
    from segattn.attention.triton.functions import kernel_attention_triton

    kernels, backend = load_kernels(), make_backend(GPUTarget("cuda", SM90, 32))
    keys: dict[str, set] = {}

    class Capture:
        def __init__(self, fn) -> None:
            self.name, self.bind = (
                fn.__name__,
                create_function_from_signature(fn.signature, fn.params, backend),
            )

        def __getitem__(self, grid):
            def launch(*args, **kwargs) -> None:
                _, specialization, options = self.bind(*args, **kwargs)
                keys.setdefault(self.name, set()).add((str(specialization), str(sorted(options.items()))))

            return launch

    for name in ("forward_kernel", "backward_kernel"):
        setattr(kernels, name, Capture(getattr(kernels, name)))
    launch.planned_programs = lambda device, per_sm: (per_sm or 4) * 132
    phi = FeatureMap("elu")
    for tokens in (1, 7, 64, 100, 1000, 1024, 4096, 4099, 16384, 65539):
        x = torch.randn(2, tokens, 3 * 64, requires_grad=True)
        q, k, v = (t.unflatten(-1, (2, 32)).transpose(1, 2) for t in x.chunk(3, dim=-1))
        out = kernel_attention_triton(q, k, v, KernelCore(phi, phi, eps=1e-6))
        torch.autograd.grad(out, x, out)
    return [f"{name} {len(variants)}" for name, variants in sorted(keys.items())]


def run_child(*args: str) -> subprocess.CompletedProcess:
    """This file run as a script, without Triton's interpreter."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    child = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return child


def test_every_kernel_compiles_for_sm90() -> None:
    child = run_child()
    assert len(child.stdout.splitlines()) == 18, child.stdout


def test_a_new_token_count_reuses_the_compiled_kernels() -> None:
    """The integers that follow N are not specialised (``kernels.SPLIT_SIZES``): 22 binaries before, over
    these ten N, for one feature map, dtype and head dim."""
    child = run_child("variants")
    expected = ["backward_kernel 1", "forward_kernel 1"]
    assert child.stdout.splitlines() == expected, child.stdout


if __name__ == "__main__":
    modes = {
        "variants": variants_over_token_counts,
        "spills": spills,
        "loss": loss_spills,
        "mix_ffn": mix_ffn_spills,
        "ffn": ffn_spills,
        "layer_norm": layer_norm_spills,
        "head": head_spills,
    }
    print("\n".join(modes.get(sys.argv[1] if sys.argv[1:] else "", compile_all)()))
