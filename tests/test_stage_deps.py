"""dvc.yaml's code deps are each stage's import closure (tools/stage_deps.py): a module a stage runs
but does not list would not re-run the stage when it changes, and a listed module it does not run
re-runs it for nothing."""

import os
import subprocess
import sys
from pathlib import Path

import yaml
from dvc.repo import Repo

from tools.stage_deps import closure, minimal_deps, problems

ROOT = Path(__file__).resolve().parents[1]
CONTROL_STAGES = ("pretrain_random", "token_control")  # a stage per instance of a control


def test_every_stage_lists_the_code_it_runs_and_no_more() -> None:
    assert problems(ROOT / "dvc.yaml") == []


def test_each_control_instance_is_a_stage_and_every_encoder_is_extracted_and_probed() -> None:
    """pretrain_random@<name> and token_control@<name> for each instance of ``controls``, each
    writing the folder ``extract.encoders.<name>`` names; every extract stage reads every encoder
    and writes its features; every probe cell reads the features of every probed encoder."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    encoders = params["extract"]["encoders"]
    with Repo(str(ROOT)) as repo:
        stages = {stage.addressing: stage for stage in repo.index.stages}
    instances = []
    for control, name in (("random", "pretrain_random"), ("token_layer", "token_control")):
        for instance in params["controls"][control]:
            stage = stages[f"{name}@{instance}"]
            instances.append(stage.addressing)
            assert stage.cmd.endswith(f" {instance}")
            outs = {out.def_path for out in stage.outs}
            assert {f"{encoders[instance]}/{f}" for f in ("options.json", "weights.hdf5")} <= outs
    assert sorted(instances) == sorted(a for a in stages if a.split("@")[0] in CONTROL_STAGES)
    assert len(instances) == 6  # three instances of each control
    for dataset in params["extract"]["datasets"]:
        stage = stages[f"extract@{dataset}"]
        deps = {dep.def_path for dep in stage.deps}
        outs = {out.def_path for out in stage.outs}
        for encoder, folder in encoders.items():
            assert f"{folder}/weights.hdf5" in deps and f"{folder}/options.json" in deps
            assert f"artifacts/features/{encoder}/{dataset}" in outs
    for task, config in params["grid"]["tasks"].items():
        deps = {dep.def_path for dep in stages[f"probe@{task}"].deps}
        for encoder in params["probe"]["encoders"]:
            for role in ("train", "dev", "test"):
                assert f"artifacts/features/{encoder}/{config[role]}.hdf5" in deps, (task, encoder)


def _dvc_yaml_with(tmp_path: Path, stage: str, remove: str = "", add: str = "") -> Path:
    """A copy of dvc.yaml with ``remove`` taken from and ``add`` added to ``stage``'s deps (a
    foreach stage's template)."""
    config = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    body = config["stages"][stage].get("do", config["stages"][stage])
    if remove:
        body["deps"].remove(remove)
    if add:
        body["deps"].append(add)
    path = tmp_path / "dvc.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def test_a_module_missing_from_a_stage_is_named(tmp_path: Path) -> None:
    dvc_yaml = _dvc_yaml_with(tmp_path, "probe", remove="src/elmolab/core/tracking.py")
    assert problems(dvc_yaml) == [
        "stage probe@*: imports src/elmolab/core/tracking.py, not in dvc.yaml deps"
    ]


def test_a_folder_covers_what_it_holds_package_data_included(tmp_path: Path) -> None:
    found = problems(_dvc_yaml_with(tmp_path, "report", remove="src/elmolab/report"))
    assert "stage report: imports src/elmolab/report/build.py, not in dvc.yaml deps" in found
    assert "stage report: imports src/elmolab/report/templates/report.md, not in dvc.yaml deps" in (
        found
    )
    assert all(line.startswith("stage report: imports src/elmolab/report/") for line in found)


def test_a_code_dep_the_stage_does_not_run_is_named_data_is_not(tmp_path: Path) -> None:
    dvc_yaml = _dvc_yaml_with(tmp_path, "report", add="src/elmolab/training")
    assert problems(dvc_yaml) == [
        "stage report: lists src/elmolab/training, which it does not import"
    ]
    assert problems(_dvc_yaml_with(tmp_path, "report", add="data/corpus")) == []


def test_the_closure_follows_every_import_that_can_run(tmp_path: Path) -> None:
    """Top-level and in functions, relative, ``from package import submodule``, the packages on
    the way and their data; not what only a type checker reads, nor a package's ``__getattr__``
    unless a name it provides is imported."""
    files = {
        "pyproject.toml": '[tool.setuptools.package-data]\n"elmolab.pkg" = ["data/*.txt"]\n',
        "pipelines/run.py": "import _helper\nfrom elmolab.a import f\n",
        "pipelines/_helper.py": "import os\n",
        "pipelines/lazy_user.py": "from elmolab import Name\n",
        "src/elmolab/__init__.py": (
            "from typing import TYPE_CHECKING\n\n"
            "if TYPE_CHECKING:\n    from elmolab import typed\n\n"
            "def __getattr__(name):\n    from elmolab import lazy\n\n    return lazy.Name\n"
        ),
        "src/elmolab/a.py": "import torch\n\n\ndef f():\n    from .pkg import sub\n",
        "src/elmolab/pkg/__init__.py": "",
        "src/elmolab/pkg/sub.py": "from ..b import g\n",
        "src/elmolab/pkg/data/table.txt": "",
        "src/elmolab/b.py": "",
        "src/elmolab/typed.py": "",
        "src/elmolab/lazy.py": "",
        "src/elmolab/unused.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    found = closure("pipelines/run.py", tmp_path)
    assert found == {
        "pipelines/run.py",
        "pipelines/_helper.py",
        "src/elmolab/__init__.py",
        "src/elmolab/a.py",
        "src/elmolab/b.py",
        "src/elmolab/pkg/__init__.py",
        "src/elmolab/pkg/sub.py",
        "src/elmolab/pkg/data/table.txt",
    }
    assert minimal_deps(found, tmp_path) == [
        "pipelines/_helper.py",
        "pipelines/run.py",
        "src/elmolab/__init__.py",
        "src/elmolab/a.py",
        "src/elmolab/b.py",
        "src/elmolab/pkg",  # all of it
    ]
    assert "src/elmolab/lazy.py" in closure("pipelines/lazy_user.py", tmp_path)


def test_the_report_stage_loads_no_torch() -> None:
    """It reads the polysemy table (elmolab.io.polysemy) and the feature modes' names
    (elmolab.io.results) without the model code that computes them."""
    check = "import sys, elmolab.stages.report; sys.exit('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    assert subprocess.run([sys.executable, "-c", check], env=env).returncode == 0


def test_the_tool_prints_a_stages_deps() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "stage_deps.py"), "probe@*"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("probe@*:\n  - pipelines/_venv.py\n  - pipelines/probe.py\n")
    assert "  - src/elmolab/probing\n" in result.stdout
