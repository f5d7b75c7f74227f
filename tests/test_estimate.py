"""What `make run` says before the study: the estimate's figures, the stages DVC will run (a real
DVC project), and the block itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import expect_error
from dvc.repo import Repo
from omegaconf import OmegaConf

from elmolab.core.hardware import choose_precision
from elmolab.launch.estimate import (
    NATIVE_BF16_MINUTES,
    NATIVE_BF16_STUDY_MINUTES,
    NO_BF16_STUDY_MINUTES,
    Machine,
    estimate,
    main,
    params_differences,
    section_digest,
    stage_minutes,
    stages_to_run,
    stale_sections,
    summary,
)

ROOT = Path(__file__).resolve().parents[1]
STUDY = [stage for group in NATIVE_BF16_MINUTES for stage in group]
WITH_BF16 = Machine("AMD EPYC (family 26, model 2)", 2, ("avx512_bf16",), None)
WITHOUT_BF16 = Machine("AMD EPYC (family 25, model 1)", 2, (), None)


def test_every_stage_but_the_later_control_instances_has_a_figure() -> None:
    """The measured run had one instance of each control: the others are counted as unmeasured
    until a run measures them."""
    with Repo(str(ROOT)) as repo:
        pipeline = {stage.addressing for stage in repo.index.stages if stage.cmd}
    assert pipeline - set(STUDY) == {
        "pretrain_random@random_2",
        "pretrain_random@random_3",
        "token_control@token_only_2",
        "token_control@token_only_3",
    }
    assert set(STUDY) <= pipeline


def test_the_figures_add_up_to_the_measured_studies() -> None:
    assert stage_minutes(STUDY, True) == (pytest.approx(NATIVE_BF16_STUDY_MINUTES, abs=0.2), [])
    assert stage_minutes(STUDY, False) == (pytest.approx(NO_BF16_STUDY_MINUTES, abs=1.0), [])
    # without native bf16 pretraining slows down 7.7x, the other stages less
    alone, _ = stage_minutes(["pretrain"], False)
    assert alone == pytest.approx(9.7 * 7.7)
    assert stage_minutes(["polysemy"], True) == stage_minutes(["polysemy", "report"], True)


def test_the_estimate_by_machine_and_stages() -> None:
    assert estimate(WITH_BF16, STUDY, []).startswith("about 40 min, ")
    without = estimate(WITHOUT_BF16, STUDY, [])
    assert without.startswith("about 3.0 h: an estimate for a 2-core CPU without native bf16")
    assert "pretraining about 7.7x slower" in without
    assert estimate(WITH_BF16, ["report", "polysemy"], []).startswith("under a minute")
    assert estimate(WITH_BF16, ["probe@upos", "extract_external@elmo"], []) == (
        "about 1 min, scaled from the default study's 40.4 min measured on a 2-core AMD EPYC "
        "with native bf16; not counted, without a measured figure: extract_external@elmo "
        "(docs/results.md)"
    )
    gpu = Machine("AMD EPYC (family 25, model 1)", 16, (), "NVIDIA H100")
    assert estimate(gpu, STUDY, []) == (
        "none: no measured figure exists for a machine with a GPU (NVIDIA H100)"
    )
    assert estimate(WITH_BF16, STUDY, ["pretrain", "grid"]).startswith(
        "none: params.yaml differs from the default study (in pretrain, grid)"
    )
    assert estimate(WITH_BF16, [], []) == "nothing to run: every stage is up to date"
    external = [f"probe_external@elmo-{n}" for n in range(8)]
    assert estimate(WITH_BF16, external, []) == (
        "none: no measured figure for " + ", ".join(external[:6]) + " and 2 more"
    )
    assert estimate(WITH_BF16, ["d"], []) == "none: no measured figure for d"


def _project(root: Path) -> None:
    """``root`` as a DVC project (no git): a -> b -> c in a chain, and d on its own."""
    stages = {
        "a": ("a.in", "a.out"),
        "b": ("a.out", "b.out"),
        "c": ("b.out", "c.out"),
        "d": ("d.in", "d.out"),
    }
    pipeline = {
        name: {"cmd": f"cp {dep} {out}", "deps": [dep], "outs": [out]}
        for name, (dep, out) in stages.items()
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": pipeline}), encoding="utf-8")
    (root / "a.in").write_text("1\n", encoding="utf-8")
    (root / "d.in").write_text("1\n", encoding="utf-8")
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    Repo.init(str(root), no_scm=True)


def _repro(root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dvc", "repro", "-q"], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_dvc_runs_the_changed_stages_and_every_stage_downstream(tmp_path: Path) -> None:
    _project(tmp_path)
    assert stages_to_run(tmp_path) == (["a", "b", "c", "d"], 4)
    _repro(tmp_path)
    assert stages_to_run(tmp_path) == ([], 4)
    # DVC's status names a alone: b and c change only once a has run
    (tmp_path / "a.in").write_text("2\n", encoding="utf-8")
    assert stages_to_run(tmp_path) == (["a", "b", "c"], 4)


def test_params_differences_name_the_sections() -> None:
    cfg = OmegaConf.load(ROOT / "params.yaml")
    assert params_differences(cfg, ROOT / "conf") == []
    cfg.pretrain.max_steps = 10
    del cfg.polysemy
    assert params_differences(cfg, ROOT / "conf") == ["pretrain", "polysemy"]


def test_the_block_before_the_study(tmp_path: Path, monkeypatch, capsys) -> None:
    _project(tmp_path)
    _repro(tmp_path)
    (tmp_path / "d.in").write_text("2\n", encoding="utf-8")
    machine = Machine.this_one()
    lines = summary(tmp_path, tmp_path / "params.yaml", ROOT / "conf", machine)
    pretraining = choose_precision("auto", "cpu")
    assert lines[0] == f"this machine: {machine.describe()}"
    assert lines[1] == (
        f"precision: pretraining {pretraining.precision}, probes {pretraining.precision} "
        f"({pretraining.reason})"
    )
    assert lines[2] == "stages to run: 1 of 4 (d)"
    stale = stale_sections(ROOT / "conf")
    assert lines[3] == f"estimated time: {estimate(machine, ['d'], [], stale)}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["estimate", "--conf", str(ROOT / "conf")])
    main()
    assert capsys.readouterr().out.splitlines() == ["Before the study:", *(f"  {x}" for x in lines)]


def test_a_missing_params_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "params.yaml"
    expect_error(
        lambda: summary(tmp_path, missing, ROOT / "conf", WITH_BF16),
        missing,
        None,
        "no such params file",
    )


def test_outside_a_dvc_project_every_stage_is_counted(tmp_path: Path) -> None:
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    lines = summary(tmp_path, tmp_path / "params.yaml", ROOT / "conf", WITH_BF16)
    assert lines[2].startswith("stages to run: DVC could not tell (NotDvcRepoError: ")
    # today's default is not the study whose stage times were measured
    assert lines[3].startswith("estimated time: none: the default study has changed since")


def test_a_default_that_is_not_the_measured_study_gets_no_figure() -> None:
    """The figures describe one composition (MEASURED_SECTIONS); a default that differs in a
    section, or has a section the measured one lacked, is another study."""
    assert stale_sections(ROOT / "conf") == ["extract", "controls", "probe", "grid", "taskmodel"]
    line = estimate(WITH_BF16, STUDY, [], ["grid", "taskmodel"])
    assert line == (
        "none: the default study has changed since its stage times were measured (in grid,"
        " taskmodel); its next uninterrupted run gives new figures (docs/results.md)"
    )
    assert section_digest({"b": 1, "a": [2]}) == section_digest({"a": [2], "b": 1})
