"""The stages that use every core alone (pretrain, extract) let idle OpenMP threads spin: the
variable is set before torch loads (OpenMP reads it then), an explicit setting wins, and the
probe stage (one thread per forked worker) keeps OpenMP's default."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "pipelines"

# What a stage does first: its two guard imports, then torch, reporting what OpenMP will read.
SCRIPT = """
import sys
sys.path.insert(0, {pipelines!r})
import _venv, _wait_policy, os
before_torch = "torch" in sys.modules
import torch
print(before_torch, os.environ.get("OMP_WAIT_POLICY", "unset"))
"""


def _policy(env_value: str | None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(pipelines=str(PIPELINES))],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    torch_loaded, policy = proc.stdout.split()
    return torch_loaded, policy


@pytest.mark.parametrize(("env_value", "expected"), [(None, "ACTIVE"), ("PASSIVE", "PASSIVE")])
def test_the_policy_is_set_before_torch_loads_and_an_explicit_one_wins(env_value, expected):
    assert _policy(env_value) == ("False", expected)


def _first_imports(script: Path) -> list[str]:
    names = []
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


@pytest.mark.parametrize("stage", ["pretrain", "extract"])
def test_the_compute_stages_choose_it_before_any_project_import(stage):
    imports = [n for n in _first_imports(PIPELINES / f"{stage}.py") if n not in ("sys", "pathlib")]
    assert imports[:2] == ["_venv", "_wait_policy"]


@pytest.mark.parametrize("stage", ["probe", "prepare", "report", "token_control"])
def test_the_other_stages_keep_openmps_default(stage):
    assert "_wait_policy" not in _first_imports(PIPELINES / f"{stage}.py")
