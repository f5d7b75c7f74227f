"""The pretrain stage: train the biLM on the prepared corpus (config: ``model``, ``pretrain``,
``trainer``), or write its random-initialisation control.

Output (``artifacts/bilm/``; the library is :mod:`elmolab.training.pretrain`)::

    model.pt, options.json, weights.hdf5, softmax.hdf5, vocab.txt   the biLM (bilm-tf's files)
    metrics.json, curve.csv                                         perplexities, training curve

Resumable checkpoints go to ``artifacts/bilm_checkpoints/``. With ``--random-control <name>`` the
stage writes instead an instance of the random-initialisation control (``controls.random.<name>``:
the same shape, untrained, drawn by the instance's seed) to ``artifacts/bilm_<name>/``; only the
first instance is evaluated as the trained biLM is (the report shows its perplexity), the others'
``metrics.json`` says they were not.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from elmolab.core.config import run_stage, section, take_option
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import (
    ControlsConfig,
    ModelConfig,
    PretrainConfig,
    TrainerConfig,
    control_folder,
)
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


def run_random_control(cfg: DictConfig, out_dir: Path, instance: str) -> dict[str, Any]:
    """The random-initialisation control's ``instance`` (a key of ``controls.random``) ->
    ``out_dir``."""
    model, settings, trainer, corpus_dir = _sections(cfg)
    controls = section(cfg, "controls", ControlsConfig)
    if instance not in controls.random:
        raise ElmolabError(
            f"{RANDOM_CONTROL} {instance!r}: not an instance of controls.random"
            f" ({', '.join(controls.random)})"
        )
    first = next(iter(controls.random))
    return random_control(
        model,
        settings,
        trainer,
        corpus_dir,
        out_dir,
        seed=controls.random[instance],
        evaluate=instance == first,
    )


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/pretrain.py``: under DVC ``--params params.yaml [--random-control <name>]``
    writes ``artifacts/bilm/`` (or ``artifacts/bilm_<name>/``); ad hoc (``model=tiny
    pretrain.max_steps=100``) a Hydra run folder."""
    instance, argv = take_option(sys.argv[1:] if argv is None else argv, RANDOM_CONTROL)
    if instance is None:
        run_stage(run, stage="bilm", conf_dir=conf_dir, argv=argv)
    else:
        fn = functools.partial(run_random_control, instance=instance)
        run_stage(fn, stage=control_folder(instance), conf_dir=conf_dir, argv=argv)
