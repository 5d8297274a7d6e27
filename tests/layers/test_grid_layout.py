"""Token grids reach convolutions as dense channels-last tensors at any batch size. At B = 1 a transposed
[1, N, C] view has batch stride C, and conv2d then runs NCHW, copying its input in and its output out."""

import pytest
import torch
import torch.nn.functional as F

from segattn.layers import from_grid, to_grid
from segattn.layers.depthwise import dense_channels_last, depthwise_conv


def standard_channels_last_strides(shape: torch.Size) -> tuple[int, ...]:
    _, channels, height, width = shape
    return (height * width * channels, 1, width * channels, channels)


@pytest.mark.parametrize("batch", [1, 2])
def test_to_grid_is_a_standard_channels_last_view(batch: int) -> None:
    tokens = torch.randn(batch, 12, 5)
    grid = to_grid(tokens, (3, 4))
    assert grid.data_ptr() == tokens.data_ptr()
    assert grid.stride() == standard_channels_last_strides(grid.shape)
    assert torch.equal(grid, tokens.transpose(1, 2).reshape(batch, 5, 3, 4))
    assert torch.equal(from_grid(grid), tokens)


def test_dense_channels_last_restrides_a_size_one_batch_without_copying() -> None:
    grid = torch.randn(1, 12, 5).transpose(1, 2).reshape(1, 5, 3, 4)  # batch stride 5
    assert grid.stride()[0] == 5
    dense = dense_channels_last(grid)
    assert dense.data_ptr() == grid.data_ptr()
    assert dense.stride() == standard_channels_last_strides(grid.shape)
    assert torch.equal(dense, grid)


@pytest.mark.parametrize("kernel", [3, 5])  # oneDNN's own backward, and DepthwiseConv's
def test_depthwise_conv_on_a_single_image_token_grid_stays_channels_last(kernel: int) -> None:
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(6, 6, kernel, padding=kernel // 2, groups=6)
    tokens = torch.randn(1, 35, 6, requires_grad=True)

    def as_grid(x: torch.Tensor) -> torch.Tensor:  # the batch-stride-C view conv2d would take as NCHW
        return x.transpose(1, 2).reshape(1, 6, 5, 7)

    out = depthwise_conv(as_grid(tokens), conv)
    assert out.stride() == standard_channels_last_strides(out.shape)
    reference = F.conv2d(as_grid(tokens).contiguous(), conv.weight, conv.bias, padding=kernel // 2, groups=6)
    torch.testing.assert_close(out, reference)
    grads = torch.autograd.grad(out.square().sum(), (tokens, conv.weight, conv.bias))
    expected = torch.autograd.grad(reference.square().sum(), (tokens, conv.weight, conv.bias))
    for grad, grad_expected in zip(grads, expected, strict=True):
        torch.testing.assert_close(grad, grad_expected)
