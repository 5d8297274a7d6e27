"""bench traffic's counter (segattn/bench/traffic.py): bytes per op on fake tensors, charged to components."""

from __future__ import annotations

import csv

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from train_overrides import TINY_MODEL

from segattn.bench.traffic import (
    ATTENTION,
    COMPONENTS,
    FEED_FORWARD,
    HEAD,
    LOSS,
    NORMS,
    PROJECTIONS,
    REST,
    component_of,
    step_traffic,
)
from segattn.cli import compose_command
from segattn.config import plain
from segattn.data.datamodule import SegDataModule
from segattn.training.run import build_module


class OneConvStep(nn.Module):
    """A step whose bytes are known by hand: a 1x1 convolution (the head) and a sum (the loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.head = nn.Conv2d(3, 2, 1, bias=False)
        self.model.aux_weight = 0.4

    def head_losses(self, images, masks):
        return self.model.head(images).sum(), None


def test_forward_bytes_are_each_ops_inputs_and_outputs():
    height, width = 8, 6
    pixels = height * width
    traffic = step_traffic(OneConvStep(), 1, height, width, precision="32-true")
    # convolution: reads the image and the 2x3 weight, writes 2 channels; sum: reads them, writes a scalar
    assert traffic.bytes[(HEAD, "forward")] == 4 * (3 * pixels + 6 + 2 * pixels)
    assert traffic.bytes[(LOSS, "forward")] == 4 * (2 * pixels + 1)
    assert traffic.bytes[(HEAD, "backward")] > 4 * 2 * pixels  # at least the gradient of the output, read
    assert traffic.total == sum(traffic.bytes.values())


@pytest.mark.parametrize(
    ("path", "component"),
    [
        ("model.encoder.stages.0.blocks.1.mlp.fc1", FEED_FORWARD),
        ("model.encoder.stages.0.blocks.1.attn.qkv", PROJECTIONS),
        ("model.encoder.stages.0.blocks.1.attn", ATTENTION),
        ("model.encoder.stages.0.blocks.1.norm1", NORMS),
        ("model.encoder.stages.0.blocks.1", NORMS),
        ("model.head.fuse.conv", HEAD),
        ("model", LOSS),
        ("criterion", LOSS),
        ("model.encoder.patch_embed.proj", REST),
    ],
)
def test_module_paths_map_to_components(path, component):
    assert component_of(path) == component


class TwoConvStep(nn.Module):
    """A step whose peak is known by hand: two 1x1 convolutions (the head) and a sum (the loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.head = nn.Sequential(nn.Conv2d(3, 4, 1, bias=False), nn.Conv2d(4, 2, 1, bias=False))
        self.model.aux_weight = 0.4

    def head_losses(self, images, masks):
        return self.model.head(images).sum(), None


def test_the_peak_held_is_the_tensors_alive_at_once():
    """fp32, one 8x8 image: the weights (48 + 32 bytes), the image (768) and the masks (512, int64) are
    held throughout; the first conv's output (1024) is kept for the second's weight gradient, the second's
    output (512) is freed once summed. The peak is in backward, while the second conv's backward writes
    ∂a1 (1024) and ∂w2 (32) beside a1, the loss and the ones it starts from (4 each)."""
    step = step_traffic(TwoConvStep(), 1, 8, 8, precision="32-true", device_paths="cpu")
    assert step.peak_held == 80 + 768 + 512 + 1024 + 4 + 4 + 1024 + 32
    assert step.peak_phase == "backward"


class CheckpointedSegment(nn.Module):
    """conv, ReLU, conv (1x1, 4 channels), recomputed in backward."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Conv2d(4, 4, 1, bias=False), nn.ReLU(), nn.Conv2d(4, 4, 1, bias=False))

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


def test_each_checkpointed_segment_adds_its_held_input_and_weights_to_the_peak():
    """A chain of segments recomputed in backward: each more holds its input from forward to backward
    (4 × 64 fp32, 1024 bytes) and its two weights (128), nothing of its recompute once its backward ran
    (the counter keeps no autograd node a recompute made)."""

    def peak(segments: int) -> int:
        step = OneConvStep()
        step.model.head = nn.Sequential(
            nn.Conv2d(3, 4, 1, bias=False), *(CheckpointedSegment() for _ in range(segments))
        )
        return step_traffic(step, 1, 8, 8, precision="32-true", device_paths="cpu").peak_held

    assert peak(4) - peak(2) == 2 * (1024 + 128)


def test_a_pvt_step_is_counted_by_component_and_checkpointing_moves_more_in_backward():
    def traffic(*overrides):
        cfg = compose_command("train", [*TINY_MODEL["pvt"], "attention=linear", "logger=none", *overrides])
        return step_traffic(build_module(cfg, SegDataModule(**plain(cfg.data))), 1, 64, 64)

    plain_step, recomputed = traffic(), traffic("model.grad_checkpointing=true")
    for component in COMPONENTS:
        assert plain_step.bytes[(component, "forward")] > 0, component
    forward = sum(plain_step.bytes[(c, "forward")] for c in COMPONENTS)
    assert recomputed.bytes[(FEED_FORWARD, "forward")] == plain_step.bytes[(FEED_FORWARD, "forward")]
    assert sum(recomputed.bytes[(c, "backward")] for c in COMPONENTS) > plain_step.total - forward
    # the recomputed forward is charged to the modules it reruns, where a recompute stopped early (once it
    # has what backward needs) once left the last module it entered charged with the rest of the backward
    for component in set(COMPONENTS) - {LOSS}:
        assert recomputed.bytes[(component, "backward")] > plain_step.bytes[(component, "backward")], (
            component
        )
    rows = plain_step.rows(bandwidth=1e12)
    assert [row["component"] for row in rows] == [*COMPONENTS, "total"]
    assert rows[-1]["ms_at_bandwidth"] == pytest.approx(plain_step.total / 1e9, abs=0.01)
    assert torch.get_default_dtype() == torch.float32  # nothing leaked out of the fake-tensor mode


def test_gpu_paths_count_each_triton_operator_as_one_op_and_leave_the_cpu_paths_after():
    """``paths=gpu``: the attention core is the ``segattn`` operators' inputs and outputs, fewer bytes than
    the PyTorch path's ops; nothing runs, and real CPU tensors take the PyTorch path afterwards."""
    from segattn.layers.fast_path import TRITON, choose_path

    cfg = compose_command("train", [*TINY_MODEL["pvt"], "attention=linear", "logger=none"])
    module = build_module(cfg, SegDataModule(**plain(cfg.data)))
    on_gpu = step_traffic(module, 1, 64, 64, device_paths="gpu")
    on_cpu = step_traffic(module, 1, 64, 64, device_paths="cpu")
    operators = {op for _, op, _ in on_gpu.by_op if op.startswith("segattn.")}
    assert {"segattn.kernel_attention", "segattn.kernel_attention_backward"} <= operators
    assert not any(op.startswith("segattn.") for _, op, _ in on_cpu.by_op)
    gpu_core, cpu_core = (
        step.bytes[(ATTENTION, "forward")] + step.bytes[(ATTENTION, "backward")] for step in (on_gpu, on_cpu)
    )
    assert 0 < gpu_core < cpu_core
    assert choose_path("auto", torch.ones(1, 1, 4, 8), triton_head_dim=8) != TRITON


def test_a_gpu_paths_pvt_step_concatenates_no_attention_gradients():
    """``linear`` on the Triton operators takes the qkv projection whole and returns one ∂qkv: autograd
    has no ∂q, ∂k, ∂v to concatenate in the attention core's backward."""
    cfg = compose_command("train", [*TINY_MODEL["pvt"], "attention=linear", "logger=none"])
    step = step_traffic(build_module(cfg, SegDataModule(**plain(cfg.data))), 1, 64, 64, device_paths="gpu")
    backward = {op for component, op, phase in step.by_op if (component, phase) == (ATTENTION, "backward")}
    assert "segattn.kernel_attention_backward" in backward
    assert "aten.cat" not in backward


def test_a_gpus_default_leaves_the_opt_in_forms_to_their_names_and_triton(monkeypatch):
    """``auto`` gives a GPU the attention operators, Mix-FFN's conv + GELU and LayerNorm; SEGATTN_KERNEL=loss
    adds the opt-in fused loss, ``upsample`` the decode head's upsampling as matmuls (no bilinear op left in
    the head), ``head`` its BatchNorm + ReLU + classifier operators, ``ffn`` Mix-FFN's operators in place of
    the conv + GELU one, ``residual`` the blocks' first residual add in their second norm (fewer bytes in
    the norms and adds than auto's), ``triton`` every form, ``torch`` none."""
    from segattn.layers import KERNEL_ENV
    from segattn.layers.fast_path import paths_of_a_gpu

    default = {"segattn.kernel_attention", "segattn.depthwise_conv_gelu", "segattn.layer_norm"}
    conv_gelu = {"segattn.depthwise_conv_gelu"}
    ffn = {"segattn.mix_ffn", "segattn.mix_ffn_gelu_backward", "segattn.mix_ffn_input_grad"}
    ffn.add("segattn.mix_ffn_fc1_grad")
    loss = {"segattn.seg_loss_sums"}
    head = {
        "segattn.batch_stats",
        "segattn.norm_relu_classifier",
        "segattn.norm_relu_classifier_backward",
        "segattn.norm_relu_input_grad",
    }
    residual = {"segattn.residual_layer_norm", "segattn.residual_layer_norm_backward"}
    norms = {}
    cfg = compose_command("train", [*TINY_MODEL["pvt"], "attention=linear", "logger=none"])
    for kernel, expected, bilinear_head in [
        ("auto", default, True),
        ("loss", default | loss, True),
        ("upsample", default, False),
        ("head", default | head, True),
        ("ffn", default - conv_gelu | ffn, True),
        ("residual", default | residual, True),
        ("triton", default - conv_gelu | loss | head | ffn | residual, False),
        ("torch", set(), True),
    ]:
        monkeypatch.setenv(KERNEL_ENV, kernel)
        with paths_of_a_gpu():
            module = build_module(cfg, SegDataModule(**plain(cfg.data)))
        step = step_traffic(module, 1, 64, 64, device_paths="gpu")
        operators = {op for _, op, _ in step.by_op if op.startswith("segattn.")}
        assert operators & (default | loss | head | ffn | residual) == expected, kernel
        head_ops = {op for component, op, _ in step.by_op if component == HEAD}
        assert ("aten.upsample_bilinear2d" in head_ops) == bilinear_head, kernel
        assert ("aten.upsample_bilinear2d_backward" in head_ops) == bilinear_head, kernel
        norms[kernel] = step.bytes[(NORMS, "forward")] + step.bytes[(NORMS, "backward")]
    assert norms["residual"] < norms["auto"]


def test_a_recompute_in_backward_runs_no_operator_whose_output_goes_unread(monkeypatch):
    """Under checkpointing on every form, Mix-FFN's forward operator and the head's classifier, read only by
    the return of the segment being recomputed, which backward discards, are not charged in backward; nor
    are the head's batch statistics, which the recompute takes from the forward."""
    from segattn.layers import KERNEL_ENV
    from segattn.layers.fast_path import paths_of_a_gpu

    monkeypatch.setenv(KERNEL_ENV, "triton")
    overrides = ["attention=linear", "logger=none", "model.grad_checkpointing=true"]
    cfg = compose_command("train", [*TINY_MODEL["pvt"], *overrides])
    with paths_of_a_gpu():
        module = build_module(cfg, SegDataModule(**plain(cfg.data)))
    step = step_traffic(module, 1, 64, 64, device_paths="gpu")
    ran = {(op, phase) for _, op, phase in step.by_op}
    for op in ("segattn.mix_ffn", "segattn.norm_relu_classifier", "segattn.batch_stats"):
        assert (op, "forward") in ran, op
        assert (op, "backward") not in ran, op
    assert ("segattn.residual_layer_norm", "backward") in ran  # the rest of the blocks is recomputed


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.mul(x, 2, out=torch.empty_like(x))  # an allocation, then a write only

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class Masked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # an op whose out argument is named grad_input: reads x twice, writes once
        return torch.ops.aten.threshold_backward.grad_input(x, x, 0.0, grad_input=torch.empty_like(x))

    @staticmethod
    def backward(ctx, grad):
        return grad


class FunctionHead(nn.Module):
    """A head whose output is made by autograd Functions (with out ops inside): the head's."""

    def forward(self, x):
        return Masked.apply(Doubled.apply(x))


def test_a_modules_function_output_and_out_tensors_are_charged_once_to_the_module():
    step = OneConvStep()
    step.model.head = nn.Sequential(nn.Conv2d(3, 2, 1, bias=False), FunctionHead())
    pixels = 4 * 4
    traffic = step_traffic(step, 1, 4, 4, precision="32-true", device_paths="cpu")
    convolution = 3 * pixels + 6 + 2 * pixels
    # the Function's mul reads 2 channels and writes its out= tensor once, the mask reads them twice and
    # writes its grad_input= once; the allocations move nothing
    assert traffic.bytes[(HEAD, "forward")] == 4 * (convolution + 2 * (2 * pixels) + 3 * (2 * pixels))
    assert traffic.bytes[(LOSS, "forward")] == 4 * (2 * pixels + 1)
    # the Function's backward (grad * 2) is the head's, not the loss's
    assert traffic.by_op[(HEAD, "aten.mul", "backward")] >= 2 * 4 * 2 * pixels
    assert traffic.bytes[(LOSS, "backward")] < traffic.bytes[(HEAD, "backward")]


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match=r"precision='fp8': expected bf16-mixed or 32-true"):
        step_traffic(OneConvStep(), 1, 4, 4, precision="fp8")


