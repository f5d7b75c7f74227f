"""The W&B report's structure, built offline (no network; skipped without wandb-workspaces)."""

from pathlib import Path

import pytest

wr = pytest.importorskip("wandb_workspaces.reports.v2", reason="needs the reports extra")

from fixtures.report.fake_artifacts import write_probe_runs  # noqa: E402

from elmolab.core.errors import ElmolabError  # noqa: E402
from elmolab.core.tracking import PRETRAIN_CURVES, PRETRAIN_STEP, mix_keys  # noqa: E402
from elmolab.report.wandb_report import (  # noqa: E402
    build_report,
    main,
    study_display,
    tasks_in_results,
)

# The fake results' tasks and metrics, in the local report's display order.
ROOT = Path(__file__).resolve().parents[2]
STUDY = study_display(ROOT / "params.yaml")  # the default study's order of tasks and encoders
TASK_METRICS = {
    "upos": "accuracy",
    "xpos": "accuracy",
    "chunk": "span_f1",
    "ner": "span_f1",
    "deplabel": "accuracy",
    "wsd": "f1",
    "upos_control": "accuracy",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    probes = tmp_path_factory.mktemp("artifacts") / "probes"
    write_probe_runs(probes)
    return probes


@pytest.fixture(scope="module")
def report(results):
    return build_report("elmolab", "my-team", "exp-tidy-owl", tasks_in_results(results, STUDY))


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


def test_tasks_and_encoders_come_from_the_results(results, tmp_path):
    tasks = tasks_in_results(results, STUDY)
    assert {task: runs.metric for task, runs in tasks.items()} == TASK_METRICS
    assert list(tasks) == list(TASK_METRICS)
    assert all(runs.encoders == ("trained", "random") for runs in tasks.values())
    # A task and an encoder the code has never heard of.
    probes = tmp_path / "probes"
    write_probe_runs(probes, encoders=("trained", "elmo_small"))
    (probes / "upos").rename(probes / "pos_ptb")
    for path in (probes / "pos_ptb").glob("*/*/seed*/metrics.json"):
        path.write_text(path.read_text().replace('"task": "upos"', '"task": "pos_ptb"'))
    tasks = tasks_in_results(probes, STUDY)
    assert "pos_ptb" in tasks and "upos" not in tasks
    assert tasks["pos_ptb"].encoders == ("trained", "elmo_small")
    report = build_report("p", "e", "g", tasks)
    headings = [b.text for b in report.blocks if isinstance(b, wr.H3)]
    assert "pos_ptb (accuracy)" in headings


def test_no_results_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(ElmolabError, match="no probe results"):
        tasks_in_results(tmp_path / "missing")
    assert (
        main(["--project", "p", "--entity", "e", "--group", "g", "--results", str(tmp_path)]) == 2
    )
    assert "no probe results" in capsys.readouterr().err


def test_cli_builds_without_uploading(capsys, results):
    assert main(["--project", "p", "--entity", "e", "--group", "g", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "16 panels" in out and "not uploaded" in out
