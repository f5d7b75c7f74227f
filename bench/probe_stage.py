"""Time the whole probe stage on a finished run's cached features, cell after cell as DVC runs it.

Each cell of ``grid.tasks`` runs as ``dvc repro`` would run it (``python pipelines/probe.py
--params params.yaml task=<name>``, one process per cell, one after the other, with the
Makefile's environment), in a scratch folder whose ``params.yaml`` is the composition of this
checkout's ``conf/`` with the given Hydra overrides, and whose ``data/`` and
``artifacts/features/`` are the finished run's (read only). Its probe results go to the scratch
folder, never to the run's. Prints each cell's wall time and the stage's, with the CPU model.

Run: .venv/bin/python bench/probe_stage.py WORKSPACE [OVERRIDE ...] [--tasks upos deparc]
e.g. ``bench/probe_stage.py ../run experiment=accuracy`` times the grid without the information
measures (WORKSPACE: a finished default run, e.g. a fresh clone after ``make run``). Another
busy process on the machine slows the cells: time on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import yaml

from elmolab.core.hardware import cpu_model
from elmolab.core.params import compose_params

ROOT = Path(__file__).resolve().parents[1]


def makefile_env() -> dict[str, str]:
    """The variables the Makefile exports to every stage (``export NAME := value`` with a
    literal value: DVC's and W&B's switches, glibc's keeping large buffers mapped), read from
    the Makefile so that the cells run as ``make run`` runs them."""
    exports = dict(
        re.findall(r"^export (\w+) := ([^$\s]+)$", (ROOT / "Makefile").read_text(), re.M)
    )
    if not any(name.startswith("MALLOC_") for name in exports):
        sys.exit("Makefile: no 'export MALLOC_...' settings to run the cells as make runs them")
    return exports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path, help="a finished run: data/, artifacts/features/")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=accuracy")
    parser.add_argument("--tasks", nargs="+", help="these cells only (default: every one)")
    parser.add_argument("--keep", type=Path, help="write the cells' results here (else a temp dir)")
    args = parser.parse_intermixed_args()
    workspace = args.workspace.resolve()
    features = workspace / "artifacts" / "features"
    if not features.is_dir() or not (workspace / "data").is_dir():
        sys.exit(f"{workspace}: no artifacts/features/ or data/ (run the pipeline there first)")
    params = compose_params(ROOT / "conf", args.overrides)
    tasks = list(yaml.safe_load(params)["grid"]["tasks"])
    for name in args.tasks or []:
        if name not in tasks:
            sys.exit(f"--tasks: {name!r} is not a cell of grid.tasks ({', '.join(tasks)})")
    cells = args.tasks or tasks
    env = {**os.environ, **makefile_env(), "WANDB_MODE": "disabled"}
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; overrides: {args.overrides or 'none'}")
    keep = nullcontext(str(args.keep)) if args.keep else None
    with keep or tempfile.TemporaryDirectory(prefix="probe_stage_") as folder:
        scratch = Path(folder).resolve()
        (scratch / "artifacts").mkdir(parents=True, exist_ok=True)
        for link, target in (
            (scratch / "data", workspace / "data"),
            (scratch / "artifacts" / "features", features),
        ):
            if not link.is_symlink() and not link.exists():
                link.symlink_to(target)
            elif link.resolve() != target.resolve():
                sys.exit(f"{link} exists and is not a link to {target}: use another --keep")
        (scratch / "params.yaml").write_text(params, encoding="utf-8")
        times = {}
        for name in cells:
            log = scratch / f"probe_{name}.log"
            started = time.perf_counter()
            with log.open("w", encoding="utf-8") as out:
                done = subprocess.run(
                    [
                        sys.executable,
                        str(ROOT / "pipelines" / "probe.py"),
                        "--params",
                        "params.yaml",
                        f"task={name}",
                    ],
                    cwd=scratch,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            times[name] = time.perf_counter() - started
            if done.returncode:
                tail = log.read_text(encoding="utf-8").splitlines()[-20:]
                sys.exit(f"cell {name} failed (exit {done.returncode}):\n" + "\n".join(tail))
            print(f"{name:14s} {times[name]:7.1f} s", flush=True)
        total = sum(times.values())
        print(f"{'stage':14s} {total:7.1f} s = {total / 60:.1f} min ({len(cells)} cells)")


if __name__ == "__main__":
    main()
