"""Stages run under the project's .venv whichever `python` starts them (DVC runs the first on
PATH); without a .venv they stop with one line saying what to do."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"

needs_base_python = pytest.mark.skipif(
    not (BASE_PYTHON.is_file() and sys.prefix != sys.base_prefix),
    reason="needs the tests to run in a virtualenv whose base interpreter exists",
)


@needs_base_python
def test_a_stage_started_by_the_base_python_runs_under_the_venv(tmp_path):
    missing = tmp_path / "params.yaml"
    proc = subprocess.run(
        [str(BASE_PYTHON), str(ROOT / "pipelines" / "report.py"), "--params", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    # The stage itself answered (its config loader), not an ImportError.
    assert proc.returncode == 2, proc.stderr
    assert "no such params file" in proc.stderr and "Traceback" not in proc.stderr


@needs_base_python
def test_without_a_venv_a_stage_says_what_to_do(tmp_path):
    probe = subprocess.run([str(BASE_PYTHON), "-c", "import omegaconf"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("the base interpreter has the project's packages")
    (tmp_path / "pipelines").mkdir()
    for name in ("_venv.py", "report.py"):
        shutil.copy(ROOT / "pipelines" / name, tmp_path / "pipelines" / name)
    proc = subprocess.run(
        [str(BASE_PYTHON), str(tmp_path / "pipelines" / "report.py"), "--params", "p.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "make install" in lines[0] and "cannot import" in lines[0]