def test_the_traffic_part_writes_a_row_per_component_and_the_total(tmp_path, capsys):
    """``python -m segattn.bench traffic``: train.py's model, attention and loss groups with their keys."""
    from segattn.bench.__main__ import main

    out = tmp_path / "traffic"
    argv = ["traffic", *TINY_MODEL["pvt"], "attention=linear", "size=64", "precision=32-true"]
    assert main([*argv, "loss.chunk_rows=16", "model.grad_checkpointing=true", f"out={out}"]) == 0
    with (out / "traffic.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["component"] for row in rows] == [*COMPONENTS, "total"]
    assert {(row["grad_checkpointing"], row["chunk_rows"], row["size"]) for row in rows} == {
        ("True", "16", "64")
    }
    assert float(rows[-1]["total_gb"]) == pytest.approx(
        sum(float(row["total_gb"]) for row in rows[:-1]), abs=0.05
    )
    assert len({row["peak_held_gib"] for row in rows}) == 1  # the step's, on every row
    assert "attention core" in capsys.readouterr().out


def test_a_traffic_key_out_of_range_is_refused_before_the_out_dir(tmp_path, capsys):
    from segattn.bench.__main__ import main

    out = tmp_path / "traffic"
    assert main(["traffic", "size=0", "precision=fp8", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "python -m segattn.bench traffic: size=0: expected an integer >= 1; precision='fp8': expected one of "
        "bf16-mixed, 32-true"
    )
    assert not out.exists()


def test_the_traffic_kernel_key_takes_every_segattn_kernel_value():
    """conf/bench/traffic.yaml's ``kernel`` rule lists fast_path's values (config/ imports no torch)."""
    from segattn.config.checks import SCHEMAS
    from segattn.layers.fast_path import KERNEL_BACKENDS

    assert SCHEMAS["bench/traffic"].rules["kernel"][0] == f"one of {', '.join(KERNEL_BACKENDS)}"


class NllStep(OneConvStep):
    """A step whose loss starts from ``new_zeros`` and adds an NLL of the head's map."""

    def head_losses(self, images, masks):
        logits = self.model.head(images)
        return logits.new_zeros(()) + F.nll_loss(logits, masks), None


def test_inputs_taken_for_their_shape_alone_are_not_read():
    """``new_zeros`` reads nothing of its tensor, and NLL's backward fills ∂input from the target alone."""
    height, width = 8, 6
    pixels = height * width
    traffic = step_traffic(NllStep(), 1, height, width, precision="32-true")
    assert traffic.by_op[(LOSS, "aten.new_zeros", "forward")] == 4  # the scalar written
    # the scalar gradient and total weight read, the int64 target read, ∂input (2 channels) written
    nll_backward = traffic.by_op[(LOSS, "aten.nll_loss2d_backward", "backward")]
    assert nll_backward == 4 * 2 + 8 * pixels + 4 * 2 * pixels


class GatherStep(OneConvStep):
    """A step that gathers the head's map at each pixel's label and adds it back in place (scatter_add_)."""

    def head_losses(self, images, masks):
        logits = self.model.head(images)
        picked = logits.gather(1, masks[:, None])
        return logits.clone().scatter_add_(1, masks[:, None], picked).sum(), None


def test_an_input_read_at_an_index_is_charged_the_elements_read():
    """NLL's forward reads one logit per pixel, gather one element per index, and an in-place scatter_add_
    reads and writes one element per index (with its source); the int64 index is read."""
    height, width = 8, 6
    pixels = height * width
    nll = step_traffic(NllStep(), 1, height, width, precision="32-true")
    # the target, one logit per pixel, the loss and the total weight
    assert nll.by_op[(LOSS, "aten.nll_loss2d_forward", "forward")] == 8 * pixels + 4 * pixels + 4 + 4
    gathered = step_traffic(GatherStep(), 1, height, width, precision="32-true")
    assert gathered.by_op[(LOSS, "aten.gather", "forward")] == 8 * pixels + 4 * pixels + 4 * pixels
    scatter = gathered.by_op[(LOSS, "aten.scatter_add_", "forward")]
    assert scatter == 8 * pixels + 4 * pixels + 2 * 4 * pixels


def test_gpu_paths_count_cuda_autocasts_fp32_ops_in_fp32():
    """Under ``paths=gpu`` the CPU's autocast is given CUDA's rules where they differ: interpolate and
    LayerNorm run in fp32 (a norm that feeds only a matmul writes the autocast dtype), matmuls in bf16."""
    from segattn.bench.traffic import CudaAutocast
    from segattn.layers import LayerNorm
    from segattn.layers.fast_path import paths_of_a_gpu

    images = torch.randn(1, 4, 6, 6, dtype=torch.bfloat16)
    tokens = torch.randn(1, 36, 4, dtype=torch.bfloat16)
    stream, pre_norm = LayerNorm(4), LayerNorm(4, feeds_matmul=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.interpolate(images, size=(12, 12), mode="bilinear").dtype == torch.bfloat16
        assert stream.out_dtype(tokens) == torch.bfloat16  # the CPU's rule: the input's dtype
        with CudaAutocast():
            assert F.interpolate(images, size=(12, 12), mode="bilinear").dtype == torch.float32
            assert F.layer_norm(images, (6,)).dtype == torch.float32
            assert (images @ images).dtype == torch.bfloat16
        with paths_of_a_gpu():
            assert stream.out_dtype(tokens) == torch.float32  # CUDA's: fp32 whatever the input
            assert pre_norm.out_dtype(tokens) == torch.bfloat16
