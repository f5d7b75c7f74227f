"""Do two finished pipelines hold the same results? For a change that should alter structure
only: run the same preset on a checkout of each commit and compare their workspaces.

    .venv/bin/python tools/compare_runs.py BEFORE AFTER

Compares every result file (``elmolab.io.results.reproducible_results``: the biLM's and control's
metrics, every probe run's metrics, online code and test predictions, every extraction record,
the task model's and the polysemy stage's results) without timings, and the report's
``summary.json`` without timings and the commit it names (where neither workspace has a report,
e.g. a probe stage run alone by ``bench/probe_stage.py``, the results only).
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


def _summary(root: Path) -> dict | None:
    """The report's summary without what names the run; None where no report was made (e.g. a
    probe stage run on its own)."""
    path = root / "artifacts" / "report" / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
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
    summaries = _summary(args.before), _summary(args.after)
    same_summary = summaries[0] == summaries[1]
    if not same_summary:
        print("differs: report/summary.json")
    summary = (
        "in neither" if summaries == (None, None) else "the same" if same_summary else "differs"
    )
    predictions = sum(name.endswith(".txt") for name in before)
    print(
        f"{len(before)} vs {len(after)} result files ({predictions} prediction files):"
        f" {len(differ)} differ, {len(only)} in one only; report summary {summary}"
    )
    return int(bool(differ or only or not same_summary))


if __name__ == "__main__":
    sys.exit(main())
