"""Shared test setup: offline, no W&B, one intra-op thread, and what several test modules use.

Here: the data folder and the reference model (fixtures), ``expect_error`` (the one-line error
that names its file and line) and ``default_probe_settings``. Bigger shared fixtures live in
``tests/fixtures/``: ``workspace.py`` (mini data, tiny encoders and their extracted features, for
the stage tests) and ``report/fake_artifacts.py`` (probe runs and pretraining results for the
report tests).
"""

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The pulled raw data; tests that need it skip with the command that brings it."""
    if not (DATA / "README.md").is_file():
        pytest.skip("data/ is missing: run `make install` (it pulls the data with DVC)")
    return DATA


@pytest.fixture(scope="module")
def fixture_dir(data_dir: Path) -> Path:
    """bilm-tf's tiny reference model and the outputs TensorFlow computed with it."""
    return data_dir / "reference" / "elmo_fixture"


@pytest.fixture(scope="module")
def model(fixture_dir: Path):
    """The reference model loaded from its bilm-tf files (one per test module)."""
    from elmolab.models.bilm_tf import load_bilm

    return load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")


def pytest_configure(config):
    # One intra-op thread: the tests' tensors are small, and OpenMP threads that spin-wait on a
    # shared 2-core machine slow small ops down by an order of magnitude.
    import torch

    torch.set_num_threads(1)


def expect_error(call, path, line, problem: str) -> None:
    """``call()`` raises an ElmolabError of one line, ``path:line: ...problem...``, that names
    ``path`` and ``line`` (None: not given) as its attributes too."""
    from elmolab.core.errors import ElmolabError

    with pytest.raises(ElmolabError) as caught:
        call()
    error = caught.value
    message = str(error)
    assert (error.path, error.line) == (None if path is None else str(path), line), message
    where = "" if path is None else str(path) if line is None else f"{path}:{line}"
    assert message.startswith(f"{where}: " if where else ""), message
    assert problem in message and "\n" not in message, message


def default_probe_settings():
    """``probe`` as ``conf/probe/default.yaml`` sets it (the only place its values live)."""
    from omegaconf import OmegaConf

    from elmolab.core.config import section
    from elmolab.core.schema import ProbeSettings

    conf = Path(__file__).resolve().parents[1] / "conf"
    cfg = OmegaConf.create({"paths": {"artifacts": "artifacts", "data": "data"}})
    cfg.probe = OmegaConf.load(conf / "probe" / "default.yaml")
    return section(cfg, "probe", ProbeSettings, where=str(conf / "probe" / "default.yaml"))
