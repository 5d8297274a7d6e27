"""The W&B validation panel's masks line up with its images."""

import numpy as np
import torch

from segattn.training.callbacks import at_image_size


def test_panel_masks_are_at_the_panel_image_size_when_masks_are_larger_than_images():
    """data.downsample=2: the image is 3x4, its mask 6x8; the panel keeps image[::1, ::1] and the mask
    pixel under each image pixel's centre."""
    mask = torch.arange(48).view(6, 8)
    labels = at_image_size(mask, (3, 4), step=1)
    assert labels.shape == (3, 4) and labels.dtype == np.int64
    np.testing.assert_array_equal(labels, mask[1::2, 1::2].numpy())


def test_panel_masks_of_images_of_their_size_are_subsampled_as_the_image():
    mask = torch.arange(30).view(5, 6)
    np.testing.assert_array_equal(at_image_size(mask, (5, 6), step=2), mask[::2, ::2].numpy())
