"""Count the probe stage's runs per cell, dry: what the cells would run, from the modes each
encoder gets (``elmolab.probing.modes``) and the jobs the runner plans from them
(``elmolab.probing.jobs.plan_jobs``); nothing is trained or read.

    .venv/bin/python bench/probe_runs.py [OVERRIDE ...] [--against OVERRIDE ...]

prints per task the runs written (``metrics.json`` files, layer-0 copies included), the runs
fitted, those on all the training data, and the heads' arithmetic per training token summed over
the jobs, each job's weighted by its share of the training split (``job_arithmetic``: one unit is
a layer-wide head; an epoch's cost, not the stage's time: epochs, loading and start-up vary) for
``conf/`` composed with the overrides, beside the same for ``--against``'s overrides. The grid
before the controls had several instances: ``--against
probe.encoders=[trained,random,token_only] grid.seeds=[1,2,3]
grid.features=[layer0,layer1,layer2,mean,scalar_mix,concat]
probe.control_features=[layer0,layer1,layer2,mean,scalar_mix,concat]``.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from elmolab.core.config import feature_modes, section
from elmolab.core.params import compose_params
from elmolab.core.schema import ControlsConfig, GridConfig, ProbeSettings, TaskConfig, TaskKind
from elmolab.io.results import FeatureMode
from elmolab.probing.jobs import job_arithmetic, plan_jobs
from elmolab.probing.kinds import KINDS
from elmolab.probing.modes import CellModes

CONF = Path(__file__).resolve().parents[1] / "conf"
TRAIN_SENTENCES = 1000  # any size: the subsets' shares, not their sentences, are counted
NUM_LAYERS = 3


@dataclasses.dataclass(frozen=True)
class Count:
    written: int
    fitted: int
    full: int  # written on all the training data
    arithmetic: float

    def __add__(self, other: Count) -> Count:
        return Count(*(a + b for a, b in zip(self.cells(), other.cells(), strict=True)))

    def cells(self) -> tuple:
        return dataclasses.astuple(self)

    def text(self) -> str:
        return f"{self.written:5d} {self.fitted:5d} {self.full:5d} {self.arithmetic:7.1f}"


def cell_count(task: TaskConfig, settings: ProbeSettings, grid: GridConfig, controls) -> Count:
    """One cell's runs (see the module docstring)."""
    modes = CellModes.resolve(
        feature_modes(CONF, grid.features),
        settings.encoders,
        controls.instances(),
        settings.control_features,
        conditional=task.conditional,
    )
    settings = dataclasses.replace(settings, encoders=modes.encoders())
    kind = TaskKind(task.kind)
    if kind is TaskKind.WSD:  # 1-NN: a record per mode and encoder, nothing trained
        runs = sum(len(modes.full[e]) for e in settings.encoders)
        return Count(runs, 0, runs, 0.0)
    # the token-layer control's instances share the trained biLM's (the first encoder's) layer 0
    main = settings.encoders[0]
    twins = {
        e: main
        for e in controls.token_layer
        if e in modes.full and FeatureMode.LAYER0 in modes.full[e]
    }
    jobs = plan_jobs(
        kind,
        modes,
        grid.seeds,
        settings,
        twins,
        conditional=task.conditional,
        num_layers=NUM_LAYERS,
        train_sentences=TRAIN_SENTENCES,
    )
    fractions = [1.0, *settings.train_fractions] if KINDS[kind].learning_curve else [1.0]
    copies = {
        f: len(grid.seeds) * sum(FeatureMode.LAYER0 in modes.modes(e, f) for e in twins)
        for f in fractions
    }
    fitted = sum(len(job.heads) for job in jobs)
    full = sum(len(job.heads) for job in jobs if job.fraction == 1.0)
    return Count(
        fitted + sum(copies.values()),
        fitted,
        full + copies[1.0],
        sum(job_arithmetic(kind, job, NUM_LAYERS) * job.fraction for job in jobs),
    )


def counts(overrides: list[str]) -> dict[str, Count]:
    """Each task's count in ``conf/`` composed with ``overrides``."""
    cfg = OmegaConf.create(yaml.safe_load(compose_params(CONF, overrides)))
    grid = section(cfg, "grid", GridConfig)
    settings = section(cfg, "probe", ProbeSettings)
    controls = section(cfg, "controls", ControlsConfig)
    return {name: cell_count(task, settings, grid, controls) for name, task in grid.tasks.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="of the composed config counted")
    parser.add_argument("--against", nargs="*", default=None, help="of the config beside it")
    args = parser.parse_args()
    columns = "written fitted full arithmetic"
    sides = {"this": counts(args.overrides)}
    if args.against is not None:
        sides["against"] = counts(args.against)
    print(f"{'task':13s} " + " | ".join(f"{side}: {columns}" for side in sides))
    totals = dict.fromkeys(sides, Count(0, 0, 0, 0.0))
    for task in sides["this"]:
        cells = [sides[side].get(task) for side in sides]
        print(f"{task:13s} " + " | ".join("-" if c is None else c.text() for c in cells))
        totals = {
            side: totals[side] + (sides[side].get(task) or Count(0, 0, 0, 0.0)) for side in sides
        }
    print(f"{'all cells':13s} " + " | ".join(total.text() for total in totals.values()))


if __name__ == "__main__":
    main()
