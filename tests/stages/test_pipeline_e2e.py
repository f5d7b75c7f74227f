"""The smoke pipeline end to end with real DVC, on fresh copies of this repository (slow).

Two checkouts run ``dvc repro`` with ``experiment=smoke``:

- ``clean``: uninterrupted. Then a second ``dvc repro`` runs nothing, a changed probe learning
  rate re-runs only the probe cells and the report, a second fresh checkout gives identical
  results (``tools/compare_runs.py``), and two queued experiments run at once
  (``dvc exp run --queue`` + ``dvc queue start --jobs 2``) each equal the same settings run
  alone.
- ``killed``: the same pipeline, but SIGKILLed (failpoints, ``elmolab.core.failpoints``) mid-epoch,
  between a checkpoint's temporary file and its rename, mid-validation, and between two extracted
  splits, each time followed by ``dvc repro``. Training resumes from the last complete
  checkpoint, every metric equals the clean run's (same seed, same machine: the pipeline is
  deterministic), and DVC's cache holds the outputs ``dvc.lock`` names plus, at most, complete
  earlier versions of JSON outputs (nothing a killed stage left half-written was ever cached).

And a third, with the committed (default) ``params.yaml``, does what README tells a new user:
``make smoke``, the quick look in a workspace of its own, then ``make run``, the study.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from elmolab.core.params import compose_params
from elmolab.io.results import reproducible_results

# Each test runs whole DVC pipelines (the queued-experiments test two of them, about 10 minutes on
# a slow 2-core CPU): a hang is still caught, a slow machine is not failed for being slow.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
SMOKE = "experiment=smoke"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ELMOLAB_FAILPOINT"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.update(DVC_NO_ANALYTICS="1", WANDB_MODE="disabled", OMP_WAIT_POLICY="PASSIVE", **extra)
    return env


def _run(args: list[str], cwd: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=_env(**env), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _remote_store() -> Path:
    """The DVC remote this checkout points at (``.dvc/config``, or ``config.local`` over it), as
    an absolute path."""
    from dvc.config import Config

    return Path(Config(dvc_dir=ROOT / ".dvc")["remote"]["store"]["url"])


def make_checkout(dest: Path, preset: str | None = SMOKE) -> Path:
    """A fresh git repository with this working tree's files and the data pulled; its
    ``params.yaml`` composed with ``preset`` (None: as committed, conf/'s composition)."""
    if not (ROOT / "data" / "README.md").is_file() or not _remote_store().is_dir():
        pytest.skip("the data and its DVC remote are needed: run `make install`")
    files = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], ROOT).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    _run(["git", "init", "-q"], dest)
    _run(["dvc", "remote", "modify", "--local", "store", "url", str(_remote_store())], dest)
    _run(["dvc", "pull", "-q", "data.dvc"], dest)
    if preset is not None:
        _run([sys.executable, "-m", "elmolab.core.params", preset], dest)
    _commit(dest, "checkout")
    return dest


def _commit(repo: Path, message: str) -> None:
    _run(["git", "add", "-A"], repo)
    identity = ["-c", "user.name=elmolab tests", "-c", "user.email=tests@elmolab.invalid"]
    _run(["git", *identity, "commit", "-q", "--allow-empty", "-m", message], repo)


def _stages_run(proc: subprocess.CompletedProcess) -> list[str]:
    prefix = "Running stage '"
    return [line[len(prefix) : -2] for line in proc.stdout.splitlines() if line.startswith(prefix)]


def _results(repo: Path) -> dict[str, Any]:
    """Every result of a finished pipeline, without timings: what must be reproducible."""
    return reproducible_results(repo / "artifacts")


def _checkpoint_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = make_checkout(tmp_path_factory.mktemp("clean"))
    _run(["dvc", "repro"], repo)
    _commit(repo, "smoke results")
    return repo


def test_the_smoke_pipeline_writes_the_report_and_a_second_repro_does_nothing(
    clean: Path,
) -> None:
    report = clean / "artifacts" / "report"
    assert (report / "index.html").stat().st_size > 10_000
    summary = json.loads((report / "summary.json").read_text())
    assert summary  # every task and feature mode of the smoke grid, both encoders
    assert summary["quick_look"] is True  # experiment=smoke sets report.quick_look
    assert not any("conditional" in line for line in summary["missing"])  # no layer 0 asked for
    again = _run(["dvc", "repro"], clean)
    assert _stages_run(again) == []


