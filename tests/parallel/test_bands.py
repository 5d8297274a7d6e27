"""Band geometry without processes: how an image height splits, what a halo needs, what is refused."""

from __future__ import annotations

import pytest
from band_workers import BAND_VARIANTS
from torch import nn

from segattn.attention import attention_class, available_attention, build_attention, check_band_variant
from segattn.parallel import Band, split_rows
from segattn.parallel.ops import window_halos


def test_bands_are_whole_stride_multiples_as_equal_as_possible():
    bands = split_rows(224, stride=32, bands=2, min_rows=3)  # 7 units: 4 + 3
    assert [(b.start, b.stop) for b in bands] == [(0, 128), (128, 224)]
    bands = split_rows(416, stride=32, bands=4, min_rows=3)  # 13 units: 4 + 3 + 3 + 3
    assert [b.rows for b in bands] == [128, 96, 96, 96] and bands[-1].stop == 416


def test_a_band_scales_to_coarser_grids_and_counts_the_whole_image():
    band = Band(128, 224, 224)
    assert band.at_stride(32) == Band(4, 7, 7)
    assert band.global_count(3 * 72) == 7 * 72  # 3 rows of 72 tokens on a 7-row grid
    with pytest.raises(ValueError, match="not multiples of 64"):
        band.at_stride(64)


def test_too_small_an_image_is_refused_with_the_rows_it_needs():
    with pytest.raises(ValueError, match=r"160 rows .* too small to split into 2 bands.* at least 192 rows"):
        split_rows(160, stride=32, bands=2, min_rows=3)


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "halos"),
    [(3, 1, 1, (1, 1)), (7, 4, 3, (3, 0)), (7, 2, 3, (3, 2)), (3, 2, 1, (1, 0)), (16, 16, 0, (0, 0))],
)
def test_halos_are_the_rows_a_window_reads_beyond_the_band(kernel, stride, padding, halos):
    assert window_halos(kernel, stride, padding, 1, 64, "conv2d") == halos


def test_a_window_whose_outputs_do_not_tile_the_bands_is_refused():
    with pytest.raises(ValueError, match="kernel 5, stride 1, padding 1"):
        window_halos(5, 1, 1, 1, 64, "conv2d")  # 'valid'-like: H - 2 outputs


def test_the_variants_with_a_band_form_are_the_documented_ones():
    assert {name for name in available_attention() if attention_class(name).band_parallel} == set(
        BAND_VARIANTS
    )


@pytest.mark.parametrize("name", sorted(set(available_attention()) - set(BAND_VARIANTS)))
def test_a_variant_without_a_band_form_is_refused_by_name(name):
    model = nn.Sequential(build_attention(name, 16, 2))
    with pytest.raises(ValueError) as error:
        check_band_variant(model)
    message = str(error.value)
    assert message.startswith(f"attention={name} cannot be split into bands")  # the setting, not a class
    assert "use attention=efficient, linear, taylor, flatten or performer" in message
