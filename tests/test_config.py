"""conf/ is the single source of truth: params.yaml is its composition; bad keys fail clearly."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from elmolab.core.config import apply_overrides, check_config, load_params, section
from elmolab.core.errors import ElmolabError
from elmolab.core.params import CompositionError, check_params, compose_params, differing_keys
from elmolab.core.schema import SECTIONS, CorpusConfig, GridConfig, TaskConfig
from elmolab.data.tasks import check_task
from tests.conftest import expect_error

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def test_committed_params_yaml_is_the_composition_of_conf():
    committed = (ROOT / "params.yaml").read_text(encoding="utf-8")
    assert committed == compose_params(CONF), (
        "params.yaml differs from the composition of conf/: run `make params` and commit it"
    )


def test_make_run_checks_params_yaml_against_conf_and_names_the_keys_that_differ(tmp_path):
    """What ``make run`` checks first: the values of params.yaml (its comments aside) are conf/'s
    composition; else one line names the first keys that differ and the fix."""
    params = tmp_path / "params.yaml"
    params.write_text(compose_params(CONF) + "# a comment changes no value\n", encoding="utf-8")
    check_params(params, CONF)
    # What `dvc exp run -S probe.lr=0.01` leaves in the workspace.
    params.write_text(compose_params(CONF, ["probe.lr=0.01"]), encoding="utf-8")
    fix = "`make params` returns it to"
    expect_error(lambda: check_params(params, CONF), params, None, f"in probe.lr: {fix}")
    params.write_text(compose_params(CONF, ["experiment=smoke"]), encoding="utf-8")
    with pytest.raises(
        ElmolabError, match=rf"in corpus\.sources\.\w+, \S+, \S+ and \d+ more: {fix}"
    ):
        check_params(params, CONF)


def test_differing_keys_are_the_leaves_that_differ_in_the_composed_order():
    composed = {"seed": 1, "probe": {"lr": 0.1, "seeds": [1, 2]}, "corpus": {"a": {"path": "x"}}}
    written = {"corpus": {"a": None}, "probe": {"seeds": [1], "lr": 0.1}, "seed": 1, "extra": 2}
    assert differing_keys(written, composed) == ["probe.seeds", "corpus.a", "extra"]
    assert differing_keys(composed, composed) == []


def test_params_check_fails_in_one_line(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(compose_params(CONF).replace("seed: 1\n", "seed: 2\n", 1), encoding="utf-8")
    check = ["-m", "elmolab.core.params", "--check", "--conf", str(CONF), "--out", str(params)]
    proc = subprocess.run([sys.executable, *check], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert re.fullmatch(
        rf"error: {params}: differs from .* in seed: `make params` .*\n", proc.stderr
    )


def test_unknown_key_in_a_section_names_the_file_and_key(tmp_path):
    cfg = OmegaConf.create(yaml.safe_load(compose_params(CONF)))
    cfg.corpus.vocab_max_sise = 10
    with pytest.raises(ElmolabError, match=r"params.yaml: corpus.*vocab_max_sise"):
        section(cfg, "corpus", CorpusConfig)


def test_params_overrides_set_existing_keys_only(tmp_path):
    """A DVC cell's overrides are Hydra's value overrides on the composed file (as `dvc exp run
    -S` applies them): existing keys only, and no config group, which only Hydra composes."""
    params = tmp_path / "params.yaml"
    params.write_text(compose_params(CONF), encoding="utf-8")
    cfg = load_params(params)
    apply_overrides(cfg, ["corpus.vocab_min_count=7", "seed=3", "grid.seeds=[4,5]"], params)
    assert cfg.corpus.vocab_min_count == 7 and cfg.seed == 3 and list(cfg.grid.seeds) == [4, 5]
    apply_overrides(cfg, ["corpus.sources.brown=null"], params)  # a section set to null: off
    assert cfg.corpus.sources.brown is None
    with pytest.raises(ElmolabError, match=r"no key 'corpus\.nope'"):
        apply_overrides(cfg, ["corpus.nope=1"], params)
    with pytest.raises(ElmolabError, match="'corpus' is a section, composed into this file"):
        apply_overrides(cfg, ["corpus=nope"], params)
    with pytest.raises(ElmolabError, match=r"override 'seed=\[1'"):
        apply_overrides(cfg, ["seed=[1"], params)


@pytest.mark.parametrize(
    "preset", [None, *sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))]
)
def test_the_schema_mirrors_every_section_of_the_composed_config(preset):
    """Every preset composes; elmolab.core.schema has a schema for every top-level key of its
    composition, and params.yaml as written passes the check composition ran."""
    overrides = [] if preset is None else [f"experiment={preset}"]
    cfg = OmegaConf.create(yaml.safe_load(compose_params(CONF, overrides)))
    assert set(cfg) == set(SECTIONS)
    check_config(cfg, "params.yaml")


# What composing conf/ with probe.lr=abc says, wherever it composes (from the repository's root).
BAD_LR_PROBLEM = "probe.lr: expected a float, got 'abc'"
BAD_LR = f"conf/config.yaml with probe.lr=abc: {BAD_LR_PROBLEM}"


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("probe.lr=abc", "probe.lr: expected a float, got 'abc'"),
        ("grid.tasks.upos.mdl=maybe", "grid.tasks.upos.mdl: expected true or false, got 'maybe'"),
        ("seed=abc", "seed: expected an integer, got 'abc'"),
        # int | None: OmegaConf reads it as an optional integer
        ("corpus.vocab_max_size=many", "corpus.vocab_max_size: expected an integer, got 'many'"),
        ("probe.lrr=1", "probe.lrr: unknown key (elmolab/core/schema.py has no such setting)"),
        ("+probe.lrr=1", "probe.lrr: unknown key (elmolab/core/schema.py has no such setting)"),
        ("+extra=1", "extra: not a section of the configuration"),
        ("probe.lr=-1", "probe.lr must be positive, got -1.0"),  # the section's own check()
        (
            "grid.tasks.upos_control.control_of=upos_control",
            "grid.tasks.upos_control.control_of: 'upos_control' is a control task itself",
        ),
        ("taskmodel.unseen=maybe", "taskmodel.unseen: 'raise', 'keep' or null, not 'maybe'"),
        (
            "+controls.random.random_9=9",
            "controls.random.random_9: 'random_9' is not one of extract.encoders (trained, random,"
            " random_2, random_3, token_only, token_only_2, token_only_3)",
        ),
        (
            "+controls.token_layer.random=5",
            "controls.token_layer.random: 'random' is an instance of controls.random too",
        ),
        (
            "extract.encoders.random_2=elsewhere",
            "controls.random.random_2: extract.encoders.random_2 is 'elsewhere', not"
            " 'artifacts/bilm_random_2', the folder its stage writes",
        ),
        (
            "controls.random.random=one",
            "controls.random.random: Value 'one' of type 'str' could not be converted to Integer",
        ),
        ("probe=nope", "Could not find 'probe/nope'; Available options in 'probe': default"),
    ],
)
def test_composition_rejects_a_bad_setting_in_one_line(override, problem):
    with pytest.raises(CompositionError) as caught:
        compose_params(CONF, [override])
    line = str(caught.value)
    assert f"config.yaml with {override}: " in line and line.endswith(problem)
    assert "\n" not in line


def test_a_control_without_an_instance_is_rejected_in_one_line():
    overrides = [f"~controls.token_layer.{name}" for name in ("token_only", "token_only_2")]
    overrides.append("~controls.token_layer.token_only_3")
    with pytest.raises(CompositionError) as caught:
        compose_params(CONF, overrides)
    line = str(caught.value)
    assert line.endswith("controls.token_layer: no instance (name at least one encoder)")
    assert "\n" not in line


def test_make_params_fails_in_one_line_and_leaves_the_file(tmp_path):
    out = tmp_path / "params.yaml"
    out.write_text("before\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "elmolab.core.params", "probe.lr=abc", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert (proc.returncode, proc.stderr) == (2, f"error: {BAD_LR}\n")
    assert out.read_text(encoding="utf-8") == "before\n"
    assert os.listdir(tmp_path) == ["params.yaml"]  # no temporary left


def test_a_hydra_entry_point_fails_in_one_line_before_its_run_folder(tmp_path):
    """Hydra prints the line, then its own hint about HYDRA_FULL_ERROR; nothing is written."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "probe.py"), "probe.lr=abc"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[0] == f"{CONF}/config.yaml with probe.lr=abc: {BAD_LR_PROBLEM}"
    assert list(tmp_path.iterdir()) == []


