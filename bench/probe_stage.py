"""Time the whole probe stage on a finished run's cached features, cell after cell as DVC runs it.

Each cell of ``grid.tasks`` runs as ``dvc repro`` would run it (``python pipelines/probe.py
--params params.yaml task=<name>``, one process per cell, one after the other, with the
Makefile's environment), in a scratch folder whose ``params.yaml`` is the composition of this
checkout's ``conf/`` with the given Hydra overrides, and whose ``data/`` and
``artifacts/features/`` are the finished run's (read only). Its probe results go to the scratch
folder, never to the run's. Prints each cell's wall time and the stage's, with the CPU model.

With ``--against OTHER`` (another checkout of the project, e.g. a ``git worktree`` of an earlier
commit), every cell runs twice, once with each checkout's code (its ``pipelines/probe.py`` and
``src/``), in scratch folders of their own, the two in turn and the first of them alternating
from cell to cell, so that both meet the same machine: it prints both times per cell and their
ratio (this checkout's over OTHER's), and the results of both sides stay under ``--keep``
(``this/`` and ``other/``) for ``tools/compare_runs.py``.

Run: .venv/bin/python bench/probe_stage.py WORKSPACE [OVERRIDE ...] [--tasks upos deparc]
     [--against OTHER] [--keep DIR]
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
    parser.add_argument("--against", type=Path, help="another checkout: both run, side by side")
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
    sides = {"this": ROOT}
    if args.against:
        other = args.against.resolve()
        if not (other / "pipelines" / "probe.py").is_file() or not (other / "src").is_dir():
            sys.exit(f"--against {other}: not a checkout of this project (no pipelines/probe.py)")
        sides["other"] = other
    keep = nullcontext(str(args.keep)) if args.keep else None
    with keep or tempfile.TemporaryDirectory(prefix="probe_stage_") as folder:
        scratches = {
            side: scratch_folder(
                Path(folder).resolve() / side if args.against else Path(folder), workspace, params
            )
            for side in sides
        }
        times: dict[str, dict[str, float]] = {side: {} for side in sides}
        for number, name in enumerate(cells):
            order = list(sides) if number % 2 == 0 else list(reversed(sides))
            for side in order:
                times[side][name] = run_cell(sides[side], scratches[side], name, env)
            if args.against:
                this, other = times["this"][name], times["other"][name]
                print(f"{name:14s} {this:7.1f} s against {other:7.1f} s: {this / other:.3f}x")
            else:
                print(f"{name:14s} {times['this'][name]:7.1f} s", flush=True)
        total = {side: sum(cell_times.values()) for side, cell_times in times.items()}
        if args.against:
            print(
                f"{'stage':14s} {total['this']:7.1f} s against {total['other']:7.1f} s:"
                f" {total['this'] / total['other']:.3f}x ({len(cells)} cells; this: {ROOT},"
                f" other: {sides['other']})"
            )
        else:
            this = total["this"]
            print(f"{'stage':14s} {this:7.1f} s = {this / 60:.1f} min ({len(cells)} cells)")


def scratch_folder(scratch: Path, workspace: Path, params: str) -> Path:
    """``scratch`` made a workspace of its own: the run's ``data/`` and features linked in, and
    ``params.yaml``."""
    (scratch / "artifacts").mkdir(parents=True, exist_ok=True)
    for link, target in (
        (scratch / "data", workspace / "data"),
        (scratch / "artifacts" / "features", workspace / "artifacts" / "features"),
    ):
        if not link.is_symlink() and not link.exists():
            link.symlink_to(target)
        elif link.resolve() != target.resolve():
            sys.exit(f"{link} exists and is not a link to {target}: use another --keep")
    (scratch / "params.yaml").write_text(params, encoding="utf-8")
    return scratch


def run_cell(checkout: Path, scratch: Path, name: str, env: dict[str, str]) -> float:
    """Run the probe cell ``name`` in ``scratch`` with ``checkout``'s code; its wall time."""
    log = scratch / f"probe_{name}.log"
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        done = subprocess.run(
            [
                sys.executable,
                str(checkout / "pipelines" / "probe.py"),
                "--params",
                "params.yaml",
                f"task={name}",
            ],
            cwd=scratch,
            env={**env, "PYTHONPATH": str(checkout / "src")},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    elapsed = time.perf_counter() - started
    if done.returncode:
        tail = log.read_text(encoding="utf-8").splitlines()[-20:]
        sys.exit(
            f"cell {name} failed with {checkout} (exit {done.returncode}):\n" + "\n".join(tail)
        )
    return elapsed


if __name__ == "__main__":
    main()
