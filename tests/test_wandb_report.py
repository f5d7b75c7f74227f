"""The W&B report's structure, built offline (no network; skipped without wandb-workspaces)."""

import pytest

wr = pytest.importorskip("wandb_workspaces.reports.v2", reason="needs the reports extra")

from elmolab.tracking import PRETRAIN_CURVES, PRETRAIN_STEP, mix_keys  # noqa: E402
from elmolab.wandb_report import TASK_METRICS, build_report, main  # noqa: E402


@pytest.fixture(scope="module")
def report():
    return build_report("elmolab", "my-team", "exp-tidy-owl")


def grids(report) -> list:
    return [block for block in report.blocks if isinstance(block, wr.PanelGrid)]


def test_report_has_pretraining_then_one_grid_per_task(report):
    assert report.project == "elmolab" and report.entity == "my-team"
    headings = [b.text for b in report.blocks if isinstance(b, wr.H3)]
    assert headings == [f"{t} ({m.replace('_', ' ')})" for t, m in TASK_METRICS.items()]
    assert len(grids(report)) == 1 + len(TASK_METRICS)
    assert isinstance(report.blocks[0], wr.H1)


def test_pretraining_curves_use_the_tracked_metric_names(report):
    pretraining = grids(report)[0]
    curves, loss = pretraining.panels
    assert isinstance(curves, wr.LinePlot) and curves.x == PRETRAIN_STEP
    assert curves.y == list(PRETRAIN_CURVES) and curves.log_y
    assert loss.y == ["train/loss"]
    assert pretraining.runsets[0].filters == (
        "Metric(\"Group\") == 'exp-tidy-owl' and Metric(\"JobType\") == 'pretrain'"
    )


def test_each_task_compares_feature_modes_for_trained_and_random(report):
    for grid, (task, metric) in zip(grids(report)[1:], TASK_METRICS.items(), strict=True):
        assert [r.name for r in grid.runsets] == [f"{task} trained", f"{task} random"]
        for runset, encoder in zip(grid.runsets, ("trained", "random"), strict=True):
            assert f"Config(\"task\") == '{task}'" in runset.filters
            assert f"Config(\"encoder\") == '{encoder}'" in runset.filters
            assert "Metric(\"Group\") == 'exp-tidy-owl'" in runset.filters
        scores, weights = grid.panels
        assert isinstance(scores, wr.BarPlot) and scores.metrics == [f"test/{metric}"]
        assert scores.groupby == wr.Config("features")
        assert (scores.groupby_aggfunc, scores.groupby_rangefunc) == ("mean", "stddev")
        assert weights.metrics == mix_keys(3) == ["mix/w0", "mix/w1", "mix/w2"]
        assert weights.groupby == wr.Config("encoder")


def test_cli_builds_without_uploading(capsys):
    assert main(["--project", "p", "--entity", "e", "--group", "g"]) == 0
    out = capsys.readouterr().out
    assert "16 panels" in out and "not uploaded" in out
