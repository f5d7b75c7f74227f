"""A full disk during extraction and probing, on a real small filesystem (a tmpfs; we mount it,
so these tests need root and skip otherwise): one line naming the stage, the file and the free
space, a non-zero exit without a segmentation fault, no temporary file left, and once space is
freed the rerun (the stages alone, or `dvc repro` of a DVC project of both) writes exactly what
a run that never lacked space writes."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fixtures.workspace import CONF, ONE_INSTANCE_EACH, write_mini_data, write_tiny_encoders

from elmolab.core.params import compose_params
from elmolab.io.results import reproducible_results

ROOT = Path(__file__).resolve().parents[2]
# Two stages several times on mini data, in subprocesses: about 2 minutes on a 2-core machine.
pytestmark = pytest.mark.slow
TMPFS_MIB = 24
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [\w.]+: ")  # the stages' logging
# One dataset, one task, one feature mode and seed, few epochs: the stages' write paths, cheaply.
SETTINGS = [
    "extract.num_threads=1",
    "probe.max_epochs=2",
    "probe.unseen=keep",
    "grid.seeds=[1]",
    "grid.features=[mean]",
]
EXTRACT = [
    str(ROOT / "pipelines" / "extract.py"),
    "--params",
    "{params}",
    "extract.dataset=conll2000",
]
PROBE = [str(ROOT / "pipelines" / "probe.py"), "--params", "{params}", "task=chunk"]
# The extract stage with its free-space check turned off, to reach a write that fails midway
# (as when another process fills the disk during the stage).
UNCHECKED = (
    "import runpy, sys; import elmolab.extraction.features as e; "
    "e._check_free_space = lambda *a: None; "
    f"sys.path.insert(0, {str(ROOT / 'pipelines')!r}); sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _workspace(root: Path, data_dir: Path) -> Path:
    """Mini data and tiny encoders under ``root``; returns the stages' params.yaml, whose paths
    are relative to ``root`` (the stages run there), so that two workspaces' outputs, which
    record the paths they come from, can be compared byte for byte."""
    write_mini_data(data_dir, root / "data")
    write_tiny_encoders(root / "artifacts")
    overrides = ["paths.data=data", "paths.artifacts=artifacts", *ONE_INSTANCE_EACH, *SETTINGS]
    text = compose_params(CONF, overrides)
    (root / "params.yaml").write_text(text, encoding="utf-8")
    return root / "params.yaml"


def _stage(
    command: list[str], params: Path, unchecked: bool = False
) -> subprocess.CompletedProcess:
    args = [arg.format(params=params) for arg in command]
    prefix = [sys.executable, "-c", UNCHECKED] if unchecked else [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    return subprocess.run(
        [*prefix, *args], cwd=params.parent, env=env, capture_output=True, text=True, timeout=600
    )


def _outputs(artifacts: Path) -> dict[str, object]:
    """The results (``reproducible_results``: what tools/compare_runs.py compares) and the
    digest of every feature file."""
    found: dict[str, object] = dict(reproducible_results(artifacts))
    for path in sorted((artifacts / "features").rglob("*.hdf5")):
        found[str(path.relative_to(artifacts))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="module")
def clean(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The outputs of both stages run with space to spare."""
    root = tmp_path_factory.mktemp("clean")
    params = _workspace(root, data_dir)
    for command in (EXTRACT, PROBE):
        done = _stage(command, params)
        assert done.returncode == 0, done.stderr
    return _outputs(root / "artifacts")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A ``TMPFS_MIB`` MiB tmpfs at ``tmp_path/artifacts``, unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    mount = tmp_path / "artifacts"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def _fill(disk: Path, leave: int) -> Path:
    """A ballast file that leaves ``leave`` bytes free on ``disk``."""
    ballast = disk / "ballast"
    free = shutil.disk_usage(disk).free
    with open(ballast, "wb") as out:
        out.truncate(0)
        out.write(b"\0" * max(free - leave, 0))
    return ballast


