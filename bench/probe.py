"""How long the default probing grid takes from cached features: a subset measured, the rest
extrapolated (target: 20 minutes on 2 cores).

A DVC cell (task x feature mode) costs ``startup + task data + encoders x (features + seeds x
training)``. Measured here, one thread, as a cell runs:

1. startup: ``pipelines/probe.py`` in a subprocess on a cell that does nothing (wsd/scalar_mix
   only writes "not applicable"): imports, config, output;
2. per task: reading its data and labels; per encoder: loading its three splits' features;
3. per task, one seed on one encoder, for each cost class of feature mode: ``layer1`` (stands
   for every frozen mix of one layer's width: layer0, layer1, layer2, mean), ``scalar_mix``
   (learned, mixes every batch), ``concat`` (three layers wide);
4. wsd: data and WordNet, then per encoder features, centroids and 1-NN for one frozen mode.

Extrapolated: every other cell, encoder and seed from these (same task and cost class; the
number of epochs before early stopping is the measured one, so the worst case with
``probe.max_epochs`` epochs is printed too). Times are CPU seconds of this process and its
children: what an idle core would take (this machine is shared; the load average is printed).
DVC runs the cells one after another; inside a cell ``probe.workers`` processes probe the
encoders side by side. Last, one real cell (``upos``/``layer1``, two encoders) runs with one
worker and with ``probe.workers``, by wall clock in this run, and the grid's total is divided by
that measured speed-up.

Features: ``--features`` (default ``artifacts/features``) with the encoder ``--encoder``; when
absent, synthetic ones of the CPU default's shape (3 layers x 256 dims, float16) are written in the
extract stage's format from the real sentences, each word type a fixed random vector per layer
plus noise, so that probes learn and stop early as on real features.

Not in this estimate: the tree tasks (deparc, structural) and the learning-curve runs of the
token tasks; the probe stage's own timing (``dvc repro``) covers them.

Run: .venv/bin/python bench/probe.py [--features DIR] [--encoder trained]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from omegaconf import OmegaConf

from elmolab.config import load_params, section
from elmolab.extract import ExtractConfig, feature_path, units_path
from elmolab.io.features import open_feature_writer
from elmolab.params import compose_params
from elmolab.probing.runner import (
    ROLES,
    GridConfig,
    ProbeSettings,
    feature_dataset,
    run_cell,
    task_sources,
)
from elmolab.probing.tasks import DataCatalog, SplitSource, TaskConfig, TaskKind, task_labels
from elmolab.probing.train import ProbeConfig, train_probe
from elmolab.text.wsd import read_wordnet_sense_index

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
COST_CLASS = {"layer0": "layer1", "layer1": "layer1", "layer2": "layer1", "mean": "layer1"}
MEASURED_MODES = ("layer1", "scalar_mix", "concat")
SYNTHETIC_DIM = 256  # the CPU default: 2 x projection 128


@dataclass
class Clock:
    cpu: float = 0.0  # seconds of CPU, this process and its children


def _cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def timed() -> Iterator[Clock]:
    clock = Clock()
    cpu = _cpu_seconds()
    yield clock
    clock.cpu = _cpu_seconds() - cpu


def synthesize_features(data: DataCatalog, encoder_dir: Path, seed: int = 0) -> None:
    """Features of every split in the extract stage's format (see the module docstring)."""
    rng = np.random.default_rng(seed)
    sources = data.sources()
    type_ids: dict[str, int] = {}
    rows = [
        [[type_ids.setdefault(word, len(type_ids)) for word in words] for words in _words(source)]
        for source in sources
    ]
    types = rng.standard_normal((len(type_ids), 3, SYNTHETIC_DIM), dtype=np.float32)
    for source, ids in zip(sources, rows, strict=True):
        units = source.units()
        path = feature_path(encoder_dir, source.dataset, source.split)
        with open_feature_writer(path, "all", "float16") as writer:
            for index, row in enumerate(ids):
                layers = types[row].transpose(1, 0, 2)  # (layers, n_units, dim)
                noise = rng.standard_normal(layers.shape, dtype=np.float32)
                writer.write(index, " ".join(units[index]), layers + noise)
        text = "".join(" ".join(line) + "\n" for line in units)
        units_path(path, source.format.is_wsd).write_text(text, encoding="utf-8")


