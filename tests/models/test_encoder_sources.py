"""Any bilm-tf model as an encoder: a folder whose bilm-tf files have any names (a published
ELMo's ``elmo_..._options.json``), or the two files named directly
(``extract.encoders.<name>: {options: <file>, weights: <file>}``); bad sources are one-line errors
and write nothing.

The model is bilm-tf's reference fixture under published-style names; the extraction runs on the
mini probing data of ``test_extract.py``, cut to a few sentences a split.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch
from fixtures.workspace import DIM, ROOT, compose, write_mini_data
from omegaconf import DictConfig, OmegaConf

from elmolab.core.config import section
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import ExtractConfig, GridConfig, ProbeSettings
from elmolab.data.catalogue import data_catalog, read_split_features
from elmolab.embed import embed_sentences
from elmolab.extraction.features import extract
from elmolab.io.features import summary_path
from elmolab.models.bilm import BiLM
from elmolab.models.encoder_files import encoder_files, load_encoder
from elmolab.stages.probe import probe_cell

OPTIONS, WEIGHTS = "elmo_test_options.json", "elmo_test_weights.hdf5"  # published-style names
SENTENCES = 3  # per split of the extraction
WORDS = [["The", "cat", "sat", "on", "the", "mat", "."], ["Hello", "world", "!"], ["ELMo"]]


def _outputs(model: BiLM) -> list[torch.Tensor]:
    """Every layer of ``WORDS``, in input order."""
    return [layers for _, layers in sorted(embed_sentences(model, WORDS), key=lambda x: x[0])]


def _assert_same_outputs(loaded: BiLM, reference: BiLM) -> None:
    for got, expected in zip(_outputs(loaded), _outputs(reference), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def _copy_fixture(fixture_dir: Path, options: Path, weights: Path) -> None:
    for source, target in (
        (fixture_dir / "options.json", options),
        (fixture_dir / "lm_weights.hdf5", weights),
    ):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


@pytest.fixture(scope="module")
def published(fixture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only the fixture's two files, under published-style names."""
    folder = tmp_path_factory.mktemp("elmo_test")
    _copy_fixture(fixture_dir, folder / OPTIONS, folder / WEIGHTS)
    return folder


@pytest.fixture(scope="module")
def workspace(
    data_dir: Path, published: Path, tmp_path_factory: pytest.TempPathFactory
) -> DictConfig:
    """The real config on mini data, with the encoder ``fixture`` added as on the command line."""
    root = tmp_path_factory.mktemp("sources")
    write_mini_data(data_dir, root / "data")
    files = f"{{options: '{published / OPTIONS}', weights: '{published / WEIGHTS}'}}"
    return compose(
        root,
        "extract.num_threads=1",
        f"extract.max_sentences={SENTENCES}",
        "extract.encoder=fixture",
        f"+extract.encoders.fixture={files}",
    )


def _config(workspace: DictConfig, source: object) -> ExtractConfig:
    """The ``extract`` section, with ``source`` as the encoder ``fixture``."""
    config = section(workspace, "extract", ExtractConfig)
    config.encoders["fixture"] = source
    return config


def test_a_folder_of_published_names_loads_the_bilm_tf_model(published: Path, model: BiLM) -> None:
    files = encoder_files(str(published))
    assert (files.options, files.weights, files.checkpoint) == (
        published / OPTIONS,
        published / WEIGHTS,
        None,
    )
    _assert_same_outputs(load_encoder(str(published)), model)


def test_a_mapping_names_the_two_files_wherever_they_are(
    fixture_dir: Path, tmp_path: Path, model: BiLM
) -> None:
    options, weights = tmp_path / "options" / OPTIONS, tmp_path / "weights" / WEIGHTS
    _copy_fixture(fixture_dir, options, weights)
    _assert_same_outputs(load_encoder({"options": str(options), "weights": str(weights)}), model)


def test_bilm_tfs_own_file_names_load_from_a_folder(fixture_dir: Path) -> None:
    files = encoder_files(fixture_dir)  # options.json + lm_weights.hdf5
    assert (files.options, files.weights) == (
        fixture_dir / "options.json",
        fixture_dir / "lm_weights.hdf5",
    )


def test_a_folder_prefers_the_exact_names_then_model_pt_then_any_names(tmp_path: Path) -> None:
    names = ["options.json", "weights.hdf5", "model.pt", OPTIONS, WEIGHTS]
    for name in names:
        (tmp_path / name).touch()
    files = encoder_files(tmp_path)
    assert (files.options, files.weights) == (tmp_path / "options.json", tmp_path / "weights.hdf5")
    (tmp_path / "weights.hdf5").unlink()  # options.json alone is not a model
    assert encoder_files(tmp_path).paths() == {"checkpoint": str(tmp_path / "model.pt")}
    (tmp_path / "model.pt").unlink()
    (tmp_path / "options.json").unlink()
    files = encoder_files(tmp_path)
    assert (files.options, files.weights) == (tmp_path / OPTIONS, tmp_path / WEIGHTS)


