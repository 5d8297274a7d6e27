"""infer(): whole vs slide equivalence, count-map averaging, bounded crop batches, and TTA on known models."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from segattn.inference.infer import infer
from segattn.tiling import slide_windows, window_starts


class Recorder(nn.Module):
    """Wraps a model and records the shape of every batch it is called with."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls: list[tuple[int, ...]] = []

    def forward(self, x: Tensor) -> Tensor:
        self.calls.append(tuple(x.shape))
        return self.model(x)


def pointwise_head(num_classes: int = 5) -> nn.Module:
    """A 1×1 conv: translation-equivariant by construction, so any tiling must equal the whole image."""
    torch.manual_seed(0)
    return nn.Conv2d(3, num_classes, kernel_size=1).eval()


def test_window_starts_snap_last_window_to_border():
    # size 100, crop 32, stride 24: 0, 24, 48, then 72 would overrun (72 + 32 > 100) so it snaps to 68.
    assert window_starts(100, 32, 24) == [0, 24, 48, 68]
    assert window_starts(96, 32, 32) == [0, 32, 64]
    assert window_starts(20, 32, 16) == [0]  # crop larger than the image: one window


def test_slide_windows_cover_every_pixel_with_crop_sized_windows():
    windows = slide_windows(45, 70, (16, 32), (10, 20))
    covered = torch.zeros(45, 70)
    for top, bottom, left, right in windows:
        assert (bottom - top, right - left) == (16, 32)
        covered[top:bottom, left:right] = 1
    assert covered.all()


@pytest.mark.parametrize(("crop", "stride"), [((0, 8), (1, 1)), ((8, 8), (9, 4)), ((8, 8), (0, 4))])
def test_bad_crop_or_stride_is_a_clear_error(crop, stride):
    with pytest.raises(ValueError, match="stride <= crop"):
        slide_windows(32, 32, crop, stride)


def test_slide_with_window_covering_the_image_equals_whole():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 3, 5, padding=2)).eval()
    images = torch.randn(2, 3, 24, 40)
    whole = model(images).detach()
    for crop in [(24, 40), (64, 64)]:
        recorder = Recorder(model)
        slide = infer(recorder, images, 3, mode="slide", crop=crop, stride=(8, 8))
        assert recorder.calls == [(2, 3, 24, 40)]
        torch.testing.assert_close(slide, whole)


def test_slide_with_overlapping_windows_equals_whole_on_translation_equivariant_model():
    model = pointwise_head()
    images = torch.randn(2, 3, 50, 77)
    whole = model(images).detach()
    slide = infer(model, images, 5, mode="slide", crop=(16, 24), stride=(10, 13), crop_batch_size=3)
    torch.testing.assert_close(slide, whole, atol=1e-6, rtol=1e-6)


def test_overlaps_are_averaged_with_a_count_map():
    # Each crop returns a constant: the row index of its top edge (channel 0 of the image is the row index).
    rows = torch.arange(10.0).view(1, 1, 10, 1).expand(1, 3, 10, 6)

    def top_row(crops: Tensor) -> Tensor:
        return crops[:, :1, :1, :1].expand(-1, 1, crops.shape[2], crops.shape[3])

    out = infer(top_row, rows, 1, mode="slide", crop=(4, 6), stride=(3, 6))
    # Windows start at rows 0, 3, 6. Rows 0-2 see {0}, row 3 {0, 3}, rows 4-5 {3}, row 6 {3, 6}, rows 7-9 {6}.
    expected = torch.tensor([0, 0, 0, 1.5, 3, 3, 4.5, 6, 6, 6]).view(1, 1, 10, 1).expand(1, 1, 10, 6)
    torch.testing.assert_close(out, expected)


def test_slide_never_calls_the_model_on_more_than_crop_batch_size_crops():
    model = Recorder(pointwise_head(2))
    images = torch.randn(3, 3, 300, 500)  # many windows for a 1x1 model: 3 × 9 × 16 crops of 48 × 48
    out = infer(model, images, 2, mode="slide", crop=48, stride=32, crop_batch_size=4)
    assert out.shape == (3, 2, 300, 500)
    # ceil((300 - 48) / 32) + 1 = 9 rows and ceil((500 - 48) / 32) + 1 = 16 columns of windows per image.
    assert sum(call[0] for call in model.calls) == 3 * 9 * 16
    assert max(call[0] for call in model.calls) <= 4
    assert {call[1:] for call in model.calls} == {(3, 48, 48)}


def test_flip_tta_unflips_logits():
    # model(x) = x + column index; flip TTA gives ½(x + j) + ½(x + (W-1-j)) = x + (W-1)/2 everywhere.
    def add_columns(x: Tensor) -> Tensor:
        return x + torch.arange(x.shape[-1], dtype=x.dtype)

    images = torch.randn(2, 3, 6, 9)
    out = infer(add_columns, images, 3, flip=True)
    torch.testing.assert_close(out, images + 4.0)


def test_multiscale_tta_runs_each_scale_and_averages_at_input_size():
    # The model answers with its input height everywhere: scales 0.5, 1, 2 on H = 16 give 8, 16, 32.
    def height_of_input(x: Tensor) -> Tensor:
        return torch.full((x.shape[0], 2, *x.shape[-2:]), float(x.shape[-2]))

    recorder = Recorder(nn.Identity())
    images = torch.randn(1, 3, 16, 12)
    out = infer(lambda x: height_of_input(recorder(x)), images, 2, scales=(0.5, 1.0, 2.0))
    assert [call[-2:] for call in recorder.calls] == [(8, 6), (16, 12), (32, 24)]
    torch.testing.assert_close(out, torch.full((1, 2, 16, 12), 56 / 3))


def test_multiscale_slide_with_flip_matches_whole_on_pointwise_model():
    model = pointwise_head(3)
    images = torch.randn(1, 3, 40, 56)
    expected = infer(model, images, 3, scales=(0.75, 1.25), flip=True)
    out = infer(model, images, 3, mode="slide", crop=20, stride=12, scales=(0.75, 1.25), flip=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_wrong_logit_shape_and_mode_are_clear_errors():
    with pytest.raises(ValueError, match=r"expected \[1, 4, 8, 8\]"):
        infer(pointwise_head(3), torch.randn(1, 3, 8, 8), 4)
    with pytest.raises(ValueError, match="mode='tiles'"):
        infer(pointwise_head(3), torch.randn(1, 3, 8, 8), 3, mode="tiles")
    with pytest.raises(ValueError, match="needs crop"):
        infer(pointwise_head(3), torch.randn(1, 3, 8, 8), 3, mode="slide")
