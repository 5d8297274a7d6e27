"""The arms of an accuracy table read from its experiment file (segattn/bench/arms.py)."""

import pytest

from segattn.bench.arms import experiment_table, spec_overrides

ROOT = ["data.root=../shared/data/idrid"]  # composing does not read the folder


def test_the_idrid_resolution_table_keeps_the_field_of_view_of_every_arm():
    table = experiment_table("idrid_resolution_cpu", ROOT)
    assert table is not None and table.seeds == [0, 1]
    assert [arm.label for arm in table.arms] == ["linear", "linear-x2", "linear-x4", "flatten", "sra"]
    for arm in table.arms:
        factor = arm.options.get("data.downsample", 1)
        crop = arm.options.get("data.crop_size", [512, 512])
        stride = arm.options.get("inference.stride", [384, 384])
        assert [side * factor for side in crop] == [512, 512]  # 512 native pixels of view in every arm
        assert [4 * s for s in stride] == [3 * side for side in crop]  # the same overlap fraction
    overrides = spec_overrides(table.arms[1])
    assert overrides[0] == "attention=linear" and "data.downsample=2" in overrides


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
    arms. The labels, their order and each run's overrides are those of the list the file replaced."""
    table = experiment_table(experiment, ROOT)
    assert table is not None and table.seeds == [0, 1]
    assert {arm.label: spec_overrides(arm) for arm in table.arms} == IDRID_CPU_ARMS
    assert [arm.label for arm in table.arms] == list(IDRID_CPU_ARMS)


def test_the_idrid_tables_do_not_leak_into_the_experiments_built_on_the_same_recipe():
    """idrid_gpu_whole builds on idrid_cpu's recipe, not on its arms: Hydra would merge both tables."""
    assert experiment_table("idrid_cpu_recipe", ROOT) is None
    labels = [arm.label for arm in experiment_table("idrid_gpu_whole", ROOT).arms]
    assert not set(labels) & set(IDRID_CPU_ARMS)


def test_arms_selects_by_label_in_the_table_order_and_refuses_an_unknown_one():
    table = experiment_table("idrid_resolution_cpu", ROOT)
    assert [arm.label for arm in table.select(["sra", "linear"], "x")] == ["linear", "sra"]
    assert table.select(None, "x") == table.arms
    with pytest.raises(ValueError, match="arms=nosuch: not an arm of experiment x; expected among linear, "):
        table.select(["linear", "nosuch"], "x")


def test_an_experiment_without_a_table_has_none():
    assert experiment_table("accuracy_smoke", []) is None


@pytest.mark.parametrize(
    ("arm", "message"),
    [
        ('["attention=nosuch"]', "table.arms.bad: attention=nosuch; expected one of"),
        ('["data.downsample=2"]', "table.arms.bad: attention=None; expected one of"),
        ('["attention"]', "table.arms.bad: 'attention' is not key=value"),
    ],
)
def test_a_bad_arm_is_one_line_naming_it(arm, message):
    with pytest.raises(ValueError, match="experiment idrid_resolution_cpu: " + message.replace("(", r"\(")):
        experiment_table("idrid_resolution_cpu", [*ROOT, f"+table.arms.bad={arm}"])
