"""Do two finished pipelines hold the same results? For a change that should alter structure
only: run the same preset on a checkout of each commit and compare their workspaces.

    .venv/bin/python tools/compare_runs.py BEFORE AFTER

Compares every result file (``elmolab.io.results.reproducible_results``: the biLM's and control's
metrics, every probe run's metrics, online code and test predictions, every extraction record)
without timings, and the report's ``summary.json`` without timings and the commit it names.
Prints what differs; exit status 1 when anything does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from elmolab.io.results import reproducible_results, without_timings

# summary.json fields that name the run rather than its results: the commit, the probe time
# the information measures took
RUN_FIELDS = ("code_version", "information_time")


def _summary(root: Path) -> dict:
    summary = json.loads((root / "artifacts" / "report" / "summary.json").read_text())
    return without_timings({k: v for k, v in summary.items() if k not in RUN_FIELDS})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="a workspace (repository root) after dvc repro")
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = (reproducible_results(root / "artifacts") for root in (args.before, args.after))
    differ = sorted(name for name in before.keys() & after.keys() if before[name] != after[name])
    only = sorted(before.keys() ^ after.keys())
    for name in differ:
        print(f"differs: {name}")
    for name in only:
        print(f"in one only: {name}")
    same_summary = _summary(args.before) == _summary(args.after)
    if not same_summary:
        print("differs: report/summary.json")
    predictions = sum(name.endswith(".txt") for name in before)
    print(
        f"{len(before)} vs {len(after)} result files ({predictions} prediction files):"
        f" {len(differ)} differ, {len(only)} in one only; report summary"
        f" {'the same' if same_summary else 'differs'}"
    )
    return int(bool(differ or only or not same_summary))


if __name__ == "__main__":
    sys.exit(main())
