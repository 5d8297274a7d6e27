"""segattn.files: a write that fails leaves the previous file and no temporary file; a shared cache's
writers keep each other's temporary files; nothing of Lightning, Hydra or torch is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from segattn.files import atomic_write, atomic_write_text, replacing, temp_files, write_json


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "metrics.json"
    atomic_write_text(path, "old\n")
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n" and temp_files(path) == []


def test_a_failing_writer_leaves_the_previous_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "model.yaml"
    atomic_write_text(path, "kept\n")

    def half_then_fail(handle) -> None:
        handle.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_then_fail)
    with pytest.raises(RuntimeError, match="export failed"), replacing(path) as temp:
        temp.write_text("half")
        raise RuntimeError("export failed")
    assert path.read_text() == "kept\n" and temp_files(path) == []


def test_a_sole_writer_clears_a_killed_writers_temporary_but_a_shared_one_does_not(tmp_path: Path) -> None:
    path = tmp_path / "image.npy"
    stale = tmp_path / ".image.npy.999.abcd.tmp"
    stale.write_bytes(b"partial")
    atomic_write(path, lambda handle: handle.write(b"a"), sole_writer=False)
    assert stale.exists()  # perhaps another process filling the same cache entry
    atomic_write(path, lambda handle: handle.write(b"b"))
    assert not stale.exists() and path.read_bytes() == b"b"


def test_importing_it_loads_no_framework() -> None:
    code = (
        "import sys, segattn.files; print(sorted({'torch', 'pytorch_lightning', 'hydra'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_json_is_standard_with_nan_and_infinity_written_as_null(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_json(path, {"final": {"mIoU": 51.2, "IoU": {"sky": float("nan")}}, "scores": (float("inf"), 1.0)})

    def reject(constant: str) -> None:
        raise AssertionError(f"{constant} is not standard JSON")

    loaded = json.loads(path.read_text(), parse_constant=reject)
    assert loaded == {"final": {"mIoU": 51.2, "IoU": {"sky": None}}, "scores": [None, 1.0]}
