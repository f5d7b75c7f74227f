"""A W&B report comparing layer-wise and scalar-mixed features (``wandb-workspaces``, the
``reports`` extra), built from the metric names and run config of :mod:`elmolab.core.tracking`.

The report has the pretraining curves (``val/ppl*`` and ``train/loss`` against training steps),
then per probing task a bar chart of the test metric grouped by feature mode (mean over seeds,
error bars one standard deviation), one run set per encoder, and the learned scalar-mix weights
(``mix/w0..2``). Every run set is restricted to one W&B group: one DVC experiment or one sweep.

The tasks, their metrics and the encoders come from the probe stage's results
(``artifacts/probes`` by default, :func:`tasks_in_results`), so a task added by configuration
gets its section without a change here. Building needs no network; saving does. The command line
uploads only when asked::

    python -m elmolab.report.wandb_report --project elmolab --entity ME --group EXP [--upload]
        [--results artifacts/probes]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmolab.core.errors import ElmolabError
from elmolab.core.tracking import (
    PRETRAIN_CURVES,
    PRETRAIN_STEP,
    TRAIN_LOSS,
    has_api_key,
    metric_key,
    mix_keys,
    network_available,
)
from elmolab.report.collect import BY_NAME, Display, read_probe_runs

N_LAYERS = 3  # biLM layers the scalar mix weights: char CNN + 2 LSTM layers
DEFAULT_RESULTS = Path("artifacts") / "probes"


@dataclass(frozen=True)
class TaskRuns:
    """What the probe runs of one task log: ``test/<metric>``, for these encoders."""

    metric: str
    encoders: tuple[str, ...]


def tasks_in_results(probes_dir: Path, display: Display = BY_NAME) -> dict[str, TaskRuns]:
    """Every task with a scored run under ``probes_dir`` (the probe stage's output layout), its
    metric and its encoders, in ``display`` order (the local report's: :func:`study_display`)."""
    if not probes_dir.is_dir():
        raise ElmolabError("no probe results: run the probe stage first (dvc repro)", probes_dir)
    metrics: dict[str, str] = {}
    encoders: dict[str, set[str]] = {}
    for run in read_probe_runs(probes_dir):
        if run.applicable and run.metric:
            metrics.setdefault(run.task, run.metric)
            encoders.setdefault(run.task, set()).add(run.encoder)
    if not metrics:
        raise ElmolabError("no probe results in this folder: run the probe stage first", probes_dir)
    return {
        task: TaskRuns(metrics[task], tuple(display.ordered_encoders(encoders[task])))
        for task in display.ordered_tasks(metrics)
    }


def study_display(params: Path) -> Display:
    """The local report's display of the study whose composed config is ``params``; by name
    when there is no such file."""
    if not params.is_file():
        return BY_NAME
    from elmolab.core.config import load_params

    return Display.of(load_params(params), where=str(params))


def _reports() -> Any:
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError:
        raise ElmolabError(
            "the W&B report needs wandb-workspaces: pip install -e '.[reports]'"
        ) from None
    return wr


def build_report(
    project: str,
    entity: str,
    group: str,
    tasks: Mapping[str, TaskRuns],
) -> Any:
    """The report (a ``wandb_workspaces.reports.v2.Report``) for the runs of ``group``, with a
    section per task of ``tasks`` (:func:`tasks_in_results`)."""
    wr = _reports()
    from wandb_workspaces import expr

    def runset(name: str, job_type: str, **config: str) -> Any:
        filters = [expr.Metric("Group") == group, expr.Metric("JobType") == job_type]
        filters += [expr.Config(key) == value for key, value in config.items()]
        return wr.Runset(entity=entity, project=project, name=name, filters=expr.And(*filters))

    blocks: list[Any] = [
        wr.H1("Layer-wise vs scalar-mixed biLM features"),
        wr.P(
            f"Runs of group {group!r}. Each probing task shows its test metric for every "
            "feature mode (bars: mean over seeds, error bars: standard deviation), for each "
            "encoder (the trained biLM and its controls), then the scalar-mix weights the probe "
            "learned per layer. The local report (artifacts/report/index.html) adds "
            "significance tests."
        ),
        wr.H2("Pretraining"),
        wr.PanelGrid(
            runsets=[runset("pretraining", "pretrain")],
            panels=[
                wr.LinePlot(
                    title="Validation perplexity (forward, backward, mean)",
                    x=PRETRAIN_STEP,
                    y=list(PRETRAIN_CURVES),
                    log_y=True,
                    title_x="training steps",
                ),
                wr.LinePlot(title="Training loss", x=PRETRAIN_STEP, y=[TRAIN_LOSS]),
            ],
        ),
        wr.H2("Probing: every feature mode, per task"),
    ]
    for task, runs in tasks.items():
        metric = runs.metric
        test_metric = metric_key("test", metric)
        blocks += [
            wr.H3(f"{task} ({metric.replace('_', ' ')})"),
            wr.PanelGrid(
                runsets=[
                    runset(f"{task} {e}", "probe", task=task, encoder=e) for e in runs.encoders
                ],
                panels=[
                    wr.BarPlot(
                        title=f"{task}: {test_metric} by feature mode",
                        metrics=[test_metric],
                        groupby=wr.Config("features"),
                        groupby_aggfunc="mean",
                        groupby_rangefunc="stddev",
                        orientation="v",
                    ),
                    wr.BarPlot(
                        title=f"{task}: learned scalar-mix weights per layer",
                        metrics=mix_keys(N_LAYERS),
                        groupby=wr.Config("encoder"),
                        groupby_aggfunc="mean",
                        groupby_rangefunc="stddev",
                        orientation="v",
                    ),
                ],
            ),
        ]
    return wr.Report(
        project=project,
        entity=entity,
        title="elmolab: layer-wise vs scalar-mixed features",
        description=f"Probing results of W&B group {group!r}",
        blocks=blocks,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", required=True, help="W&B project (the config's study)")
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--group", required=True, help="W&B group: DVC experiment or sweep id")
    parser.add_argument("--upload", action="store_true", help="save the report to W&B")
    parser.add_argument(
        "--results",
        type=Path,
        default=DEFAULT_RESULTS,
        help="the probe stage's results, where the tasks and encoders are found",
    )
    parser.add_argument(
        "--params",
        type=Path,
        default=Path("params.yaml"),
        help="the study's composed config: the order of tasks and encoders",
    )
    args = parser.parse_args(argv)
    try:
        tasks = tasks_in_results(args.results, study_display(args.params))
        report = build_report(args.project, args.entity, args.group, tasks)
        panels = sum(len(getattr(b, "panels", [])) for b in report.blocks)
        print(f"built report {report.title!r}: {len(report.blocks)} blocks, {panels} panels")
        if not args.upload:
            print("not uploaded (pass --upload to save it to W&B)")
            return 0
        if not has_api_key() or not network_available():
            raise ElmolabError("--upload needs WANDB_API_KEY and a network that reaches W&B")
        report.save()
        print(f"uploaded: {report.url}")
    except ElmolabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
