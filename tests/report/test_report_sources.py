"""The report reads probe results from Hydra multirun and run folders as well as the DVC tree."""

import shutil

import pytest
from fixtures.report.fake_artifacts import DISPLAY, EXPECTED, write_probe_runs

from elmolab.core.errors import ElmolabError
from elmolab.report.collect import collect, probe_roots


def _split_into_jobs(probes, multirun):
    """A multirun folder as `python pipelines/probe.py -m task=...` writes it: one job a task."""
    for number, task in enumerate(sorted(p.name for p in probes.iterdir())):
        shutil.copytree(probes / task, multirun / str(number) / "probes" / task)
        (multirun / str(number) / ".hydra").mkdir()
    return multirun


def test_a_multirun_folder_is_read_job_by_job(tmp_path):
    write_probe_runs(tmp_path / "all")
    multirun = _split_into_jobs(tmp_path / "all", tmp_path / "multirun" / "2026-12-03_10-00-00")
    roots = probe_roots(multirun)
    assert [root.parent.name for root in roots] == [str(n) for n in range(len(roots))]
    inputs = collect(
        tmp_path / "no_bilm",
        tmp_path / "no_random",
        tmp_path / "none",
        [multirun],
        display=DISPLAY,
        expected=EXPECTED,
    )
    expected = collect(
        tmp_path / "no_bilm",
        tmp_path / "no_random",
        tmp_path / "all",
        display=DISPLAY,
        expected=EXPECTED,
    )
    key = lambda r: (r.task, r.features, r.encoder, r.seed)  # noqa: E731
    assert sorted(map(key, inputs.probes)) == sorted(map(key, expected.probes))
    assert {r.task for r in inputs.probes} == {
        "upos",
        "xpos",
        "chunk",
        "ner",
        "deplabel",
        "upos_control",
        "wsd",
    }


def test_a_run_folder_and_the_dvc_tree_add_up(tmp_path):
    write_probe_runs(tmp_path / "dvc", encoders=("trained",))
    write_probe_runs(tmp_path / "outputs" / "run" / "probes", encoders=("random",))
    inputs = collect(
        tmp_path / "b",
        tmp_path / "r",
        tmp_path / "dvc",
        [tmp_path / "outputs" / "run"],
        display=DISPLAY,
        expected=EXPECTED,
    )
    assert {r.encoder for r in inputs.probes} == {"trained", "random"}


def test_a_run_found_twice_or_a_missing_source_is_an_error(tmp_path):
    bilm, random, dvc = tmp_path / "b", tmp_path / "r", tmp_path / "dvc"
    write_probe_runs(dvc)
    with pytest.raises(ElmolabError, match=r"same probe run .* is also in"):
        collect(bilm, random, dvc, [dvc], display=DISPLAY, expected=EXPECTED)
    with pytest.raises(ElmolabError, match=r"report\.sources: no such folder"):
        collect(bilm, random, dvc, [tmp_path / "nowhere"], display=DISPLAY, expected=EXPECTED)
