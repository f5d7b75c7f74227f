"""The probe stage: one cell of the grid, a task of ``grid.tasks``, with every feature mode on
every encoder but the controls' instances, which run ``probe.control_features`` only (config:
``probe``, ``grid``, ``controls``, and ``extract``'s datasets; the library is
:mod:`elmolab.probing`).

Under DVC a cell runs every feature mode of ``grid.features`` and every seed of ``grid.seeds``:
``python pipelines/probe.py --params params.yaml task=upos`` writes
``artifacts/probes/upos/<features>/<encoder>/seed<k>/``. Ad hoc or as a sweep, each job runs the
task ``task`` (a key of ``grid.tasks``) with the one feature mode ``features`` and the one seed
``seed``::

    python pipelines/probe.py -m task=upos,chunk features=layer0,scalar_mix seed=1,2,3

writes ``multirun/<time>/<job>/probes/<task>/<features>/<encoder>/seed<k>/``. A task's settings
live in ``grid.tasks.<name>`` only (``conf/tasks/<name>.yaml``, placed there by ``conf/grid/``):
override them there, e.g. ``grid.tasks.upos.mdl=true``. Both read the cached features of
``probe.features_dir``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from elmolab.core.config import feature_modes, run_stage, section
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import (
    ControlsConfig,
    ExtractConfig,
    FeaturesConfig,
    GridConfig,
    ProbeSettings,
    TaskConfig,
    TaskKind,
)
from elmolab.core.tracking import init_run, run_tags
from elmolab.data.catalogue import DataCatalog, data_catalog
from elmolab.data.tasks import check_task
from elmolab.probing.cell_data import load_cell
from elmolab.probing.modes import CellModes
from elmolab.probing.runner import RunStarter, no_tracking, run_cell
from elmolab.probing.settings import probe_precision


def resolve_cell(
    task: TaskConfig,
    modes: Sequence[str],
    seeds: Sequence[int],
    settings: ProbeSettings,
    controls: Collection[str] = (),
) -> tuple[TaskConfig, CellModes, ProbeSettings]:
    """The cell's task, feature modes and settings, checked and resolved once for everything
    below: ``probe.unseen`` (where set) over the task's own, the modes each encoder runs
    (:class:`~elmolab.probing.modes.CellModes`: an encoder of ``controls``, a control's instance,
    only ``probe.control_features``; an encoder left without a mode is not probed), and the
    probes' precision chosen for this machine (WSD's 1-NN trains nothing, and keeps it as set).
    A bad value is an ElmolabError naming the key."""
    if settings.unseen is not None:
        task = dataclasses.replace(task, unseen=settings.unseen)
    check_task(task)
    settings.check()
    if not modes:
        raise ElmolabError("no feature modes to run (grid.features is empty)")
    if not seeds:
        raise ElmolabError("no seeds to run (grid.seeds is empty)")
    cell_modes = CellModes.resolve(
        modes,
        settings.encoders,
        controls,
        settings.control_features,
        conditional=task.conditional,
        learned_mix=TaskKind(task.kind) is not TaskKind.WSD,
    )
    settings = dataclasses.replace(settings, encoders=cell_modes.encoders())
    if TaskKind(task.kind) is not TaskKind.WSD:
        # Not logged: every cell on a machine chooses the same, and each run's metrics.json
        # records it; a line per cell would repeat it through a whole `dvc repro`.
        settings = dataclasses.replace(settings, precision=probe_precision(settings).precision)
    return task, cell_modes, settings


def probe_cell(
    task: TaskConfig,
    modes: Sequence[str],
    seeds: Sequence[int],
    catalog: DataCatalog,
    settings: ProbeSettings,
    cell_dir: Path,
    start_run: RunStarter = no_tracking,
    controls: Collection[str] = (),
) -> list[dict[str, Any]]:
    """One cell: its settings resolved (:func:`resolve_cell`; ``controls``: the encoders that are
    a control's instances), its data loaded from ``catalog`` (the catalogue the features were
    extracted from), both once, then every run of it written to ``cell_dir``
    (:func:`~elmolab.probing.runner.run_cell`); the metrics of every run."""
    task, cell_modes, settings = resolve_cell(task, modes, seeds, settings, controls)
    # The whole cell computes on these threads, its loading too (standardizing sums in parallel).
    torch.set_num_threads(settings.num_threads)
    torch.set_flush_denormal(True)
    data = load_cell(task, settings, catalog)
    return run_cell(task, cell_modes, data, settings, seeds, cell_dir, start_run)


def run_modes(cfg: DictConfig, out_dir: Path, conf_dir: Path | None) -> dict:
    """The cell of ``task`` on every encoder -> ``out_dir``: with ``conf_dir`` (under DVC) every
    feature mode of the grid (``conf/features/<name>.yaml``) and every seed, else the composed
    ``features`` and ``seed``. Reads every section it needs here, once."""

    def start_run(fields: dict[str, Any]):
        seed = "" if fields["seed"] is None else f"/seed{fields['seed']}"
        fraction = fields.get("train_fraction", 1.0)
        curve = "" if fraction == 1.0 else f"/fraction_{fraction:g}"
        name = f"probe@{task.name}/{fields['features']}/{fields['encoder']}{seed}{curve}"
        return init_run(cfg, job_type="probe", name=name, tags=run_tags(**fields), config=fields)

    grid = section(cfg, "grid", GridConfig)
    settings = section(cfg, "probe", ProbeSettings)
    extract = section(cfg, "extract", ExtractConfig)
    if conf_dir is None:
        modes, seeds = [section(cfg, "features", FeaturesConfig).mode], [cfg.seed]
    else:
        modes, seeds = feature_modes(conf_dir, grid.features), grid.seeds
    controls = section(cfg, "controls", ControlsConfig).instances()
    task = grid.task(cfg.task)
    catalog = data_catalog(extract)
    cell_dir = out_dir / task.name
    results = probe_cell(task, modes, seeds, catalog, settings, cell_dir, start_run, controls)
    return {"cell": str(cell_dir), "runs": len(results)}


def run_grid(cfg: DictConfig, out_dir: Path, conf_dir: Path) -> dict:
    """Under DVC: the cell of ``task`` (``task=<name>``), every feature mode of the grid
    (``conf/features/<name>.yaml``), every seed."""
    return run_modes(cfg, out_dir, conf_dir)


def run_one(cfg: DictConfig, out_dir: Path) -> dict:
    """Ad hoc or one job of a sweep: the composed ``task``, ``features`` and ``seed``."""
    return run_modes(cfg, out_dir, None)


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/probe.py``: ``--params params.yaml task=<name>`` under DVC (``--external
    <name>``: that model's study), else Hydra overrides (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--params"]:
        fn = functools.partial(run_grid, conf_dir=conf_dir)
        run_stage(fn, stage="probes", conf_dir=conf_dir, argv=argv)
    else:
        run_stage(run_one, stage="probes", conf_dir=conf_dir, argv=argv)
