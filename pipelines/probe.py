"""Probe stage: one cell of the grid, a task and a feature mode, on every encoder
(config: ``probe``, ``task``, ``features``, ``grid``, and ``extract``'s datasets).

Under DVC, a matrix cell runs every seed of ``grid.seeds``:
``python pipelines/probe.py --params params.yaml task=upos features=layer1`` writes
``artifacts/probes/upos/layer1/<encoder>/seed<k>/``. Ad hoc or as a sweep, each job runs the one
seed ``seed``::

    python pipelines/probe.py -m task=upos,chunk features=layer0,scalar_mix seed=1,2,3

writes ``multirun/<time>/<job>/probes/<task>/<features>/<encoder>/seed<k>/``. Both read the cached
features of ``probe.features_dir``.
"""

import sys
from collections.abc import Sequence
from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
from omegaconf import DictConfig

from elmolab.config import run_stage, section
from elmolab.extract import ExtractConfig
from elmolab.probing.runner import FeaturesConfig, GridConfig, ProbeSettings, run_cell
from elmolab.probing.tasks import TaskConfig
from elmolab.tracking import init_run, run_tags

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run_cell_seeds(cfg: DictConfig, out_dir: Path, seeds: Sequence[int]) -> dict:
    task = section(cfg, "task", TaskConfig)
    mode = section(cfg, "features", FeaturesConfig).mode
    catalog = section(cfg, "extract", ExtractConfig).catalog()
    settings = section(cfg, "probe", ProbeSettings)

    def start_run(fields: dict):
        seed = "" if fields["seed"] is None else f"/seed{fields['seed']}"
        name = f"probe@{task.name}-{mode}/{fields['encoder']}{seed}"
        return init_run(cfg, job_type="probe", name=name, tags=run_tags(**fields), config=fields)

    cell_dir = out_dir / task.name / mode
    results = run_cell(task, mode, catalog, settings, seeds, cell_dir, start_run)
    return {"cell": str(cell_dir), "runs": len(results)}


def run_grid_seeds(cfg: DictConfig, out_dir: Path) -> dict:
    return run_cell_seeds(cfg, out_dir, section(cfg, "grid", GridConfig).seeds)


def run_one_seed(cfg: DictConfig, out_dir: Path) -> dict:
    return run_cell_seeds(cfg, out_dir, [cfg.seed])


if __name__ == "__main__":
    under_dvc = sys.argv[1:2] == ["--params"]
    run_stage(run_grid_seeds if under_dvc else run_one_seed, stage="probes", conf_dir=CONF_DIR)
