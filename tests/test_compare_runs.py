"""tools/compare_runs.py: two workspaces' results, timings aside."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _workspace(root: Path, seconds: float, prediction: str, commit: str) -> Path:
    artifacts = root / "artifacts"
    files = {
        "bilm/metrics.json": {"val": {"ppl": 200.5}, "wall_seconds": seconds},
        "bilm_random/metrics.json": {"ppl": 33148.4},
        "probes/upos/layer1/trained/seed1/metrics.json": {
            "test": 0.9,
            "history": [{"epoch": 1, "wall_seconds": seconds}],
        },
        "report/summary.json": {"code_version": {"commit": commit}, "probes": {"upos": 0.9}},
    }
    for name, content in files.items():
        (artifacts / name).parent.mkdir(parents=True, exist_ok=True)
        (artifacts / name).write_text(json.dumps(content))
    run = artifacts / "probes/upos/layer1/trained/seed1"
    (run / "test_predictions.txt").write_text(prediction)
    return root


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess:
    tool = ROOT / "tools" / "compare_runs.py"
    return subprocess.run([sys.executable, tool, a, b], capture_output=True, text=True)


def test_runs_that_differ_only_in_timings_and_commit_are_the_same(tmp_path: Path) -> None:
    a = _workspace(tmp_path / "a", 10.0, "NOUN VERB\n", "abc")
    b = _workspace(tmp_path / "b", 12.5, "NOUN VERB\n", "def")
    proc = _compare(a, b)
    assert proc.returncode == 0, proc.stdout
    assert "4 vs 4 result files (1 prediction files): 0 differ" in proc.stdout


def test_a_changed_prediction_is_named(tmp_path: Path) -> None:
    a = _workspace(tmp_path / "a", 10.0, "NOUN VERB\n", "abc")
    b = _workspace(tmp_path / "b", 10.0, "NOUN NOUN\n", "abc")
    proc = _compare(a, b)
    assert proc.returncode == 1
    assert "differs: probes/upos/layer1/trained/seed1/test_predictions.txt" in proc.stdout


def test_a_changed_task_model_score_is_named(tmp_path: Path) -> None:
    a = _workspace(tmp_path / "a", 10.0, "NOUN VERB\n", "abc")
    b = _workspace(tmp_path / "b", 10.0, "NOUN VERB\n", "abc")
    for root, f1 in ((a, 72.4), (b, 72.5)):
        run = root / "artifacts/taskmodel/elmo_trained/seed1/metrics.json"
        run.parent.mkdir(parents=True)
        run.write_text(json.dumps({"test_f1": f1, "wall_seconds": f1}))
    proc = _compare(a, b)
    assert proc.returncode == 1
    assert "differs: taskmodel/elmo_trained/seed1/metrics.json" in proc.stdout


def test_probe_stages_run_alone_compare_without_a_report(tmp_path: Path) -> None:
    a = _workspace(tmp_path / "a", 10.0, "NOUN VERB\n", "abc")
    b = _workspace(tmp_path / "b", 11.0, "NOUN VERB\n", "abc")
    for root in (a, b):
        (root / "artifacts/report/summary.json").unlink()
    proc = _compare(a, b)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.strip().endswith("report summary in neither")
