"""Which feature modes each encoder of a cell runs (elmolab.probing.modes), and the jobs and copies
that follow from them (elmolab.probing.jobs)."""

import dataclasses

import pytest
from conftest import default_probe_settings

from elmolab.core.errors import ElmolabError
from elmolab.core.schema import TaskKind
from elmolab.probing.jobs import layer0_twins, plan_jobs
from elmolab.probing.modes import CellModes

GRID = ["layer0", "layer1", "layer2", "mean", "scalar_mix"]
ENCODERS = ["trained", "random", "random_2", "token_only", "external"]
CONTROLS = {"random", "random_2", "token_only"}  # "external": no control's instance


def test_a_controls_instance_runs_the_control_features_every_other_encoder_every_mode() -> None:
    modes = CellModes.resolve(GRID, ENCODERS, CONTROLS, ["scalar_mix"])
    for encoder in ("trained", "external"):
        assert modes.full[encoder] == modes.curve[encoder] == tuple(GRID)
    for encoder in CONTROLS:
        assert modes.full[encoder] == modes.curve[encoder] == ("scalar_mix",)
    assert modes.grid == tuple(GRID) and modes.encoders() == ENCODERS


def test_on_a_conditional_task_a_control_adds_layer0_but_not_to_its_learning_curves() -> None:
    modes = CellModes.resolve(GRID, ENCODERS, CONTROLS, ["scalar_mix"], conditional=True)
    assert modes.full["random"] == ("layer0", "scalar_mix")  # the grid's order
    assert modes.curve["random"] == ("scalar_mix",)
    assert modes.modes("random", 1.0) == ("layer0", "scalar_mix")
    assert modes.modes("random", 0.1) == ("scalar_mix",)
    assert modes.full["trained"] == tuple(GRID)
    # mean has no conditional probe (CONDITIONAL_MODES): no baseline to add
    mean = CellModes.resolve(GRID, ENCODERS, CONTROLS, ["mean"], conditional=True)
    assert mean.full["random"] == ("mean",)


def test_where_the_probe_learns_no_mix_a_control_runs_the_single_layers() -> None:
    """WSD 1-NN has no learned mix: a control's instance runs layers 0-2 there (its comparisons
    with the trained biLM), not a scalar-mix record with no score."""
    modes = CellModes.resolve(GRID, ENCODERS, CONTROLS, ["scalar_mix"], learned_mix=False)
    for encoder in CONTROLS:
        assert [m.value for m in modes.full[encoder]] == ["layer0", "layer1", "layer2"]
    assert modes.full["trained"] == tuple(GRID)


def test_the_grid_bounds_every_encoders_modes() -> None:
    """A control feature the grid lacks is not run, nor a layer 0 it lacks (smoke's grid); an
    encoder left without a mode has no run in the cell."""
    smoke = CellModes.resolve(
        ["layer1", "scalar_mix"], ENCODERS, CONTROLS, ["scalar_mix", "concat"], conditional=True
    )
    assert smoke.full["random"] == ("scalar_mix",) and smoke.full["trained"] == (
        "layer1",
        "scalar_mix",
    )
    none = CellModes.resolve(["layer1"], ENCODERS, CONTROLS, ["scalar_mix"])
    assert none.full["random"] == () and none.encoders() == ["trained", "external"]


def test_an_unknown_mode_names_its_key() -> None:
    with pytest.raises(ElmolabError, match=r"^probe.control_features: unknown feature mode 'mix'"):
        CellModes.resolve(GRID, ENCODERS, CONTROLS, ["mix"])


def test_the_jobs_follow_each_encoders_modes() -> None:
    """The full fit of a control's instance: its modes and their conditional probes; its
    learning-curve fits: the control features alone. The trained biLM: everything."""
    settings = dataclasses.replace(default_probe_settings(), encoders=["trained", "random"])
    modes = CellModes.resolve(GRID, settings.encoders, {"random"}, ["scalar_mix"], conditional=True)
    jobs = plan_jobs(
        TaskKind.TOKEN,
        modes,
        [1, 2],
        settings,
        {},
        conditional=True,
        num_layers=3,
        train_sentences=200,
    )
    heads = {
        (job.encoder, job.fraction): sorted({head.features for head in job.heads}) for job in jobs
    }
    assert heads[("random", 1.0)] == ["layer0", "layer0+scalar_mix", "scalar_mix"]
    assert heads[("random", 0.1)] == heads[("random", 0.01)] == ["scalar_mix"]
    assert heads[("trained", 1.0)] == sorted(
        [*GRID, "layer0+layer1", "layer0+layer2", "layer0+scalar_mix"]
    )
    assert heads[("trained", 0.1)] == sorted(GRID)
    assert all({head.seed for head in job.heads} == {1, 2} for job in jobs)


def test_a_layer0_twin_only_where_its_source_runs_what_it_would(tmp_path) -> None:
    """The token-layer control's layer-0 runs are copied from the trained biLM's (the same token
    layer), which runs every layer-0 run a control's instance has; not from an encoder whose
    layer-0 runs lack the twin's learning curves."""
    for encoder in ("trained", "token_only", "token_only_2"):
        folder = tmp_path / encoder / "ud_english_ewt"
        folder.mkdir(parents=True)
        (folder / "extract.json").write_text('{"token_layer_sha256": "same"}', encoding="utf-8")
    encoders = ["trained", "token_only", "token_only_2"]
    settings = dataclasses.replace(
        default_probe_settings(), encoders=encoders, features_dir=str(tmp_path)
    )
    controls = {"token_only", "token_only_2"}
    conditional = CellModes.resolve(GRID, encoders, controls, ["scalar_mix"], conditional=True)
    assert layer0_twins(settings, conditional, ["ud_english_ewt"]) == {
        "token_only": "trained",
        "token_only_2": "trained",
    }
    plain = CellModes.resolve(GRID, encoders, controls, ["scalar_mix"])
    assert layer0_twins(settings, plain, ["ud_english_ewt"]) == {}  # no layer 0 to copy
    # the first with the token layer is a control's instance (no layer-0 learning curve): the
    # encoder with one runs its own
    first_control = dataclasses.replace(settings, encoders=["token_only", "trained"])
    controls_first = CellModes.resolve(
        GRID, ["token_only", "trained"], controls, ["scalar_mix"], conditional=True
    )
    assert layer0_twins(first_control, controls_first, ["ud_english_ewt"]) == {}
