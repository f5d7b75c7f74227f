"""Weights & Biases tracking (docs/architecture.md §6): optional, offline unless it can be online.

A stage wraps its work in :func:`init_run`::

    fields = {"task": "upos", "features": "scalar_mix", "encoder": "trained", "seed": 1}
    with init_run(cfg, job_type="probe", tags=run_tags(**fields), config=fields) as run:
        run.log({metric_key("val", "accuracy"): 0.93}, step=epoch)
        run.log_mix_weights([0.2, 0.5, 0.3], gamma=1.1)
        run.add_input("bilm", "model", Path("artifacts/bilm"))

and gets a :class:`TrackedRun` whose methods do nothing when W&B is off, so stages never branch
on it. Lightning's ``WandbLogger(experiment=run.run)`` reuses the same run.

- On/off: on when ``logger.wandb`` is true (``logger=wandb``) and ``WANDB_MODE`` is not
  ``disabled``. Mode: ``WANDB_MODE`` when set, else ``logger.wandb_mode``; ``online`` only if
  an API key exists (``WANDB_API_KEY`` or ``~/.netrc``) and api.wandb.ai answers, else
  ``offline``.
- Names: project = ``study``; entity from ``WANDB_ENTITY`` (W&B's default otherwise); group =
  the DVC experiment (``DVC_EXP_NAME``, set by ``dvc exp run``) or an explicit group such as a
  sweep id; name = the DVC stage (``DVC_STAGE``, e.g. ``probe@upos-layer1``) or the job type;
  tags ``task:upos`` etc.
- Files: under ``<root>/wandb/`` with root ``WANDB_DIR``, else ``DVC_ROOT`` (the repository
  under DVC), else the working directory. ``make wandb-sync`` uploads offline runs later
  (``python -m elmolab.core.tracking sync``).
- Data: W&B never carries data between stages. Inputs and outputs are reference artifacts
  (``file://`` URIs; DVC holds the bytes). W&B cannot record an input offline, so offline runs
  keep their inputs in the run config (``inputs/<name>``) instead.
- Secrets: the logged config is :func:`redact`-ed (the values of the keys in :data:`SECRET_KEYS`);
  API keys are read from the environment only and never written anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import netrc
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

WANDB_HOST = "api.wandb.ai"
AUTHORIZE_URL = "https://wandb.ai/authorize"
MIX_PREFIX = "mix"  # scalar-mix weights: mix/w0, mix/w1, mix/w2, mix/gamma
PRETRAIN_STEP = "trainer/global_step"  # the x axis Lightning's WandbLogger logs
PRETRAIN_CURVES = ("val/ppl", "val/ppl_fwd", "val/ppl_bwd")  # curve.csv's val_ppl* columns
TRAIN_LOSS = "train/loss"
# The keys whose values are secrets, matched whole and regardless of case ("-" as "_"): W&B's API
# key and the tokens and passwords of other services. A whole-key match, not a substring: the
# settings hold many harmless "token" keys (max_sentence_tokens, token_column, batch_tokens).
SECRET_KEYS = frozenset(
    {
        "api_key",
        "apikey",
        "wandb_api_key",
        "token",
        "access_token",
        "auth_token",
        "refresh_token",
        "hf_token",
        "github_token",
        "secret",
        "secret_key",
        "client_secret",
        "password",
        "passwd",
    }
)
REDACTED = "<redacted>"


def metric_key(split: str, name: str) -> str:
    """The W&B key of a metric: ``train/...``, ``val/...`` or ``test/...``
    (docs/architecture.md §6)."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train, val or test, got {split!r}")
    return f"{split}/{name}"


def mix_keys(n_layers: int) -> list[str]:
    """The keys of the learned scalar-mix weights, ``mix/w0`` .. ``mix/w{n-1}``."""
    return [f"{MIX_PREFIX}/w{j}" for j in range(n_layers)]


def run_tags(**fields: object) -> list[str]:
    """``run_tags(task="upos", seed=1)`` -> ``["task:upos", "seed:1"]`` (None values skipped)."""
    return [f"{key}:{value}" for key, value in fields.items() if value is not None]


def is_secret(key: object) -> bool:
    """Whether ``key`` names a secret: one of :data:`SECRET_KEYS`, whole, in any case."""
    return str(key).lower().replace("-", "_") in SECRET_KEYS


