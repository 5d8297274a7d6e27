"""Contradictory or unknown settings fail before training, naming the key and the valid choices."""

import pytest
from train_overrides import compose_config

from segattn.training.config_checks import check_config


def test_resume_and_init_from_together_are_refused(tmp_path):
    cfg = compose_config(["ckpt_path=last", "init_from=a.ckpt", f"paths.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="set only one"):
        check_config(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["inference.mode=tiles"], "expected one of whole, slide"),
        (["inference.mode=slide"], "inference.crop"),
    ],
)
def test_inference_mode_is_checked(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        check_config(compose_config([*overrides, f"paths.output_dir={tmp_path}"]))


def test_compile_with_a_torch_without_custom_operators_is_one_line(monkeypatch):
    import torch

    from segattn.training.run import check_compile_support

    check_compile_support()  # the pinned torch has them
    monkeypatch.delattr(torch.library, "custom_op")
    with pytest.raises(
        ValueError, match=r"model.compile=true needs torch 2.4 or later .* set model.compile=false"
    ):
        check_compile_support()
