"""slide_strips against infer(mode="slide"): the same logits bit for bit, for any strip height, resume row,
window geometry and flip TTA, with a model whose output depends on the whole window."""

from __future__ import annotations

import pytest
import torch

from segattn.inference.infer import infer
from segattn.inference.strips import slide_strips
from segattn.tiling import SlideSettings

SIZE = (301, 459)  # no window geometry below divides it


def window_model(x: torch.Tensor) -> torch.Tensor:
    """A convolution plus each window's mean: a crop seen in another window would get other logits."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 5, padding=2)
    return conv(x) + x.mean(dim=(1, 2, 3), keepdim=True)


@pytest.mark.parametrize(
    ("crop", "stride", "batch", "flip", "strip_rows"),
    [
        ((64, 64), (32, 32), 4, False, 32),
        ((64, 96), (40, 50), 3, True, 16),  # a batch straddles window rows
        ((500, 500), (250, 250), 2, True, 64),  # window larger than the image
        ((64, 64), (64, 64), 1, False, 48),
    ],
)
def test_strips_equal_in_memory_slide_and_resume_exactly(crop, stride, batch, flip, strip_rows):
    image = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = infer(window_model, image, 4, "slide", crop, stride, batch, flip=flip)[0]

        def read(window):
            top, bottom, left, right = window
            return image[0, :, top:bottom, left:right]

        for start in (0, strip_rows, 3 * strip_rows):
            settings = SlideSettings(crop, stride, batch, flip)
            strips = list(slide_strips(window_model, read, SIZE, 4, settings, strip_rows, start))
            assert all(strip.shape[1] == strip_rows for strip in strips[:-1])
            assert torch.equal(torch.cat(strips, dim=1), expected[:, start:])


def test_a_resume_row_between_strips_is_refused():
    with pytest.raises(ValueError, match="start_row=10, strip_rows=32; expected a multiple"):
        next(slide_strips(window_model, None, SIZE, 4, SlideSettings((64, 64), (32, 32)), 32, start_row=10))
