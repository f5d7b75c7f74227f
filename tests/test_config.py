"""conf/ is the single source of truth: params.yaml is its composition; bad keys fail clearly."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from elmolab.config import apply_overrides, load_params, section
from elmolab.errors import ElmolabError
from elmolab.params import compose_params
from elmolab.probing.tasks import check_task
from elmolab.schema import SECTIONS, CorpusConfig, TaskConfig

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def test_committed_params_yaml_is_the_composition_of_conf():
    committed = (ROOT / "params.yaml").read_text(encoding="utf-8")
    assert committed == compose_params(CONF), (
        "params.yaml differs from the composition of conf/: run `make params` and commit it"
    )


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_preset_composes_and_validates(preset):
    cfg = OmegaConf.create(yaml.safe_load(compose_params(CONF, [f"experiment={preset}"])))
    section(cfg, "corpus", CorpusConfig)


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
    """elmolab.schema has a schema for every top-level key of every preset's composition, and
    each section validates against it."""
    overrides = [] if preset is None else [f"experiment={preset}"]
    cfg = OmegaConf.create(yaml.safe_load(compose_params(CONF, overrides)))
    assert set(cfg) - {"logger"} == set(SECTIONS)
    for key, schema in SECTIONS.items():
        if dataclasses.is_dataclass(schema):
            section(cfg, key, schema)
        else:
            assert isinstance(cfg[key], schema), key


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