def _words(source: SplitSource) -> list[list[str]]:
    """The word behind each feature vector: the token, or a WSD instance's token."""
    if source.format.is_wsd:
        return [[s.tokens[i.position] for i in s.instances] for s in source.wsd_sentences()]
    return source.units()


def measure_startup(params: Path, artifacts: Path) -> Clock:
    """A cell that does nothing: the probe stage's fixed cost per DVC cell."""
    command = [sys.executable, "pipelines/probe.py", "--params", str(params)]
    command += ["task=wsd", "features=scalar_mix", f"paths.artifacts={artifacts}"]
    with timed() as clock:
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return clock


@dataclass
class TaskCost:
    """Measured CPU seconds of one task: reading its data (once per cell), loading one encoder's
    features, and training one seed per cost class of feature mode (measured, and scaled to
    ``max_epochs`` epochs)."""

    reading: float
    loading: float
    training: dict[str, tuple[float, float]]


def measure_task(
    task: TaskConfig, data: DataCatalog, encoder_dir: Path, config: ProbeConfig
) -> TaskCost:
    with timed() as reading:
        sources = task_sources(task, data)
        labels = task_labels(task, sources)
    with timed() as loading:
        splits = {role: feature_dataset(encoder_dir, sources[role], labels, role) for role in ROLES}
    training = {}
    for mode in MEASURED_MODES:
        with timed() as clock:
            result = train_probe(
                splits["train"],
                splits["dev"],
                splits["test"],
                labels.vocabulary,
                mode=mode,
                metric=task.metric,
                seed=1,
                config=config,
            )
        training[mode] = (clock.cpu, clock.cpu * config.max_epochs / result.epochs)
        print(
            f"{task.name:<13}{mode:<11}{reading.cpu:>7.1f}{loading.cpu:>7.1f}"
            f"{clock.cpu:>7.1f}{result.epochs:>8}",
            flush=True,
        )
    return TaskCost(reading.cpu, loading.cpu, training)


def measure_wsd(
    task: TaskConfig, data: DataCatalog, settings: ProbeSettings, scratch: Path
) -> TaskCost:
    """WSD trains nothing: ``training`` holds one encoder's features, centroids and 1-NN."""
    assert task.wordnet is not None
    with timed() as reading:
        task_sources(task, data, read_wordnet_sense_index(task.wordnet))
    with timed() as cell:  # reads the data again, then one encoder
        run_cell(task, "layer1", data, settings, [1], scratch / "wsd")
    per_encoder = cell.cpu - reading.cpu
    print(f"{task.name:<13}{'layer1':<11}{reading.cpu:>7.1f}{per_encoder:>14.1f}", flush=True)
    return TaskCost(reading.cpu, 0.0, {"layer1": (per_encoder, per_encoder)})


