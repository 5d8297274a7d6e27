"""The arms of the accuracy studies, files under conf/experiment/arms/<study>/ that the experiment's
``hydra.sweeper.params`` sweep (``train.py -m experiment=<study>``): each composes the run it always did."""

import pytest
from omegaconf import OmegaConf

from segattn.cli import compose_command

ROOT = ["data.root=../shared/data/idrid"]  # composing does not read the folder


def sweep(experiment: str) -> tuple[str, list[str], list[str]]:
    """The arms folder, arms and seeds the experiment's sweep lists."""
    cfg = compose_command("train", [f"experiment={experiment}", *ROOT], keep_hydra=True)
    (folder, arms), (_, seeds) = cfg.hydra.sweeper.params.items()
    return folder.removeprefix("+"), arms.split(","), seeds.split(",")


def arm(experiment: str, label: str, *overrides: str):
    folder, _, _ = sweep(experiment)
    return compose_command("train", [f"experiment={experiment}", *ROOT, f"+{folder}={label}", *overrides])


def test_the_idrid_resolution_table_keeps_the_field_of_view_of_every_arm():
    folder, arms, seeds = sweep("idrid_resolution_cpu")
    assert folder == "experiment/arms/idrid_resolution_cpu" and seeds == ["0", "1"]
    assert arms == ["linear", "linear-x2", "linear-x4", "flatten", "sra"]
    for label in arms:
        cfg = arm("idrid_resolution_cpu", label)
        factor, crop, stride = cfg.data.downsample, list(cfg.data.crop_size), list(cfg.inference.stride)
        assert [side * factor for side in crop] == [512, 512]  # 512 native pixels of view in every arm
        assert [4 * s for s in stride] == [3 * side for side in crop]  # the same overlap fraction
        assert cfg.run_name == label
    assert arm("idrid_resolution_cpu", "linear-x2").attention.name == "linear"


# The overrides the Python list of arms (IDRID_ARMS, gone since issue 33) gave each arm of the table in
# docs/idrid/, computed once from its spec strings with spec_overrides: the experiment file must train
# exactly these runs.
IDRID_CPU_ARMS = {
    "flatten": ["attention=flatten"],
    "flatten-x2": ["attention=flatten", "data.downsample=2"],
    "flatten-x4": ["attention=flatten", "data.downsample=4"],
    "flatten-x8": ["attention=flatten", "data.downsample=8"],
    "sra": ["attention=sra"],
    "softmax-320": [
        "attention=softmax",
        "data.crop_size=[320, 320]",
        "inference.crop=[320, 320]",
        "inference.stride=[320, 320]",
        "model.sr_ratios=[1, 1, 1, 1]",
    ],
    "linear": ["attention=linear"],
    "efficientvit-litemla": ["attention=litemla", "model=efficientvit"],
}


@pytest.mark.parametrize("experiment", ["idrid_cpu", "idrid_gpu"])
def test_the_idrid_table_trains_the_runs_the_old_list_of_arms_did(experiment):
    """idrid_cpu made docs/idrid/ (its runs' names are these labels); idrid_gpu, built on it, had the same
    arms. The labels, their order and each run's config are those of the list the files replaced."""
    _, arms, seeds = sweep(experiment)
    assert arms == list(IDRID_CPU_ARMS) and seeds == ["0", "1"]
    for label, overrides in IDRID_CPU_ARMS.items():
        by_file, by_overrides = arm(experiment, label), arm(experiment, "flatten", *overrides)
        by_overrides.run_name = label
        assert OmegaConf.to_container(by_file) == OmegaConf.to_container(by_overrides), label


def test_the_idrid_tables_do_not_leak_into_the_experiments_built_on_the_same_recipe():
    """idrid_gpu_whole builds on idrid_cpu's recipe, not on its arms: Hydra would merge both sweeps."""
    recipe = compose_command("train", ["experiment=idrid_cpu_recipe", *ROOT], keep_hydra=True)
    assert not recipe.hydra.sweeper.params
    _, arms, _ = sweep("idrid_gpu_whole")
    assert arms == ["A-linear-full", "B-linear-x4-equal-time", "C-linear-x4-equal-epochs", "sra-full"]
    assert not set(arms) & set(IDRID_CPU_ARMS)


@pytest.mark.parametrize("experiment", ["accuracy_camvid_cpu", "accuracy_camvid_gpu", "accuracy_smoke"])
def test_every_camvid_arm_composes_with_its_attention(experiment):
    """softmax-full is softmax without key reduction; a fixed-size arm (linformer) slides its training crop at
    that window's own stride, not the preset's wider one."""
    _, arms, _ = sweep(experiment)
    for label in arms:
        cfg = arm(experiment, label)
        assert cfg.run_name == label and label.startswith(cfg.attention.name.split("-")[0])
    if experiment == "accuracy_camvid_cpu":
        assert list(arm(experiment, "softmax-full").model.sr_ratios) == [1, 1, 1, 1]
        linformer = arm(experiment, "linformer-1024")
        assert linformer.attention.options.max_tokens == 1024
        assert (linformer.inference.mode, linformer.inference.stride) == ("slide", None)
        assert linformer.inference.crop == linformer.data.crop_size
