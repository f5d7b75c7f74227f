"""How the learned scalar mix fares under other probe settings, beside the single layers.

Trains, on one encoder's cached features of one task, the heads of ``--modes`` (default: the
scalar mix, and layer 2 to compare) for every seed, once per variant: the probe settings of
``conf/`` with that variant's Hydra overrides. Prints per variant and mode the test score
(mean +- std over seeds), the dev score, the epochs each seed ran and the mix's final weights.
With no overrides a variant reproduces the default run's heads exactly (same seeds, same code).

Run: .venv/bin/python bench/mix_variants.py structural \\
         default= mix_lr_x10=probe.mix_lr=0.1 layer_norm=probe.layer_norm=true
A variant is ``name=override[,override...]``; e.g. ``patience4=probe.tree.patience=4``, or
``raw=probe.standardize=false`` (the features as stored).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from elmolab.core.config import section
from elmolab.core.hardware import cpu_model
from elmolab.core.params import compose_params
from elmolab.core.schema import ExtractConfig, GridConfig, ProbeSettings
from elmolab.data.catalogue import data_catalog
from elmolab.io.results import FeatureMode
from elmolab.probing.cell_data import load_cell
from elmolab.probing.engine import train_heads
from elmolab.probing.probes import Head
from elmolab.probing.settings import probe_precision

ROOT = Path(__file__).resolve().parents[1]


def variant(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    return name, [o for o in overrides.split(",") if o]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", help="a task of grid.tasks (token, pair or tree)")
    parser.add_argument("variants", nargs="+", type=variant, help="name=override[,override...]")
    parser.add_argument("--modes", nargs="+", default=["scalar_mix", "layer2"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--encoder", default="trained")
    parser.add_argument("--features", default=str(ROOT / "artifacts" / "features"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; one thread")
    # The data once per probe.standardize (how it is loaded); other overrides change training only.
    loaded: dict[bool, tuple] = {}
    for name, overrides in args.variants:
        cfg = OmegaConf.create(compose_params(ROOT / "conf", overrides))
        OmegaConf.update(cfg, "probe.features_dir", args.features)
        settings = section(cfg, "probe", ProbeSettings)
        settings.encoders = [args.encoder]
        if settings.standardize not in loaded:
            task = section(cfg, "grid", GridConfig).tasks[args.task]
            catalog = data_catalog(section(cfg, "extract", ExtractConfig))
            data = load_cell(task, settings, catalog)
            loaded[settings.standardize] = (task, data.splits, data.labels)
        task, splits, labels = loaded[settings.standardize]
        heads = [Head(FeatureMode(m), seed) for m in args.modes for seed in args.seeds]
        started = time.perf_counter()
        results = train_heads(
            heads,
            splits[args.encoder],
            settings,
            kind=task.kind,
            metric=None if labels is None else task.metric,
            vocabulary=None if labels is None else labels.vocabulary,
        )
        seconds = time.perf_counter() - started
        precision = probe_precision(settings).precision
        print(f"{name} ({' '.join(overrides) or 'conf/ as it is'}; {precision}; {seconds:.0f} s)")
        for mode in args.modes:
            runs = [r for r in results if r.features == mode]
            test = [100 * r.test for r in runs]
            spread = statistics.stdev(test) if len(test) > 1 else 0.0
            line = f"  {mode:10s} test {statistics.fmean(test):6.2f} ± {spread:.2f}"
            line += f"  dev {statistics.fmean(100 * r.dev for r in runs):6.2f}"
            line += f"  epochs {[r.epochs for r in runs]}"
            if mode == FeatureMode.SCALAR_MIX.value:
                weights = [[round(w, 2) for w in r.mix_weights or []] for r in runs]
                line += f"  weights {weights}  gamma {[round(r.gamma or 0, 2) for r in runs]}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