def _dvc_repository(dest: Path) -> Path:
    """A git repository with what `dvc exp run -S` composes and reads: conf/, DVC's config,
    dvc.yaml, params.yaml, dvc.lock (no data: nothing may run)."""
    for name in ("conf", ".dvc/config", ".dvc/.gitignore", "dvc.yaml", "params.yaml", "dvc.lock"):
        source, target = ROOT / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    identity = ["-c", "user.name=elmolab tests", "-c", "user.email=tests@elmolab.invalid"]
    for args in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-q", "-m", "repository"]):
        subprocess.run(["git", *args], cwd=dest, check=True, capture_output=True)
    return dest


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry"])
def test_dvc_exp_run_with_a_bad_value_fails_in_one_line_and_changes_nothing(tmp_path, dry):
    """DVC composes conf/ in its own process, where the plugin of this checkout runs: one line,
    exit status 255, and the workspace as it was (params.yaml, dvc.lock, no artifacts/)."""
    repo = _dvc_repository(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),  # DVC's elmolab: this checkout's
        "DVC_NO_ANALYTICS": "1",
    }
    dvc = str(Path(sys.executable).parent / "dvc")
    args = [dvc, "exp", "run", *(["--dry"] if dry else []), "-S", "probe.lr=abc"]
    proc = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (255, f"ERROR: {BAD_LR}\n")
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True)
    assert status.stdout == b""
    for name in ("params.yaml", "dvc.lock"):
        assert (repo / name).read_bytes() == (ROOT / name).read_bytes()
    assert not (repo / "artifacts").exists()


