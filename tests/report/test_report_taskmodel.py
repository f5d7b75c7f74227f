"""The report's task-model section: the task model stage's summary (as the stage computes it
from per-seed results) shown in index.html and summary.md, and carried whole into summary.json;
a report without it says what is missing. And the trained biLM tested against random init."""

import json

import pytest
from fixtures.report.fake_artifacts import (
    build_report,
    task_model_runs,
    write,
    write_fake_artifacts,
)

from elmolab.taskmodel.runs import markdown_table, summarize

TEST_F1 = {  # run input -> target test F1 of seeds 1, 2, 3
    "baseline": [80.0, 80.6, 80.3],
    "elmo_trained": [84.1, 84.9, 84.4],
    "elmo_random": [80.2, 80.1, 80.9],
    "elmo_random_2": [79.8, 80.4, 80.0],
    "finetune_trained": [84.5, 85.3, 84.6],
}
POOLED = {  # summary input -> its runs' inputs: the random control pools two instances
    "baseline": ["baseline"],
    "elmo_trained": ["elmo_trained"],
    "elmo_random": ["elmo_random", "elmo_random_2"],
    "finetune_trained": ["finetune_trained"],
}


def _summary() -> dict:
    return summarize(task_model_runs(TEST_F1), POOLED, max_epochs=20, samples=500)


def test_the_task_model_section_shows_every_input_and_its_gain(tmp_path):
    write_fake_artifacts(tmp_path, model=False)
    summary = _summary()
    write(tmp_path / "artifacts" / "taskmodel" / "metrics.json", summary)
    report, out = build_report(tmp_path, polysemy=False)
    assert report["taskmodel"] == summary
    trained = summary["vs_baseline"]["elmo_trained"]
    markdown = (out / "summary.md").read_text()
    page = (out / "index.html").read_text()
    assert "## ELMo in a task model" in markdown and 'id="task-model"' in page
    for text in (markdown, page):
        assert f"{summary['inputs']['elmo_trained']['mean']:.2f} ± " in text
        gain = f"{trained['effect']:+.2f} [{trained['low']:+.2f}, {trained['high']:+.2f}]"
        assert gain in text and f"{100 * trained['relative']:+.1f}%" in text
        assert "random init (frozen, 2 instances)" in text and "| 3 x 2 |" in markdown
        assert "p (Holm)" in text and "Holm-adjusted over the 3 inputs compared" in text
        assert "0 of 15 runs hit the epoch cap (20 epochs)" in text
        assert "fine-tuned" in text and "against frozen: +" in text
    assert "finetune_trained against elmo_trained" in markdown_table(summary)


def test_without_the_task_model_the_report_says_so(tmp_path):
    write_fake_artifacts(tmp_path, model=False)
    report, out = build_report(tmp_path, polysemy=False)
    assert report["taskmodel"] is None
    assert any("no task-model results" in line for line in report["missing"])
    assert "## ELMo in a task model" not in (out / "summary.md").read_text()
    assert json.loads((out / "summary.json").read_text())["taskmodel"] is None


def test_the_trained_bilm_is_tested_against_random_init(tmp_path):
    """Every task and mode with both encoders: the trained biLM against the random-init control,
    with the same test as against the token layer, in the report and summary.json."""
    write_fake_artifacts(tmp_path, model=False)
    report, out = build_report(tmp_path, polysemy=False)
    comparisons = report["trained_vs_random"]["comparisons"]
    assert comparisons and all(c["p_value"] is not None for c in comparisons)
    first = comparisons[0]
    assert first["baseline"] == "random" and first["encoder"] == "trained"
    assert first["difference"] == pytest.approx(first["encoder_mean"] - first["baseline_mean"])
    markdown = (out / "summary.md").read_text()
    assert "## Trained biLM vs random init" in markdown
    assert "Trained biLM vs random init (Holm-adjusted p < 0.05):" in markdown


def test_an_older_task_model_summary_is_listed_as_missing_not_shown(tmp_path):
    """A summary from before the two-level test (``vs_baseline`` rows of ``absolute`` and a
    t-test's ``p_value``): the report says to rerun the stage instead of failing."""
    from elmolab.report.collect import read_taskmodel

    old = {"inputs": {}, "vs_baseline": {"elmo_trained": {"absolute": 2.35, "p_value": 0.009}}}
    (tmp_path / "metrics.json").write_text(json.dumps(old), encoding="utf-8")
    missing: list[str] = []
    assert read_taskmodel(tmp_path, missing) is None
    (line,) = missing
    assert "older task model stage" in line and "dvc repro taskmodel" in line


def test_a_pooled_control_is_named_by_its_role():
    """The stage pools a control's instances under the control's name (``controls``' key): the
    table names it by its role, as every other table names that control."""
    from elmolab.report.collect import Display
    from elmolab.report.sections.task_model import task_model_label

    display = Display(main="trained", random="random", token_layer="token_only")
    assert task_model_label("elmo_token_layer", display, 3) == (
        "+ mix of trained token layer + random LSTMs (frozen, 3 instances)"
    )
    assert (
        task_model_label("elmo_random", display, 3) == "+ mix of random init (frozen, 3 instances)"
    )
    assert task_model_label("elmo_trained", display) == "+ mix of trained biLM (frozen)"