def redact(value: Any) -> Any:
    """A copy of a nested config with the values of secret keys (:func:`is_secret`) replaced."""
    if isinstance(value, Mapping):
        return {key: REDACTED if is_secret(key) else redact(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact(item) for item in value]
    return value


def has_api_key() -> bool:
    """Whether W&B could authenticate: ``WANDB_API_KEY`` or a netrc entry for api.wandb.ai."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(WANDB_HOST) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def network_available(host: str = WANDB_HOST, port: int = 443, timeout: float = 2.0) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wandb_mode(cfg: DictConfig) -> str | None:
    """``online``, ``offline``, or None when W&B is off (see the module docstring)."""
    if not OmegaConf.select(cfg, "logger.wandb", default=False):
        return None
    requested = os.environ.get("WANDB_MODE") or OmegaConf.select(
        cfg, "logger.wandb_mode", default="offline"
    )
    if requested == "disabled":
        return None
    if requested != "online":
        return "offline"
    if has_api_key() and network_available():
        return "online"
    log.warning("W&B runs offline: no API key or no network (`make wandb-sync` uploads later)")
    return "offline"


def tracking_root() -> Path:
    """The folder whose ``wandb/`` subfolder holds the runs."""
    return Path(os.environ.get("WANDB_DIR") or os.environ.get("DVC_ROOT") or os.getcwd())


class TrackedRun:
    """A W&B run, or nothing: every method is a no-op when ``run`` is None."""

    def __init__(self, run: Any = None) -> None:
        self.run = run  # the wandb Run (for Lightning's WandbLogger(experiment=...)), or None

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(dict(metrics), step=step)

    def summarize(self, metrics: Mapping[str, Any]) -> None:
        """Final values (the run table's columns; what reports aggregate over runs)."""
        if self.run is not None:
            self.run.summary.update(dict(metrics))

    def log_mix_weights(
        self, weights: Sequence[float], gamma: float | None, step: int | None = None
    ) -> None:
        """The learned scalar-mix weights ``softmax(w)_j`` as ``mix/w{j}``, and ``mix/gamma``;
        logged (history) and summarized (final values)."""
        metrics = dict(zip(mix_keys(len(weights)), map(float, weights), strict=True))
        if gamma is not None:
            metrics[f"{MIX_PREFIX}/gamma"] = float(gamma)
        self.log(metrics, step=step)
        self.summarize(metrics)

    def add_input(self, name: str, kind: str, path: Path) -> None:
        """Record that the run read ``path`` (lineage): a used reference artifact online, an
        ``inputs/<name>`` entry of the run config offline."""
        if self.run is None:
            return
        if self.run.settings.mode == "offline":
            self.run.config.update({f"inputs/{name}": {"type": kind, "uri": _file_uri(path)}})
            return
        self.run.use_artifact(_reference_artifact(name, kind, path))

    def add_output(self, name: str, kind: str, path: Path) -> None:
        """Record that the run wrote ``path``: a logged reference artifact."""
        if self.run is not None:
            self.run.log_artifact(_reference_artifact(name, kind, path))


@contextlib.contextmanager
def init_run(
    cfg: DictConfig,
    job_type: str,
    name: str | None = None,
    group: str | None = None,
    tags: Sequence[str] = (),
    config: Mapping[str, Any] | None = None,
) -> Iterator[TrackedRun]:
    """A W&B run for one stage run (or a no-op :class:`TrackedRun` when W&B is off).

    ``config``: the fields that identify the run (task, features, encoder, seed), logged at the
    top level so reports can filter and group by them; the whole composed config goes under
    ``params``. The run is always finished, with exit code 1 when the body raised.
    """
    mode = wandb_mode(cfg)
    if mode is None:
        yield TrackedRun()
        return
    import wandb

    run = wandb.init(
        project=cfg.study,
        job_type=job_type,
        name=name or os.environ.get("DVC_STAGE") or job_type,
        group=group or os.environ.get("DVC_EXP_NAME") or None,
        tags=list(tags),
        config=run_config(cfg, config or {}),
        dir=tracking_root(),
        mode=mode,
        reinit="finish_previous",
    )
    try:
        yield TrackedRun(run)
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()


def run_config(cfg: DictConfig, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The config of a W&B run: ``fields`` at the top level, the whole resolved config under
    ``params``, secrets redacted."""
    return redact({**fields, "params": OmegaConf.to_container(cfg, resolve=True)})


def _file_uri(path: Path) -> str:
    return Path(path).resolve().as_uri()


def _reference_artifact(name: str, kind: str, path: Path) -> Any:
    import wandb

    artifact = wandb.Artifact(name, type=kind, metadata={"path": str(path)})
    artifact.add_reference(_file_uri(path))
    return artifact


def offline_runs(root: Path) -> list[Path]:
    """Offline run folders under ``root/wandb`` that were never synced."""
    runs = sorted((root / "wandb").glob("offline-run-*"))
    return [run for run in runs if not any(run.glob("*.wandb.synced"))]


def sync(root: Path) -> int:
    """Upload the offline runs under ``root/wandb`` when a key and the network exist; otherwise
    say what to do. Returns the exit status."""
    runs = offline_runs(root)
    if not runs:
        print(f"nothing to sync: no unsynced offline W&B runs under {root / 'wandb'}/")
        return 0
    where = f"{len(runs)} offline W&B run(s) under {root / 'wandb'}/"
    if not has_api_key():
        print(
            f"{where} wait for upload. To upload them: export WANDB_API_KEY=<your key from "
            f"{AUTHORIZE_URL}> (or run `wandb login`), then run `make wandb-sync` again."
        )
        return 0
    if not network_available():
        print(f"{where} wait for upload, but {WANDB_HOST} does not answer: retry when online.")
        return 0
    command = [sys.executable, "-m", "wandb", "sync", *map(str, runs)]
    return subprocess.run(command, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="elmolab's W&B helpers")
    commands = parser.add_subparsers(dest="command", required=True)
    sync_parser = commands.add_parser("sync", help="upload offline runs (wandb/offline-run-*)")
    sync_parser.add_argument("--root", type=Path, default=None, help="folder holding wandb/")
    args = parser.parse_args(argv)
    return sync(args.root or tracking_root())


if __name__ == "__main__":
    sys.exit(main())
