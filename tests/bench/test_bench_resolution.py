"""bench accuracy's arms beyond attention options (run overrides, labels) and its average-precision
report: the per-class tables and the AP-against-scale plot, from run rows without training."""

from __future__ import annotations

from pathlib import Path

from segattn.bench.accuracy import AccuracySettings
from segattn.bench.accuracy_table import markdown, summarize
from segattn.bench.arms import run_overrides, spec_overrides
from segattn.bench.costs import arm_recipe
from segattn.bench.resolution import plot_resolution
from segattn.bench.specs import spec_of

PNG = b"\x89PNG\r\n\x1a\n"


def test_arms_pass_config_keys_and_groups_as_plain_overrides():
    arm = spec_of(
        {"name": "softmax", "label": "softmax-320", "sr_ratios": [1, 1, 1, 1], "data.crop_size": [320, 320]}
    )
    assert arm.label == "softmax-320" and "label" not in arm.options
    assert run_overrides(arm) == ["data.crop_size=[320, 320]"]
    assert spec_overrides(arm) == [
        "attention=softmax",
        "data.crop_size=[320, 320]",
        "model.sr_ratios=[1, 1, 1, 1]",
    ]
    assert spec_overrides(spec_of({"name": "litemla", "model": "efficientvit"})) == [
        "attention=litemla",
        "model=efficientvit",
    ]
    # a fixed-size arm slides its training crop at that window's own stride, not the preset's wider one
    assert spec_overrides(spec_of({"name": "linformer", "max_tokens": 1024}))[-3:] == [
        "inference.mode=slide",
        "inference.crop=${data.crop_size}",
        "inference.stride=null",
    ]


def test_an_arm_recipe_is_the_experiment_under_its_overrides():
    settings = AccuracySettings("idrid_cpu", [], [0], ["data.root=/nowhere"])
    arm = {"name": "softmax", "label": "s", "sr_ratios": [1, 1, 1, 1], "data.crop_size": [320, 320]}
    recipe, spec = arm_recipe(settings, spec_of(arm))
    assert (recipe.model.name, recipe.batch, recipe.crop) == ("pvt", 2, 320)
    assert spec.options == {"sr_ratios": [1, 1, 1, 1]} and spec.label == "s"
    recipe, _ = arm_recipe(settings, spec_of({"name": "litemla", "model": "efficientvit"}))
    assert recipe.model.name == "efficientvit"


def run_row(variant: str, seed: int, ap: float) -> dict:
    return {
        "variant": variant, "seed": seed, "status": "ok", "test_mIoU": 40.0 + seed, "test_mAcc": 50.0,
        "test_mAP": ap, "monitor": "val/mAP", "train_seconds": 600.0,
        "test_AP_microaneurysms": ap / 2, "test_AP_haemorrhages": ap, "test_IoU_microaneurysms": 5.0,
    }  # fmt: skip


def test_average_precision_tables_and_resolution_plot(tmp_path: Path):
    x4 = {"name": "flatten", "label": "flatten-x4", "data.downsample": 4}
    variants = [spec_of(value) for value in ["flatten", x4, "sra"]]
    runs = [run_row("flatten", s, 30.0 + s) for s in (0, 1)] + [run_row("flatten-x4", 0, 20.0)]
    runs.append(run_row("sra", 0, float("nan")) | {"test_AP_haemorrhages": float("nan")})
    table = summarize(runs, {"flatten": {"step_seconds": 0.6, "peak_bytes": 2**30}}, variants)
    flatten = table[0]
    assert (flatten["test_mAP_mean"], round(flatten["test_mAP_std"], 3)) == (30.5, 0.707)
    assert flatten["test_AP_microaneurysms_mean"] == 15.25 and table[1]["downsample"] == 4
    assert table[2]["test_AP_haemorrhages_mean"] is None  # NaN runs are left out of means
    text = markdown(table, "not measured")
    ap_table, iou_table = text.split("\n\n")
    assert ap_table.splitlines()[0].startswith("| arm | test mAP (mean ± std) | runs | AP microaneurysms |")
    assert (
        "| `flatten` | 30.50 ± 0.71 | 30.00 31.00 | 15.25 | 30.50 | 40.50 | 600 ms | 1 GiB | 10.00 |"
        in ap_table
    )
    assert iou_table.splitlines()[2] == "| `flatten` | 5.00 |"
    plot_resolution(table, tmp_path / "resolution.png", "test")
    assert (tmp_path / "resolution.png").read_bytes()[:8] == PNG


def test_runs_that_tested_their_final_weights_get_a_column_for_it():
    variants = [spec_of("linear")]
    runs = [run_row("linear", s, 30.0 + s) | {"test_last_mAP": 20.0 + s} for s in (0, 1)]
    table = summarize(runs, {}, variants)
    assert table[0]["test_last_mAP_mean"] == 20.5
    header, _, row = markdown(table, "not measured").split("\n\n")[0].splitlines()[:3]
    assert header.startswith("| arm | test mAP (mean ± std) | runs | final weights' mAP | AP microaneurysms")
    assert row.startswith("| `linear` | 30.50 ± 0.71 | 30.00 31.00 | 20.50 | 15.25 |")