def test_stage_reports_a_bad_key_in_one_line_without_traceback(tmp_path):
    params = tmp_path / "params.yaml"
    text = compose_params(CONF).replace("vocab_min_count:", "vocab_min_cnt:")
    params.write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "pipelines/prepare.py", "--params", str(params)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"error: {params}: corpus.vocab_min_cnt" in proc.stderr


@pytest.mark.parametrize(("preset", "on"), [("information", True), ("accuracy", False)])
def test_information_presets_set_both_measures_on_every_token_task(preset, on):
    """experiment=information turns the online code and conditional probing on for every token
    task of the grid, experiment=accuracy off: a token task added to the grid must be added to
    both presets, and the default grid must differ from both (or the presets change nothing)."""
    default = yaml.safe_load(compose_params(CONF))["grid"]["tasks"]
    tasks = yaml.safe_load(compose_params(CONF, [f"experiment={preset}"]))["grid"]["tasks"]
    assert set(tasks) == set(default)
    token = [name for name, task in tasks.items() if task["kind"] == "token"]
    assert token
    for name in token:
        assert (tasks[name]["mdl"], tasks[name]["conditional"]) == (on, on), name
    assert any((default[name]["mdl"], default[name]["conditional"]) != (on, on) for name in token)
    for name, task in tasks.items():  # the rest of every task as the default grid has it
        assert {k: v for k, v in task.items() if k not in ("mdl", "conditional")} == {
            k: v for k, v in default[name].items() if k not in ("mdl", "conditional")
        }


# The family of every task file: the report groups the layer claim by it.
FAMILIES = {
    "upos": "syntactic",
    "xpos": "syntactic",
    "chunk": "syntactic",
    "deplabel": "syntactic",
    "deparc": "syntactic",
    "structural": "syntactic",
    "upos_control": "control",
    "wsd": "semantic",
    "supersense": "semantic",
    "ner": "semantic",
    "ner_wnut17": "semantic",
}


@pytest.mark.parametrize("task", sorted(FAMILIES))
def test_every_task_file_names_its_family(task: str) -> None:
    path = CONF / "tasks" / f"{task}.yaml"
    node = OmegaConf.create({"paths": {"data": "data"}, "task": OmegaConf.load(path)})
    config = section(node, "task", TaskConfig)
    check_task(config)
    assert config.family == FAMILIES[task]


@pytest.mark.parametrize(("task", "control_of"), [("upos_control", None), ("upos", "xpos")])
def test_a_control_task_names_its_task_and_no_other_task_names_one(task, control_of) -> None:
    path = CONF / "tasks" / f"{task}.yaml"
    node = OmegaConf.load(path)
    node.control_of = control_of
    config = section(OmegaConf.create({"task": node}), "task", TaskConfig)
    problem = (
        f"task.control_of (conf/tasks/{task}.yaml): a control task (family control) names the"
        " task it controls, and no other task names one"
    )
    with pytest.raises(ElmolabError, match=re.escape(problem)):
        check_task(config)


def test_an_unknown_control_of_names_the_key_and_the_grids_tasks() -> None:
    cfg = OmegaConf.create(yaml.safe_load(compose_params(CONF)))
    cfg.grid.tasks.upos_control.control_of = "nope"
    grid = section(cfg, "grid", GridConfig)
    problem = "grid.tasks.upos_control.control_of: 'nope' is not a task of grid.tasks (upos, xpos,"
    with pytest.raises(ElmolabError, match=re.escape(problem)):
        grid.check()


def test_an_unknown_family_names_the_task_file_and_the_allowed_values() -> None:
    path = CONF / "tasks" / "upos.yaml"
    node = OmegaConf.load(path)
    node.family = "lexical"
    config = section(OmegaConf.create({"task": node}), "task", TaskConfig)
    problem = (
        "task.family (conf/tasks/upos.yaml): 'lexical' is not one of syntactic, semantic, control"
    )
    with pytest.raises(ElmolabError, match=re.escape(problem)):
        check_task(config)
    missing = OmegaConf.load(path)
    del missing["family"]
    with pytest.raises(ElmolabError, match="family"):
        section(OmegaConf.create({"task": missing}), "task", TaskConfig)
