"""Token-control stage: the trained biLM's token layer with random orthogonal LSTMs, the control
that shows what pretraining the LSTMs added (see ``elmolab.controls``).

Under DVC: ``python pipelines/token_control.py --params params.yaml`` reads ``artifacts/bilm/``
and writes ``artifacts/bilm_token/``; the extract stage probes it as encoder ``token_only``.
"""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
from omegaconf import DictConfig

from elmolab.config import run_stage
from elmolab.controls import token_layer_control

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run(cfg: DictConfig, out_dir: Path) -> dict:
    return token_layer_control(Path(cfg.paths.artifacts) / "bilm", out_dir, seed=cfg.seed)


if __name__ == "__main__":
    run_stage(run, stage="bilm_token", conf_dir=CONF_DIR)