def _assert_one_line_and_nothing_left(done: subprocess.CompletedProcess, disk: Path) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)  # not -11: no segfault
    lines = [line for line in done.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(lines) == 1, done.stderr
    assert not [p for p in disk.rglob(".*") if p.name.endswith((".tmp", ".old"))]
    return lines[0]


def test_extraction_refuses_to_start_without_the_space_it_needs(
    data_dir: Path, small_disk: Path, clean: dict[str, object]
) -> None:
    params = _workspace(small_disk.parent, data_dir)
    ballast = _fill(small_disk, 1 << 20)
    line = _assert_one_line_and_nothing_left(_stage(EXTRACT, params), small_disk)
    assert line.startswith("error: artifacts/features: extraction needs up to ")
    assert line.endswith(" MiB is free there") and "(3 encoders, 3 splits, float16)" in line
    assert not (small_disk / "features").exists() or not any((small_disk / "features").rglob("*"))

    ballast.unlink()
    assert _stage(EXTRACT, params).returncode == 0
    assert _outputs(small_disk) == {k: v for k, v in clean.items() if "probes" not in k}


def test_a_disk_filling_up_during_extraction_and_probing_ends_in_one_line(
    data_dir: Path, small_disk: Path, clean: dict[str, object]
) -> None:
    params = _workspace(small_disk.parent, data_dir)
    ballast = _fill(small_disk, 2 << 20)  # the three encoders' features take 4.8 MiB
    line = _assert_one_line_and_nothing_left(_stage(EXTRACT, params, unchecked=True), small_disk)
    assert line.startswith("error: artifacts/features/") and ".hdf5: no space left" in line
    assert "on device in stage extract (" in line and "free on its filesystem now)" in line
    print(line)

    ballast.unlink()
    assert _stage(EXTRACT, params).returncode == 0
    ballast = _fill(small_disk, 16 << 10)
    line = _assert_one_line_and_nothing_left(_stage(PROBE, params), small_disk)
    assert line.startswith("error: artifacts/probes/chunk") and "in stage probe (" in line
    print(line)
    assert not (small_disk / "probes" / "chunk").exists()

    ballast.unlink()
    assert _stage(PROBE, params).returncode == 0
    assert _outputs(small_disk) == clean


def _dvc_pipeline(root: Path) -> list[str]:
    """``root`` as a DVC project (no git) whose pipeline is the two stages of this module: the
    extraction of conll2000 and the chunk probe, reading ``root/params.yaml``. Returns the
    command that runs DVC."""
    stages = {
        "extract": {
            "cmd": " ".join([sys.executable, *EXTRACT]).format(params="params.yaml"),
            "deps": ["data/probing/conll2000", "artifacts/bilm", "artifacts/bilm_random"],
            "outs": ["artifacts/features"],
        },
        "probe": {
            "cmd": " ".join([sys.executable, *PROBE]).format(params="params.yaml"),
            "deps": ["artifacts/features"],
            "outs": ["artifacts/probes/chunk"],
        },
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}), encoding="utf-8")
    dvc = [sys.executable, "-m", "dvc"]
    done = subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=root, capture_output=True)
    assert done.returncode == 0, done.stderr
    return dvc


def test_after_a_full_disk_dvc_repro_ends_as_a_clean_run(
    data_dir: Path, small_disk: Path, clean: dict[str, object]
) -> None:
    """Under DVC: the extraction refused for want of space, then the probe stopped midway by a
    full disk, each with the stage's one line and no segfault; once space is freed, `dvc repro`
    finishes and every result equals the run that never lacked space."""
    root = small_disk.parent
    _workspace(root, data_dir)
    dvc = _dvc_pipeline(root)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "DVC_NO_ANALYTICS": "1"}

    def repro(*targets: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*dvc, "repro", *targets], cwd=root, env=env, capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip

    ballast = _fill(small_disk, 1 << 20)
    done = repro()
    assert done.returncode != 0 and "Segmentation fault" not in done.stderr + done.stdout
    assert "exited with -11" not in done.stderr + done.stdout
    output = done.stderr + done.stdout
    assert "error: artifacts/features: extraction needs up to " in output, output
    print(next(line for line in output.splitlines() if line.startswith("error: ")))
    ballast.unlink()

    assert repro("extract").returncode == 0
    ballast = _fill(small_disk, 16 << 10)
    done = repro()
    output = done.stderr + done.stdout
    assert done.returncode != 0 and "exited with -11" not in output
    assert "error: artifacts/probes/chunk" in output and "in stage probe (" in output, output
    print(next(line for line in output.splitlines() if line.startswith("error: ")))
    assert not [p for p in small_disk.rglob(".*") if p.name.endswith((".tmp", ".old"))]
    ballast.unlink()

    done = repro()
    assert done.returncode == 0, done.stderr
    assert _outputs(small_disk) == clean
