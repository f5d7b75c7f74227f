"""The pretrain stage: train the biLM on the prepared corpus (config: ``model``, ``pretrain``,
``trainer``), or write its random-initialisation control.

Output (``artifacts/bilm/``; the library is :mod:`elmolab.training.pretrain`)::

    model.pt, options.json, weights.hdf5, softmax.hdf5, vocab.txt   the biLM (bilm-tf's files)
    metrics.json, curve.csv                                         perplexities, training curve

Resumable checkpoints go to ``artifacts/bilm_checkpoints/``. With ``--random-control`` the stage
writes the untrained control model (the same shape, evaluated the same way) to
``artifacts/bilm_random/`` instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from elmolab.core.config import run_stage, section
from elmolab.core.schema import ModelConfig, PretrainConfig, TrainerConfig
from elmolab.core.tracking import init_run, run_tags
from elmolab.training.pretrain import pretrain, random_control

RANDOM_CONTROL = "--random-control"


def _sections(cfg: DictConfig) -> tuple[ModelConfig, PretrainConfig, TrainerConfig, Path]:
    return (
        section(cfg, "model", ModelConfig),
        section(cfg, "pretrain", PretrainConfig),
        section(cfg, "trainer", TrainerConfig),
        Path(cfg.paths.artifacts) / "corpus",
    )


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The stage: the corpus of ``<paths.artifacts>/corpus`` -> the trained biLM in ``out_dir``."""
    model, settings, trainer, corpus_dir = _sections(cfg)
    ckpt_dir = out_dir.parent / f"{out_dir.name}_checkpoints"
    fields = {"model": model.name, "seed": cfg.seed}
    with init_run(cfg, job_type="pretrain", tags=run_tags(**fields), config=fields) as tracked:
        tracked.add_input("corpus", "dataset", corpus_dir)
        loggers = []
        if tracked.enabled:
            from lightning.pytorch.loggers import WandbLogger

            loggers.append(WandbLogger(experiment=tracked.run))
        metrics = pretrain(
            model, settings, trainer, corpus_dir, out_dir, ckpt_dir, seed=cfg.seed, loggers=loggers
        )
        tracked.summarize(
            {
                f"{split}/{k}": v
                for split in ("val", "test")
                for k, v in metrics.get(split, {}).items()
            }
        )
        tracked.add_output("bilm", "model", out_dir)
    return metrics


def run_random_control(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The random-initialisation control of the same shape -> ``out_dir``."""
    model, settings, trainer, corpus_dir = _sections(cfg)
    return random_control(model, settings, trainer, corpus_dir, out_dir, seed=cfg.seed)


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/pretrain.py``: under DVC ``--params params.yaml [--random-control]`` writes
    ``artifacts/bilm/`` (or ``artifacts/bilm_random/``); ad hoc (``model=tiny
    pretrain.max_steps=100``) a Hydra run folder."""
    argv = sys.argv[1:] if argv is None else argv
    if RANDOM_CONTROL in argv:
        argv = [a for a in argv if a != RANDOM_CONTROL]
        run_stage(run_random_control, stage="bilm_random", conf_dir=conf_dir, argv=argv)
    else:
        run_stage(run, stage="bilm", conf_dir=conf_dir, argv=argv)
