"""Atomic outputs and failpoints: a writer killed at any moment leaves the old output or the new
one, and the next writer of the same output removes what the dead one left."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elmolab.core.fsutil import atomic_dir, atomic_path, write_json

# A child process that starts writing ``target`` (a file or a folder) and is killed half-way.
KILLED_WRITER = """
import sys
from pathlib import Path
from elmolab.core.failpoints import failpoint
from elmolab.core.fsutil import atomic_dir, atomic_path

kind, target = sys.argv[1], Path(sys.argv[2])
if kind == "file":
    with atomic_path(target) as tmp:
        tmp.write_text("half of the new")
        failpoint("half_written")
else:
    with atomic_dir(target) as tmp:
        (tmp / "part").write_text("half of the new")
        failpoint("half_written")
"""


def _kill_a_writer(kind: str, target: Path) -> None:
    env = {**os.environ, "ELMOLAB_FAILPOINT": "half_written"}
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, kind, str(target)], env=env)
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_file_writer_leaves_the_old_file_and_the_next_one_cleans_up(
    tmp_path: Path,
) -> None:
    target = tmp_path / "metrics.json"
    write_json(target, {"old": 1})
    _kill_a_writer("file", target)
    assert target.read_text() == '{\n  "old": 1\n}\n'
    assert len(list(tmp_path.glob(".metrics.json.*.tmp"))) == 1
    write_json(target, {"new": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_killed_folder_writer_leaves_no_folder_and_the_next_one_cleans_up(
    tmp_path: Path,
) -> None:
    target = tmp_path / "features"
    _kill_a_writer("folder", target)
    assert not target.exists() and len(list(tmp_path.glob(".features.*.tmp"))) == 1
    with atomic_dir(target) as tmp:
        (tmp / "part").write_text("all of it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features"]
    assert (target / "part").read_text() == "all of it"


def test_an_error_inside_leaves_the_old_output_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("new")
        raise RuntimeError("stage failed")
    assert target.read_text() == "old" and sorted(tmp_path.iterdir()) == [target]


def test_other_outputs_temporaries_are_left_alone(tmp_path: Path) -> None:
    other = tmp_path / ".other.json.abc.tmp"
    other.write_text("someone else's")
    write_json(tmp_path / "metrics.json", {})
    assert other.exists()


def test_a_failpoint_fires_on_its_nth_hit_only(tmp_path: Path) -> None:
    script = "from elmolab.core.failpoints import failpoint\nfor i in range(5):\n"
    script += "    print(i, flush=True)\n    failpoint('loop')\n"
    env = {**os.environ, "ELMOLAB_FAILPOINT": "loop:3"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL and proc.stdout.split() == ["0", "1", "2"]
    env["ELMOLAB_FAILPOINT"] = "elsewhere"
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["0", "1", "2", "3", "4"]