def test_a_changed_probe_setting_reruns_only_the_probes_and_the_report(clean: Path) -> None:
    params = yaml.safe_load((clean / "params.yaml").read_text())
    lr = params["probe"]["lr"]
    try:
        _run([sys.executable, "-m", "elmolab.core.params", SMOKE, f"probe.lr={lr * 2}"], clean)
        stages = _stages_run(_run(["dvc", "repro"], clean))
    finally:
        _run(["git", "checkout", "HEAD", "--", "params.yaml", "dvc.lock"], clean)
        _run(["dvc", "checkout", "-q"], clean)
    assert _run(["dvc", "status", "-q"], clean, check=False).returncode == 0  # back as it was
    grid = params["grid"]
    probes = {f"probe@{t}" for t in grid["tasks"]}
    assert set(stages) == probes | {"report"} and stages[-1] == "report"


# What a user adds for a new dataset and task (README, docs/datasets.md): the files under
# data/probing/<dataset>/, its entry in extract.datasets, the task's file and its grid entry.
NEW_DATASET = """
  # Added by the test: CoNLL-2000's chunk tags read as a column file (IOB2, detected).
  chunks_columns:
    format: columns
    root: ${paths.data}/probing/chunks_columns
    splits:
      train: ${paths.data}/probing/chunks_columns/train.txt
      test: ${paths.data}/probing/chunks_columns/test.txt
    carve_dev: {fraction: 0.1, seed: 1}
    columns: {label_column: 2}
"""
NEW_TASK = """name: chunk_columns
kind: token
train: chunks_columns/train
dev: chunks_columns/dev
test: chunks_columns/test
field: tags
metric: span_f1
unseen: keep
control_seed: null
wordnet: null
family: syntactic
"""


