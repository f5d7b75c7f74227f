"""Time task-model runs to convergence on a finished run's cached CoNLL-2003 features.

Each run is one input and seed of the taskmodel stage (``train_one``, as the stage trains it), on
this checkout's ``conf/taskmodel/default.yaml`` with ``key=value`` overrides of that section, the
features read (only) from WORKSPACE's ``artifacts/features``. With ``--epochs N`` a run stops
after N epochs (``max_epochs``, patience above it): the epoch time alone. Prints one JSON line per
run: its settings, seconds per epoch (training with dev's evaluation), epochs, best epoch, dev and
test F1, and the load average at its start and end.

With ``--stage``, the inputs run as the stage runs them instead (``run_taskmodel``: ``--seeds``
each, on ``taskmodel.workers`` processes, into a scratch folder), once with one worker and once
with ``--stage``'s number: one line each with the stage's wall and CPU seconds (on cores another
job keeps busy, the workers share what is left; the CPU seconds show the work).

Run: PYTHONPATH=src .venv/bin/python bench/taskmodel_speed.py WORKSPACE [batch_size=512 lr=0.04 ...]
     [--inputs baseline,elmo_trained] [--seed 1] [--epochs 2] [--stage 2 --seeds 1,2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from elmolab.core.config import load_params, section
from elmolab.core.schema import ExtractConfig, GridConfig, TaskModelConfig
from elmolab.data.catalogue import data_catalog
from elmolab.taskmodel.runs import (
    input_splits,
    load_task_data,
    run_taskmodel,
    tagging_task,
    train_one,
)

CONF = Path(__file__).resolve().parents[1] / "conf" / "taskmodel" / "default.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("overrides", nargs="*", help="key=value of the taskmodel section")
    parser.add_argument("--inputs", default="baseline,elmo_trained", help="comma-separated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--stage", type=int, default=None, help="workers against one")
    parser.add_argument("--seeds", default="1,2", help="comma-separated, with --stage")
    args = parser.parse_intermixed_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # each epoch's dev F1
    os.chdir(args.workspace)  # the params' data paths are relative to the workspace
    cfg = load_params("params.yaml")
    values = yaml.safe_load(CONF.read_text(encoding="utf-8"))
    values["features_dir"] = str(args.workspace.resolve() / "artifacts" / "features")
    for override in args.overrides:
        key, value = override.split("=", 1)
        values[key] = yaml.safe_load(value)
    if args.epochs is not None:
        values.update(max_epochs=args.epochs, patience=args.epochs + 1)
    config = TaskModelConfig(**values)
    task = tagging_task(config, section(cfg, "grid", GridConfig).tasks)
    torch.set_num_threads(config.num_threads)
    catalog = data_catalog(section(cfg, "extract", ExtractConfig))
    if args.stage is not None:
        names = args.inputs.split(",")
        seeds = [int(seed) for seed in args.seeds.split(",")]
        mixes = [name.removeprefix("elmo_") for name in names if name != "baseline"]
        for workers in (1, args.stage):
            one = dataclasses.replace(config, mix_encoders=mixes, seeds=seeds, workers=workers)
            load, cpu = os.getloadavg()[0], cpu_seconds()
            with tempfile.TemporaryDirectory(prefix="taskmodel-bench-") as scratch:
                summary = run_taskmodel(one, task, catalog, Path(scratch) / "out")
            line = {"workers": workers, "inputs": one.inputs, "seeds": seeds}
            line["seconds"] = round(summary["wall_seconds"], 1)
            line["cpu_seconds"] = round(cpu_seconds() - cpu, 1)  # the work, whatever the load
            line["load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
            print(json.dumps(line), flush=True)
        return
    data = load_task_data(config, task, catalog)
    for name in args.inputs.split(","):
        splits = input_splits(config, data, name)
        load = os.getloadavg()[0]
        start = time.perf_counter()
        result, _ = train_one(config, data, splits, args.seed, f"{name}/seed{args.seed}")
        seconds = time.perf_counter() - start
        line = {
            "input": name,
            "seed": args.seed,
            "overrides": args.overrides,
            "s_per_epoch": round(seconds / result["epochs"], 2),
            "seconds": round(seconds, 1),
            "epochs": result["epochs"],
            "best_epoch": result["best_epoch"],
            "dev_f1": round(result["dev_f1"], 2),
            "test_f1": round(result["test_f1"], 2),
            "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        }
        print(json.dumps(line), flush=True)
        del splits


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and its finished children (the workers)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


if __name__ == "__main__":
    sys.exit(main())
