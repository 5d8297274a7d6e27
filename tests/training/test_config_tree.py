"""The composed config printed as a tree at the start of a run and kept in the run dir (config_tree.txt)."""

from __future__ import annotations

from train_overrides import compose_config

from segattn.training.rundir import config_tree, save_run_config


def test_the_tree_lists_the_groups_first_with_resolved_values(tmp_path, capsys):
    cfg = compose_config(
        [f"paths.log_dir={tmp_path}", f"paths.output_dir={tmp_path / 'run'}", "attention=linear"]
    )
    tree = config_tree(cfg)
    branches = [line[4:] for line in tree.splitlines() if line.startswith(("├── ", "└── "))]
    assert branches[:3] == ["data", "model", "attention"]  # the groups a reader looks for first
    assert "│   └── name: linear" in tree
    assert f"output_dir: {tmp_path / 'run'}" in tree  # interpolations resolved
    assert all(line == line.rstrip() for line in tree.splitlines())
    save_run_config(cfg, tmp_path / "run")
    assert capsys.readouterr().out == tree
    assert (tmp_path / "run" / "config_tree.txt").read_text() == tree
