"""The token-control stage: writes the trained biLM's token layer with random LSTMs
(:mod:`elmolab.models.controls`), the control that shows what pretraining the LSTMs added.

Output folder (like the pretrain stage's, without softmax and perplexities, which a random LSTM
under a trained softmax would not make meaningful)::

    model.pt, options.json, weights.hdf5, vocab.txt   the control biLM
    metrics.json                                      what it was made from, and how
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from elmolab.core.config import run_stage
from elmolab.models.controls import token_layer_control


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The stage: the control of ``<paths.artifacts>/bilm`` -> ``out_dir``."""
    return token_layer_control(Path(cfg.paths.artifacts) / "bilm", out_dir, seed=cfg.seed)


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/token_control.py``: under DVC ``--params params.yaml`` reads
    ``artifacts/bilm/`` and writes ``artifacts/bilm_token/`` (encoder ``token_only``)."""
    run_stage(run, stage="bilm_token", conf_dir=conf_dir, argv=argv)
