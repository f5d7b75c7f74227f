"""A W&B report comparing layer-wise and scalar-mixed features (``wandb-workspaces``, the
``reports`` extra), built from the metric names and run config of :mod:`elmolab.tracking`.

The report has the pretraining curves (``val/ppl*`` and ``train/loss`` against training steps),
then per probing task a bar chart of the test metric grouped by feature mode (mean over seeds,
error bars one standard deviation), trained and random encoders as two run sets, and the learned
scalar-mix weights (``mix/w0..2``). Every run set is restricted to one W&B group: one DVC
experiment or one sweep.

Building needs no network; saving does. The command line uploads only when asked::

    python -m elmolab.wandb_report --project elmolab --entity ME --group EXP [--upload]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from elmolab.errors import ElmolabError
from elmolab.tracking import (
    PRETRAIN_CURVES,
    PRETRAIN_STEP,
    TRAIN_LOSS,
    has_api_key,
    metric_key,
    mix_keys,
    network_available,
)

# Task -> the metric its probe runs log (test/<metric>); WSD 1-NN logs F1 on the Raganato sets.
TASK_METRICS = {
    "upos": "accuracy",
    "xpos": "accuracy",
    "chunk": "span_f1",
    "ner": "span_f1",
    "deplabel": "accuracy",
    "wsd": "f1",
    "upos_control": "accuracy",
}
ENCODERS = ("trained", "random")
N_LAYERS = 3  # biLM layers the scalar mix weights: char CNN + 2 LSTM layers


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
    task_metrics: Mapping[str, str] = TASK_METRICS,
) -> Any:
    """The report (a ``wandb_workspaces.reports.v2.Report``) for the runs of ``group``."""
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
            "feature mode (bars: mean over seeds, error bars: standard deviation), for the "
            "trained biLM and its random-initialisation control, then the scalar-mix weights "
            "the probe learned per layer. The local report (artifacts/report/index.html) adds "
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
    for task, metric in task_metrics.items():
        test_metric = metric_key("test", metric)
        blocks += [
            wr.H3(f"{task} ({metric.replace('_', ' ')})"),
            wr.PanelGrid(
                runsets=[runset(f"{task} {e}", "probe", task=task, encoder=e) for e in ENCODERS],
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
    args = parser.parse_args(argv)
    try:
        report = build_report(args.project, args.entity, args.group)
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
