"""Peak resident memory of every stage of a preset (smoke by default), or of a finished run.

    .venv/bin/python bench/memory.py                      # runs the smoke preset's stages
    .venv/bin/python bench/memory.py experiment=default   # any Hydra overrides of conf/
    .venv/bin/python bench/memory.py --workspace DIR      # reads a finished run's figures

The first form composes the preset into a scratch workspace (``data`` linked to this checkout's
data, outputs under its own ``artifacts/``) and runs each stage's command of ``dvc.yaml``, in
order, as a child process; the kernel reports the child's peak resident memory when it ends
(``os.wait4``: the largest of the stage's process and its workers). The second reads what the
stages record themselves (``peak_rss_bytes``, ``peak_rss_children_bytes``) in
``artifacts/bilm/metrics.json``, ``bilm_random/metrics.json``, ``taskmodel/metrics.json``, the
extraction records ``features/*/*/extract.json`` and every probe run's ``metrics.json`` (the
largest per stage).
Figures are MiB (2**20 bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ROOT / "pipelines"
MIB = 2**20


def stage_commands(params: dict) -> list[tuple[str, list[str]]]:
    """The main study's stages in dvc.yaml's order: name and command (relative to the
    workspace, ``params.yaml`` read there)."""

    def script(name: str, *args: str) -> list[str]:
        return [sys.executable, str(PIPELINES / f"{name}.py"), "--params", "params.yaml", *args]

    stages = [("prepare", script("prepare")), ("pretrain", script("pretrain"))]
    stages += [
        (f"pretrain_random@{name}", script("pretrain", "--random-control", name))
        for name in params["controls"]["random"]
    ]
    stages += [
        (f"token_control@{name}", script("token_control", "--instance", name))
        for name in params["controls"]["token_layer"]
    ]
    stages += [
        (f"extract@{name}", script("extract", f"extract.dataset={name}"))
        for name in params["extract"]["datasets"]
    ]
    stages += [
        (f"probe@{task}", script("probe", f"task={task}")) for task in params["grid"]["tasks"]
    ]
    return [*stages, ("taskmodel", script("taskmodel")), ("report", script("report"))]


def run_stages(overrides: list[str]) -> list[tuple[str, float, float]]:
    """Run every stage in a scratch workspace: (stage, peak RSS MiB, wall seconds)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="elmolab-memory-") as scratch:
        work = Path(scratch)
        (work / "data").symlink_to(ROOT / "data")
        compose = [sys.executable, "-m", "elmolab.core.params", "--conf", str(ROOT / "conf")]
        subprocess.run([*compose, *overrides], cwd=work, check=True)
        params = yaml.safe_load((work / "params.yaml").read_text(encoding="utf-8"))
        for name, command in stage_commands(params):
            started = time.perf_counter()
            child = subprocess.Popen(command, cwd=work, stdout=subprocess.DEVNULL)
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            if child.returncode != 0:
                raise SystemExit(f"stage {name} failed (exit {child.returncode})")
            rows.append((name, usage.ru_maxrss * 1024 / MIB, time.perf_counter() - started))
            print(f"{name:32s} {rows[-1][1]:9,.0f} MiB {rows[-1][2]:8,.0f} s", flush=True)
    return rows


def recorded(workspace: Path) -> list[tuple[str, float, float]]:
    """The stages' own figures in a finished workspace: (stage, peak MiB, workers' peak MiB)."""
    artifacts = workspace / "artifacts"
    groups: dict[str, list[Path]] = {}
    own_stages = {"bilm": "pretrain", "taskmodel": "taskmodel"}
    own_stages |= {
        path.parent.name: f"pretrain_random@{path.parent.name.removeprefix('bilm_')}"
        for path in artifacts.glob("bilm_random*/metrics.json")
    }
    for name, stage in own_stages.items():
        if (artifacts / name / "metrics.json").is_file():
            groups[stage] = [artifacts / name / "metrics.json"]
    for path in sorted((artifacts / "features").glob("*/*/extract.json")):
        groups.setdefault(f"extract@{path.parent.name}", []).append(path)
    for path in sorted((artifacts / "probes").rglob("metrics.json")):
        task = path.relative_to(artifacts / "probes").parts[0]
        groups.setdefault(f"probe@{task}", []).append(path)
    rows = []
    for stage, paths in groups.items():
        figures = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
        own = [f["peak_rss_bytes"] for f in figures if "peak_rss_bytes" in f]
        workers = [f.get("peak_rss_children_bytes", 0) for f in figures if "peak_rss_bytes" in f]
        if own:
            rows.append((stage, max(own) / MIB, max(workers) / MIB))
    if not rows:
        raise SystemExit(f"no recorded peak memory under {artifacts} (a run of an older version?)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, help="read a finished run's figures instead")
    parser.add_argument("overrides", nargs="*", default=["experiment=smoke"])
    args = parser.parse_args()
    if args.workspace is not None:
        print(f"{'stage':32s} {'peak RSS':>13s} {'largest worker':>15s}")
        for stage, own, workers in recorded(args.workspace):
            print(f"{stage:32s} {own:9,.0f} MiB {workers:11,.0f} MiB")
        return
    print(f"{'stage':32s} {'peak RSS':>13s} {'wall':>10s}   ({' '.join(args.overrides)})")
    rows = run_stages(args.overrides)
    print(f"{'largest':32s} {max(r[1] for r in rows):9,.0f} MiB")


if __name__ == "__main__":
    main()
