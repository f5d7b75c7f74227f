"""Probe stage: one cell of the grid, a task, with every feature mode on every encoder
(config: ``probe``, ``task``, ``grid``, and ``extract``'s datasets).

Under DVC, a cell runs every feature mode of ``grid.features`` and every seed of ``grid.seeds``:
``python pipelines/probe.py --params params.yaml task=upos`` writes
``artifacts/probes/upos/<features>/<encoder>/seed<k>/``. Ad hoc or as a sweep, each job runs the
one feature mode ``features`` and the one seed ``seed``::

    python pipelines/probe.py -m task=upos,chunk features=layer0,scalar_mix seed=1,2,3

writes ``multirun/<time>/<job>/probes/<task>/<features>/<encoder>/seed<k>/``. Both read the cached
features of ``probe.features_dir``.
"""

import sys
from collections.abc import Sequence
from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
from omegaconf import DictConfig, OmegaConf

from elmolab.config import run_stage, section
from elmolab.errors import ElmolabError
from elmolab.extract import ExtractConfig
from elmolab.probing.runner import FeaturesConfig, GridConfig, feature_modes, run_cell
from elmolab.probing.settings import ProbeSettings
from elmolab.probing.tasks import TaskConfig
from elmolab.tracking import init_run, run_tags

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run_cell_modes(cfg: DictConfig, out_dir: Path, modes: Sequence[str], seeds: Sequence[int]):
    task = section(cfg, "task", TaskConfig)
    catalog = section(cfg, "extract", ExtractConfig).catalog()
    settings = section(cfg, "probe", ProbeSettings)

    def start_run(fields: dict):
        seed = "" if fields["seed"] is None else f"/seed{fields['seed']}"
        fraction = fields.get("train_fraction", 1.0)
        curve = "" if fraction == 1.0 else f"/fraction_{fraction:g}"
        name = f"probe@{task.name}/{fields['features']}/{fields['encoder']}{seed}{curve}"
        return init_run(cfg, job_type="probe", name=name, tags=run_tags(**fields), config=fields)

    cell_dir = out_dir / task.name
    results = run_cell(task, modes, catalog, settings, seeds, cell_dir, start_run)
    return {"cell": str(cell_dir), "runs": len(results)}


def run_grid(cfg: DictConfig, out_dir: Path) -> dict:
    """Under DVC: the cell ``grid.tasks.<task>`` (``task=<name>`` on the command line names it;
    its settings are params.yaml's, which DVC tracks), every feature mode of the grid
    (``conf/features/<name>.yaml``), every seed."""
    grid = section(cfg, "grid", GridConfig)
    name = cfg.task.name
    if name not in grid.tasks:
        raise ElmolabError(f"task {name!r} is not a cell of grid.tasks ({', '.join(grid.tasks)})")
    if grid.tasks[name].name != name:
        raise ElmolabError(
            f"grid.tasks.{name}.name is {grid.tasks[name].name!r}: a cell's results folder is"
            " its task's name, so the two must be the same"
        )
    # task=<name> loaded conf/task/<name>.yaml; a task.* override on top of it would not reach
    # the cell, which runs params.yaml's copy: say where such a setting goes instead.
    pristine = OmegaConf.merge(cfg, {"task": OmegaConf.load(CONF_DIR / "task" / f"{name}.yaml")})
    if OmegaConf.to_container(pristine.task, resolve=True) != OmegaConf.to_container(
        cfg.task, resolve=True
    ):
        raise ElmolabError(
            f"a DVC cell runs grid.tasks.{name} of params.yaml: override grid.tasks.{name}.<key>,"
            " not task.<key>"
        )
    cfg.task = cfg.grid.tasks[name]
    modes = feature_modes(CONF_DIR, grid.features)
    return run_cell_modes(cfg, out_dir, modes, grid.seeds)


def run_one(cfg: DictConfig, out_dir: Path) -> dict:
    """Ad hoc or one job of a sweep: the composed ``features`` and ``seed``."""
    return run_cell_modes(cfg, out_dir, [section(cfg, "features", FeaturesConfig).mode], [cfg.seed])


if __name__ == "__main__":
    under_dvc = sys.argv[1:2] == ["--params"]
    run_stage(run_grid if under_dvc else run_one, stage="probes", conf_dir=CONF_DIR)
