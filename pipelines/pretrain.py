"""Pretrain stage: train the biLM on artifacts/corpus (config: model, pretrain, trainer).

Under DVC: ``python pipelines/pretrain.py --params params.yaml`` writes ``artifacts/bilm/``
(checkpoints for resuming in ``artifacts/bilm_checkpoints/``); with ``--random-control`` it
writes the untrained control model to ``artifacts/bilm_random/`` instead.
Ad hoc: ``python pipelines/pretrain.py model=tiny pretrain.max_steps=100`` (Hydra run folder).
"""

import sys
from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
import _wait_policy  # noqa: F401  (before torch loads: idle OpenMP threads spin)
from omegaconf import DictConfig

from elmolab.config import run_stage, section
from elmolab.tracking import init_run, run_tags
from elmolab.training.pretrain import (
    ModelConfig,
    PretrainConfig,
    TrainerConfig,
    pretrain,
    random_control,
)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def _sections(cfg: DictConfig) -> tuple[ModelConfig, PretrainConfig, TrainerConfig, Path]:
    return (
        section(cfg, "model", ModelConfig),
        section(cfg, "pretrain", PretrainConfig),
        section(cfg, "trainer", TrainerConfig),
        Path(cfg.paths.artifacts) / "corpus",
    )


def run(cfg: DictConfig, out_dir: Path) -> dict:
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


def run_random_control(cfg: DictConfig, out_dir: Path) -> dict:
    model, settings, trainer, corpus_dir = _sections(cfg)
    return random_control(model, settings, trainer, corpus_dir, out_dir, seed=cfg.seed)


if __name__ == "__main__":
    if "--random-control" in sys.argv:
        argv = [a for a in sys.argv[1:] if a != "--random-control"]
        run_stage(run_random_control, stage="bilm_random", conf_dir=CONF_DIR, argv=argv)
    else:
        run_stage(run, stage="bilm", conf_dir=CONF_DIR)