def test_a_new_dataset_and_task_rerun_only_their_stages_and_the_report(
    clean: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(clean, repo, symlinks=True)
    new_data = repo / "data" / "probing" / "chunks_columns"
    new_data.mkdir()
    for name in ("train.txt", "test.txt"):
        shutil.copy(repo / "data" / "probing" / "conll2000" / name, new_data / name)
    with open(repo / "conf" / "extract" / "default.yaml", "a", encoding="utf-8") as conf:
        conf.write(NEW_DATASET)
    (repo / "conf" / "tasks" / "chunk_columns.yaml").write_text(NEW_TASK, encoding="utf-8")
    grid = repo / "conf" / "grid" / "default.yaml"
    text = grid.read_text(encoding="utf-8")
    grid.write_text(
        text.replace("  - _self_", "  - /tasks@tasks.chunk_columns: chunk_columns\n  - _self_"),
        encoding="utf-8",
    )
    _run([sys.executable, "-m", "elmolab.core.params", SMOKE], repo)

    ran = _stages_run(_run(["dvc", "repro"], repo))
    assert ran == ["extract@chunks_columns", "probe@chunk_columns", "report"]
    summary = json.loads((repo / "artifacts" / "report" / "summary.json").read_text())
    assert set(summary["probes"]) == {
        *yaml.safe_load((clean / "params.yaml").read_text())["grid"]["tasks"],
        "chunk_columns",
    }
    assert "chunk_columns" in (repo / "artifacts" / "report" / "index.html").read_text()
    from elmolab.report.wandb_report import tasks_in_results

    assert "chunk_columns" in tasks_in_results(repo / "artifacts" / "probes")
    # The old cells' results are untouched: the same numbers as before.
    old = {k: v for k, v in _results(repo).items() if "chunk_columns" not in k}
    assert {k: v for k, v in old.items() if "chunks_columns" not in k} == _results(clean)


def test_an_external_encoder_is_extracted_probed_and_reported_without_pretraining(
    tmp_path: Path,
) -> None:
    """bilm-tf's reference model as ``extract.external.fixture`` (the folder form, its files
    under bilm-tf's own names): ``dvc repro report_external@fixture`` runs its extraction, a
    probe cell per task and its report, and no stage of the pretrained study."""
    repo = make_checkout(tmp_path)
    fixture = "+extract.external.fixture=data/reference/elmo_fixture"
    _run([sys.executable, "-m", "elmolab.core.params", SMOKE, fixture], repo)
    tasks = yaml.safe_load((repo / "params.yaml").read_text())["grid"]["tasks"]

    ran = _stages_run(_run(["dvc", "repro", "report_external@fixture"], repo))
    assert ran[0] == "extract_external@fixture" and ran[-1] == "report_external@fixture"
    assert set(ran[1:-1]) == {f"probe_external@fixture-{task}" for task in tasks}
    study = repo / "artifacts" / "external" / "fixture"
    assert sorted(p.name for p in (repo / "artifacts").iterdir()) == ["external"]
    summary = json.loads((study / "report" / "summary.json").read_text())
    assert set(summary["probes"]) == set(tasks)
    assert all(
        set(modes[mode]) == {"fixture"} for modes in summary["probes"].values() for mode in modes
    )
    assert any("no trained biLM" in line for line in summary["missing"])
    assert "fixture" in (study / "report" / "index.html").read_text()
    # The features are the reference model's: bilm-tf's 3 layers of 2 x 16 dims.
    features = study / "features" / "fixture" / "ud_english_ewt" / "extract.json"
    extracted = json.loads(features.read_text())
    assert extracted["model"] == "data/reference/elmo_fixture"
    assert (extracted["layers"], extracted["dim"]) == (3, 32)
    assert _stages_run(_run(["dvc", "repro", "report_external@fixture"], repo)) == []


def test_a_second_fresh_checkout_gives_identical_results(
    clean: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Same commit, same seed, same machine: every result file equal (tools/compare_runs.py)."""
    other = make_checkout(tmp_path_factory.mktemp("again"))
    _run(["dvc", "repro"], other)
    compared = _run(
        [sys.executable, str(ROOT / "tools" / "compare_runs.py"), str(clean), str(other)],
        ROOT,
        check=False,
    )
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_two_queued_experiments_run_at_once_each_equal_to_its_run_alone(
    clean: Path, tmp_path: Path
) -> None:
    for lr in ("0.01", "0.1"):
        _run(["dvc", "exp", "run", "--queue", "-S", SMOKE, "-S", f"probe.lr={lr}"], clean)
    _run(["dvc", "queue", "start", "--jobs", "2"], clean)
    _wait_for_queue(clean)
    shown = json.loads(_run(["dvc", "exp", "show", "--json"], clean).stdout)
    experiments = [
        exp for commit in shown for exp in commit.get("experiments") or [] if exp.get("revs")
    ]
    revs = [rev for exp in experiments for rev in exp["revs"]]
    assert len(revs) == 2, json.dumps(shown, indent=1)[:2000]
    lrs = set()
    for rev in revs:
        assert rev["error"] is None, rev["error"]
        row = rev["data"]
        lr = row["params"]["params.yaml"]["data"]["probe"]["lr"]
        lrs.add(lr)
        assert row["metrics"]["artifacts/report/metrics.json"]["data"]  # the headline numbers
        # The experiment's outputs, then the same settings run alone in a copy of the clean run.
        queued = tmp_path / f"queued-{lr}"
        shutil.copytree(clean, queued, symlinks=True)
        _run(["dvc", "exp", "apply", rev["rev"]], queued)
        _run(["dvc", "checkout", "-q"], queued)
        alone = tmp_path / f"alone-{lr}"
        shutil.copytree(clean, alone, symlinks=True)
        _run([sys.executable, "-m", "elmolab.core.params", SMOKE, f"probe.lr={lr}"], alone)
        _run(["dvc", "repro"], alone)
        compare = [sys.executable, str(ROOT / "tools" / "compare_runs.py"), str(alone), str(queued)]
        compared = _run(compare, ROOT, check=False)
        assert compared.returncode == 0, compared.stdout + compared.stderr
    assert lrs == {0.01, 0.1}


def _wait_for_queue(repo: Path, polls: int = 600) -> None:
    for _ in range(polls):
        status = _run(["dvc", "queue", "status"], repo).stdout
        if not any(word in status for word in ("Queued", "Running")):
            assert "Failed" not in status, status
            return
        time.sleep(2)
    raise AssertionError(f"the queue did not finish:\n{status}")


def test_killed_at_any_moment_the_pipeline_resumes_to_the_same_results(
    clean: Path, tmp_path: Path
) -> None:
    repo = make_checkout(tmp_path / "killed")
    checkpoints = repo / "artifacts" / "bilm_checkpoints"
    smoke = yaml.safe_load((repo / "params.yaml").read_text())["pretrain"]
    every = smoke["checkpoint_every_n_steps"]

    # Mid-epoch, after the first checkpoint: nothing of the stage's outputs exists.
    killed = _run(["dvc", "repro", "pretrain"], repo, False, ELMOLAB_FAILPOINT="train_step:25")
    assert killed.returncode != 0 and not (repo / "artifacts" / "bilm").exists()
    assert _checkpoint_step(checkpoints / "last.ckpt") == every
    # Between the next checkpoint's temporary file and its rename: the last one stays complete.
    killed = _run(["dvc", "repro", "pretrain"], repo, False, ELMOLAB_FAILPOINT="checkpoint_written")
    assert killed.returncode != 0 and list(checkpoints.glob(".last.ckpt.*.tmp"))
    assert _checkpoint_step(checkpoints / "last.ckpt") == every
    # Mid-validation.
    killed = _run(["dvc", "repro", "pretrain"], repo, False, ELMOLAB_FAILPOINT="validation_step:3")
    assert killed.returncode != 0 and not (repo / "artifacts" / "bilm").exists()
    # Extraction, between two splits: no dataset folder, nothing else left behind by the rerun.
    _run(["dvc", "repro", "pretrain"], repo)
    assert json.loads((repo / "artifacts" / "bilm" / "metrics.json").read_text())["resumed"]
    assert not list(checkpoints.glob(".*.tmp"))
    killed = _run(
        ["dvc", "repro", "extract@ud_english_ewt"],
        repo,
        False,
        ELMOLAB_FAILPOINT="split_extracted:3",
    )
    features = repo / "artifacts" / "features"
    assert killed.returncode != 0 and not (features / "trained" / "ud_english_ewt").exists()
    _run(["dvc", "repro"], repo)

    assert not list((repo / "artifacts").rglob(".*.tmp"))
    assert _results(repo) == _results(clean)
    cached, locked = _cached_objects(repo), _locked_objects(repo)
    assert locked <= cached
    # Anything else in the cache is an earlier complete version of a small JSON output (a stage
    # that ran twice writes other timings), never a truncated file of a killed stage.
    for md5 in cached - locked:
        json.loads(_cache_path(repo, md5).read_text(encoding="utf-8"))


def _cache_path(repo: Path, md5: str) -> Path:
    return repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]


def _locked_objects(repo: Path) -> set[str]:
    """The cache objects ``dvc.lock`` and ``data.dvc`` name: outputs, and the files of folders."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    outs = [out for stage in lock["stages"].values() for out in stage.get("outs", [])]
    outs += yaml.safe_load((repo / "data.dvc").read_text())["outs"]
    uncached = _uncached_outputs(repo)
    objects = set()
    for out in outs:
        if "md5" not in out or out.get("cache") is False or out["path"] in uncached:
            continue
        objects.add(out["md5"])
        if out["md5"].endswith(".dir"):
            listing = json.loads(_cache_path(repo, out["md5"]).read_text())
            objects.update(entry["md5"] for entry in listing)
    return objects


def _uncached_outputs(repo: Path) -> set[str]:
    """Outputs ``dvc.yaml`` declares ``cache: false`` (dvc.lock does not say so), a ``foreach``
    stage's once per item: as DVC resolves them."""
    from dvc.repo import Repo

    with Repo(str(repo)) as dvc_repo:
        return {out.def_path for out in dvc_repo.index.outs if not out.use_cache}


def _cached_objects(repo: Path) -> set[str]:
    root = repo / ".dvc" / "cache" / "files" / "md5"
    return {p.parent.name + p.name for p in root.glob("*/*") if p.is_file()}


def _make(repo: Path, target: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    # -o: the shared venv counts as installed, whatever the copied pyproject.toml's time says;
    # under an outer make (make test-slow) a nested one would add "Entering/Leaving directory".
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", target]
    return _run(command, repo, check, **env)


def test_the_quick_look_leaves_the_study_to_make_run(tmp_path: Path) -> None:
    """``make smoke`` runs the smoke preset beside the study, which it leaves as committed: after
    it, ``make run`` starts the default study (stopped here at its first training step), and
    refuses, in one line, a params.yaml that is not conf/'s composition."""
    repo = make_checkout(tmp_path / "clone", preset=None)
    (repo / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    committed = {name: (repo / name).read_bytes() for name in ("params.yaml", "dvc.lock")}

    quick = _make(repo, "smoke")
    report = repo / "smoke" / "artifacts" / "report" / "index.html"
    assert quick.stdout.splitlines()[-1] == f"The quick look's report: {report}"
    assert report.stat().st_size > 10_000
    smoke = compose_params(repo / "conf", [SMOKE])
    assert (repo / "smoke" / "params.yaml").read_text() == smoke
    assert {name: (repo / name).read_bytes() for name in committed} == committed
    assert _run(["git", "status", "--porcelain"], repo).stdout == ""
    assert not (repo / "artifacts").exists()
    assert _stages_run(_make(repo, "smoke")) == []  # a second quick look finds it all done

    run = _make(repo, "run", False, ELMOLAB_FAILPOINT="train_step:1")
    assert run.returncode != 0 and _stages_run(run)[0] == "prepare"
    assert "pretrain" in _stages_run(run)
    # The default corpus (every source), not the quick look's slice (two of them).
    stats = json.loads((repo / "artifacts" / "corpus" / "stats.json").read_text())
    sources = yaml.safe_load(committed["params.yaml"])["corpus"]["sources"]
    assert set(stats["sources"]) == {name for name, source in sources.items() if source}
    assert (repo / "params.yaml").read_bytes() == committed["params.yaml"]

    edited = committed["params.yaml"].decode().replace("seed: 1\n", "seed: 2\n", 1)
    (repo / "params.yaml").write_text(edited)  # by hand
    refused = _make(repo, "run", check=False)
    said = [line for line in refused.stderr.splitlines() if not line.startswith("make")]
    assert refused.returncode != 0 and _stages_run(refused) == []
    assert len(said) == 1 and said[0].startswith("error: params.yaml: differs from"), said
    assert " in seed: `make params` returns it" in said[0]
    _make(repo, "params")
    assert (repo / "params.yaml").read_bytes() == committed["params.yaml"]