def test_an_encoder_named_by_its_files_is_extracted(
    workspace: DictConfig, published: Path, model: BiLM, tmp_path: Path
) -> None:
    config = section(workspace, "extract", ExtractConfig)
    assert config.encoders["fixture"] == {
        "options": str(published / OPTIONS),
        "weights": str(published / WEIGHTS),
    }
    assert config.encoders["trained"].endswith("/artifacts/bilm")  # the string form is unchanged
    out = tmp_path / "features"
    extract(config, out)
    assert [path.name for path in out.iterdir()] == ["fixture"]
    for dataset in config.datasets:
        summary = json.loads(summary_path(out / "fixture", dataset).read_text(encoding="utf-8"))
        assert summary["model"] == str(published / WEIGHTS)
        assert summary["files"] == {
            "options": str(published / OPTIONS),
            "weights": str(published / WEIGHTS),
        }
    sources = data_catalog(config).sources()
    assert {source.dataset for source in sources} == set(config.datasets)
    for source in sources:
        lines = read_split_features(out / "fixture", source)
        assert len(lines) == len(source.units()) <= SENTENCES
        assert {line.shape[::2] for line in lines} == {(3, DIM)}
    source = data_catalog(config).read("ud_english_ewt", "dev")
    stored = read_split_features(out / "fixture", source)[0]
    ((_, expected),) = embed_sentences(model, [source.units()[0]])
    np.testing.assert_allclose(stored, expected.numpy(), atol=2e-3, rtol=2e-3)  # float16