def cell_seconds(
    task: TaskConfig, mode: str, cost: TaskCost, startup: float, encoders: int, seeds: int
) -> tuple[float, float]:
    """Predicted CPU seconds of a DVC cell: as measured, and if no probe stops early."""
    if TaskKind(task.kind) is TaskKind.WSD:
        runs = 0 if mode == "scalar_mix" else encoders  # scalar_mix: "not applicable" only
        seconds = startup + (runs > 0) * cost.reading + runs * cost.training["layer1"][0]
        return seconds, seconds
    measured, worst = cost.training[COST_CLASS.get(mode, mode)]
    fixed = startup + cost.reading + encoders * cost.loading
    return fixed + encoders * seeds * measured, fixed + encoders * seeds * worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=Path, default=ROOT / "artifacts" / "features")
    parser.add_argument("--encoder", default="trained", help="the encoder measured")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_MODE", "disabled")

    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        params = scratch / "params.yaml"
        params.write_text(compose_params(CONF), encoding="utf-8")
        cfg = OmegaConf.create(yaml.safe_load(params.read_text(encoding="utf-8")))
        data = section(cfg, "extract", ExtractConfig).catalog()
        settings = section(cfg, "probe", ProbeSettings)
        grid = section(cfg, "grid", GridConfig)
        encoders, seeds = len(settings.encoders), len(grid.seeds)
        features = args.features
        if not (features / args.encoder).is_dir():
            features = scratch / "features"
            print(f"no {args.features / args.encoder}: synthesizing features ...", flush=True)
            synthesize_features(data, features / args.encoder)
        settings.features_dir, settings.encoders = str(features), [args.encoder]
        print(f"features: {features / args.encoder}; load average {os.getloadavg()[0]:.1f}")

        startup = measure_startup(params, scratch / "artifacts").cpu
        print(f"startup of a cell (subprocess): {startup:.1f} s cpu")
        tasks = [
            section(load_params(params, [f"task={name}"], CONF), "task", TaskConfig)
            for name in grid.tasks
        ]
        skipped = [task.name for task in tasks if TaskKind(task.kind).is_tree]
        tasks = [task for task in tasks if task.name not in skipped]
        if skipped:  # their trainers (elmolab.probing.trees) are timed by the probe stage
            print(f"not estimated here: the tree tasks {', '.join(skipped)}")
        header = f"{'task':<13}{'mode':<11}{'data':>7}{'feats':>7}{'train':>7}{'epochs':>8}"
        print(f"\nmeasured: one seed, encoder {args.encoder!r}; cpu seconds\n{header}")
        costs = {
            task.name: measure_wsd(task, data, settings, scratch)
            if TaskKind(task.kind) is TaskKind.WSD
            else measure_task(task, data, features / args.encoder, settings.probe_config())
            for task in tasks
        }

    print(f"\nextrapolated grid: {len(tasks)} tasks x {len(grid.features)} feature modes,")
    print(f"{encoders} encoders x {seeds} seeds per cell; cpu minutes")
    print(f"{'task':<13}{'cells':>6}{'measured':>10}{'worst':>8}")
    total = np.zeros(2)
    for task in tasks:
        cells = np.array(
            [
                cell_seconds(task, mode, costs[task.name], startup, encoders, seeds)
                for mode in grid.features
            ]
        ).sum(axis=0)
        total += cells
        print(f"{task.name:<13}{len(grid.features):>6}{cells[0] / 60:>10.1f}{cells[1] / 60:>8.1f}")
    speedup = measure_workers(params, features, args.encoder, settings.workers)
    print(
        f"total: {total[0] / 60:.1f} cpu min one probe after another; with {settings.workers}"
        f" workers a cell (x{speedup:.2f}): about {total[0] / 60 / speedup:.1f} min of wall clock"
        f" for the grid under dvc repro; if no probe stopped before max_epochs"
        f" ({settings.max_epochs}): {total[1] / 60:.1f} and {total[1] / 60 / speedup:.1f}"
    )


def measure_workers(params: Path, features: Path, encoder: str, workers: int) -> float:
    """Wall seconds of one real cell with one worker and with ``workers``; prints both and
    returns the speed-up. The cell probes two encoders (the same features under two names)."""
    cfg = load_params(params, ["task=upos", "features=layer1"], CONF)
    task, data = section(cfg, "task", TaskConfig), section(cfg, "extract", ExtractConfig).catalog()
    seeds = section(cfg, "grid", GridConfig).seeds
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        (scratch / "features").mkdir()
        for name in ("a", "b"):
            (scratch / "features" / name).symlink_to((features / encoder).resolve())
        wall = {}
        for count in (1, workers):
            settings = section(cfg, "probe", ProbeSettings)
            settings.features_dir, settings.encoders = str(scratch / "features"), ["a", "b"]
            settings.workers = count
            started = time.perf_counter()
            run_cell(task, "layer1", data, settings, seeds, scratch / f"cell{count}")
            wall[count] = time.perf_counter() - started
    speedup = wall[1] / wall[workers]
    print(
        f"\nupos/layer1, 2 encoders x {len(seeds)} seeds, wall clock: {wall[1]:.1f} s with 1"
        f" worker, {wall[workers]:.1f} s with {workers}: x{speedup:.2f}"
    )
    return speedup


if __name__ == "__main__":
    main()
