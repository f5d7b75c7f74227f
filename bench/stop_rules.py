"""What a stricter early-stopping rule would have saved and changed, replayed on a finished run.

Every probe run records its dev score and loss after each epoch (``history`` in metrics.json).
A rule that stops a head no later than the rule the run trained under leaves everything before
its stop as it was (heads train independently), so replaying the histories gives, exactly up to
rounding, the epoch each head would stop at and the epoch it would keep (its best dev state up
to the stop). This prints, per task, the epochs and probe seconds the rule would save and how
many runs would keep another epoch, with the dev score (the structural probe: dev loss) they
would lose. Test scores exist only for the kept epochs, so a changed run's test score is not
known here; train it to see it (``bench/mix_variants.py``).

Run: .venv/bin/python bench/stop_rules.py WORKSPACE --max-stalls 3 [--tree-max-stalls 3]
(WORKSPACE: a finished default run, e.g. a fresh clone after ``make run``). Online-code jobs
keep no histories and are left out.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from elmolab.probing.probes import Stopping

TREE_KINDS = ("arc", "structural")


@dataclass(frozen=True)
class Rule:
    """Stop a head after ``patience`` epochs without progress in a row, or ``max_stalls`` in all
    (the engine's :class:`Stopping`; each epoch without progress also cuts its learning
    rate, which decides nothing before the stop and is not replayed)."""

    patience: int
    max_stalls: float
    min_delta: float
    loss_only: bool  # progress and selection on the dev loss alone (the structural probe)

    def replay(self, history: list[dict]) -> tuple[int, int]:
        """The epoch the rule stops at (the last of ``history`` if it does not stop) and the
        epoch whose state it keeps (the best dev state up to there)."""
        head = Stopping(self.patience, self.max_stalls, self.min_delta, self.loss_only)
        for record in history:
            head.record(record["epoch"], record["dev_metric"], record["dev_loss"])
            if head.stopped:
                return record["epoch"], head.best_epoch
        return history[-1]["epoch"], head.best_epoch


def rules(params: dict, kind: str, max_stalls: int | None, tree_max_stalls: int | None):
    """The rule the run trained under and the proposed one, for a task of ``kind``."""
    probe = params["probe"]
    tree = kind in TREE_KINDS
    section = probe["tree"] if tree else probe
    recorded = section.get("max_stalls", math.inf)
    proposed = tree_max_stalls if tree else max_stalls
    loss_only = kind == "structural"
    before = Rule(section["patience"], recorded, probe["min_delta"], loss_only)
    after = Rule(
        section["patience"],
        recorded if proposed is None else proposed,
        probe["min_delta"],
        loss_only,
    )
    if after.max_stalls > before.max_stalls:
        raise SystemExit(
            f"max_stalls {after.max_stalls} is looser than the run's {before.max_stalls}: the"
            " histories stop before what that rule would train"
        )
    return before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path, help="a finished run: params.yaml, artifacts/")
    parser.add_argument("--max-stalls", type=int, help="token and pair probes")
    parser.add_argument("--tree-max-stalls", type=int, help="the tree probes")
    args = parser.parse_args()
    params = yaml.safe_load((args.workspace / "params.yaml").read_text())
    kinds = {name: task["kind"] for name, task in params["grid"]["tasks"].items()}
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    probes = args.workspace / "artifacts" / "probes"
    for path in sorted(probes.glob("*/**/metrics.json")):
        task = path.relative_to(probes).parts[0]
        metrics = json.loads(path.read_text())
        history = metrics.get("history") or []
        if not history:
            continue  # a run without training (the 1-NN word-sense probe)
        before, after = rules(params, kinds[task], args.max_stalls, args.tree_max_stalls)
        recorded, _ = before.replay(history)
        if recorded != metrics["epochs"] and not metrics["hit_epoch_cap"]:
            raise SystemExit(
                f"{path}: the replayed rule stops at epoch {recorded}, the run stopped at"
                f" {metrics['epochs']}: this run did not train under its params.yaml's rule"
            )
        stop, kept = after.replay(history)
        total = totals[task]
        total["runs"] += 1
        total["epochs"] += metrics["epochs"]
        total["epochs_after"] += stop
        total["seconds"] += metrics["wall_seconds"]
        total["seconds_after"] += metrics["wall_seconds"] * stop / metrics["epochs"]
        if kept != metrics["best_epoch"]:
            total["changed"] += 1
            was, now = history[metrics["best_epoch"] - 1], history[kept - 1]
            key = "dev_loss" if after.loss_only else "dev_metric"
            total["dev_change"] += now[key] - was[key]
    print(f"{'task':<14}{'runs':>6}{'epochs':>16}{'probe s':>18}{'changed':>9}  dev change")
    for task, total in totals.items():
        changed = int(total["changed"])
        change = total["dev_change"] / changed if changed else 0.0
        unit = "loss" if kinds[task] == "structural" else "points"
        scale = 1.0 if unit == "loss" else 100.0
        print(
            f"{task:<14}{int(total['runs']):>6}"
            f"{int(total['epochs']):>7} -> {int(total['epochs_after']):<6}"
            f"{total['seconds']:>8.0f} -> {total['seconds_after']:<7.0f}"
            f"{changed:>9}  {change * scale:+.3f} {unit} a changed run"
        )
    seconds = sum(t["seconds"] for t in totals.values())
    after = sum(t["seconds_after"] for t in totals.values())
    print(f"probe seconds (both workers, online codes left out): {seconds:.0f} -> {after:.0f}")


if __name__ == "__main__":
    main()