def test_the_documented_ad_hoc_commands_extract_and_probe_without_pretraining(
    workspace: DictConfig, published: Path, tmp_path: Path
) -> None:
    """docs/models.md's route: ``pipelines/extract.py`` ad hoc (the subprocess: the command line
    as documented), then a probe cell on its output folder (in process: the same overrides)."""
    root = Path(workspace.paths.data).parent
    files = f"{{options: {published / OPTIONS}, weights: {published / WEIGHTS}}}"
    command = [
        sys.executable,
        "pipelines/extract.py",
        f"hydra.run.dir={tmp_path / 'extract'}",
        f"+extract.encoders.fixture={files}",
        "extract.encoder=fixture",
        f"paths.data={root / 'data'}",
        f"paths.artifacts={tmp_path / 'artifacts'}",  # no pretrained biLM anywhere
        f"extract.max_sentences={SENTENCES}",
        "extract.num_threads=1",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    features = tmp_path / "extract" / "features"
    assert [path.name for path in features.iterdir()] == ["fixture"]

    cfg = compose(
        root,
        f"extract.max_sentences={SENTENCES}",
        f"probe.features_dir={features}",
        "probe.encoders=[fixture]",
        "probe.unseen=keep",  # a few sentences: some dev labels are not in train
        "probe.max_epochs=1",
        "probe.train_fractions=[]",
        "probe.workers=1",
    )
    cell = tmp_path / "probes" / "upos"
    probe_cell(
        section(cfg, "grid", GridConfig).task(cfg.task),
        ["layer1"],
        [1],
        data_catalog(section(cfg, "extract", ExtractConfig)),
        section(cfg, "probe", ProbeSettings),
        cell,
    )
    metrics = json.loads((cell / "layer1" / "fixture" / "seed1" / "metrics.json").read_text())
    assert metrics["encoder"] == "fixture"
    assert not (tmp_path / "artifacts").exists()


class Bad(NamedTuple):
    """A bad encoder: its config value, the path its error names, and the problem (a pattern)."""

    source: object
    path: Path
    problem: str


def _folder_without_weights(tmp: Path, fixture_dir: Path) -> Bad:
    _copy_fixture(fixture_dir, tmp / OPTIONS, tmp / "elsewhere" / WEIGHTS)
    problem = (
        rf"no biLM \(extract\.encoders\.fixture\): {re.escape(OPTIONS)} but no \*weights\.hdf5"
    )
    return Bad(str(tmp), tmp, problem)


def _missing_options(tmp: Path, fixture_dir: Path) -> Bad:
    _copy_fixture(fixture_dir, tmp / "other_options.json", tmp / WEIGHTS)
    source = {"options": str(tmp / OPTIONS), "weights": str(tmp / WEIGHTS)}
    problem = r"no such file \(extract\.encoders\.fixture\.options: bilm-tf's options file\)$"
    return Bad(source, tmp / OPTIONS, problem)


def _missing_weights(tmp: Path, fixture_dir: Path) -> Bad:
    _copy_fixture(fixture_dir, tmp / OPTIONS, tmp / "other_weights.hdf5")
    source = {"options": str(tmp / OPTIONS), "weights": str(tmp / WEIGHTS)}
    problem = r"no such file \(extract\.encoders\.fixture\.weights: bilm-tf's weights file\)$"
    return Bad(source, tmp / WEIGHTS, problem)


def _two_options_files(tmp: Path, fixture_dir: Path) -> Bad:
    _copy_fixture(fixture_dir, tmp / OPTIONS, tmp / WEIGHTS)
    shutil.copyfile(tmp / OPTIONS, tmp / "elmo_other_options.json")
    names = re.escape(f"(elmo_other_options.json, {OPTIONS})")
    return Bad(str(tmp), tmp, rf"2 bilm-tf options files {names} for extract\.encoders\.fixture")


def _no_such_folder(tmp: Path, fixture_dir: Path) -> Bad:
    return Bad(str(tmp), tmp, r"no such folder \(extract\.encoders\.fixture: a biLM folder")


@pytest.mark.parametrize(
    "breaker",
    [
        _folder_without_weights,
        _missing_options,
        _missing_weights,
        _two_options_files,
        _no_such_folder,
    ],
    ids=lambda breaker: breaker.__name__.strip("_"),
)
def test_a_bad_encoder_is_one_line_naming_the_path_and_nothing_is_written(
    breaker: Callable[[Path, Path], Bad], workspace: DictConfig, fixture_dir: Path, tmp_path: Path
) -> None:
    bad = breaker(tmp_path / "model", fixture_dir)
    out = tmp_path / "features"
    with pytest.raises(
        ElmolabError, match=rf"^{re.escape(str(bad.path))}: {bad.problem}"
    ) as raised:
        extract(_config(workspace, bad.source), out)
    assert "\n" not in str(raised.value)
    assert not out.exists()


def test_every_encoder_is_checked_before_any_is_extracted(
    workspace: DictConfig, tmp_path: Path
) -> None:
    config = section(workspace, "extract", ExtractConfig)
    good = config.encoders["fixture"]
    config.encoders, config.encoder = {"fixture": good, "broken": str(tmp_path / "absent")}, None
    out = tmp_path / "features"
    with pytest.raises(ElmolabError, match=r"no such folder \(extract\.encoders\.broken:"):
        extract(config, out)
    assert not out.exists()  # not even the good encoder's features


@pytest.mark.parametrize(
    "value",
    [{"options": "a_options.json"}, {"options": "a", "weights": "b", "vocab": "c"}, ""],
    ids=["weights-missing", "unknown-key", "empty"],
)
def test_a_source_of_the_wrong_shape_fails_when_the_config_is_read(
    workspace: DictConfig, value: object
) -> None:
    cfg = workspace.copy()
    OmegaConf.update(cfg, "extract.encoders.fixture", value, merge=False)
    expected = (
        r"^params\.yaml: extract\.encoders\.fixture: expected a biLM folder or"
        r" \{options: <file>, weights: <file>\}, got "
    )
    with pytest.raises(ElmolabError, match=expected):
        section(cfg, "extract", ExtractConfig, where="params.yaml")


def test_an_external_encoder_is_extracted_only_when_named(
    workspace: DictConfig, published: Path, tmp_path: Path
) -> None:
    """``extract.external`` models join a run only as ``extract.encoder``: a run of every
    encoder (a DVC extract@<dataset> stage) extracts ``extract.encoders`` alone."""
    config = section(workspace, "extract", ExtractConfig)
    config.external = {"published": str(published)}
    config.encoder = None
    assert set(config.selected_encoders()) == set(config.encoders)
    config.encoder = "published"
    assert config.selected_encoders() == {
        "published": ("extract.external.published", str(published))
    }
    config.encoder = "nope"
    with pytest.raises(ElmolabError, match=r"not one of extract\.encoders or extract\.external"):
        config.selected_encoders()


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("fixture", "models/x", "'fixture' is also one of extract.encoders"),
        ("x", {"options": "a", "weights": "b"}, "expected the folder of a bilm-tf model"),
    ],
    ids=["name-taken", "not-a-folder"],
)
def test_a_bad_external_encoder_fails_when_the_config_is_read(
    workspace: DictConfig, name: str, value: object, problem: str
) -> None:
    cfg = workspace.copy()
    OmegaConf.update(cfg, f"extract.external.{name}", value, merge=False)
    with pytest.raises(ElmolabError, match=rf"^params\.yaml: extract\.external\.{name}: {problem}"):
        section(cfg, "extract", ExtractConfig, where="params.yaml")


def test_an_external_study_reads_and_writes_its_own_folder_only() -> None:
    from elmolab.core.config import external_study

    cfg = OmegaConf.load(ROOT / "params.yaml")
    cfg.extract.external = {"elmo_small": "models/elmo_small"}
    study = external_study(cfg, "elmo_small")
    root = "artifacts/external/elmo_small"
    assert study.paths.artifacts == root
    assert (study.extract.encoder, study.probe.encoders) == ("elmo_small", ["elmo_small"])
    assert study.probe.features_dir == f"{root}/features"
    inputs = study.report.inputs
    paths = [inputs.bilm, inputs.bilm_random, inputs.probes, inputs.polysemy, inputs.taskmodel]
    assert all(path.startswith(f"{root}/") for path in paths) and list(inputs.sources) == []
    with pytest.raises(ElmolabError, match=r"no extract\.external\.nope .*elmo_small"):
        external_study(cfg, "nope")


def test_a_stage_run_for_an_unknown_external_encoder_is_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "pipelines/extract.py", "--params", "params.yaml", "--external", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--external nope: no extract.external.nope in the config (external encoders: none)" in (
        proc.stderr
    )
