"""The task-model stage: ELMo's second stage, a BiLSTM-CRF tagger with and without each encoder's
scalar mix (config: ``taskmodel``, its task ``grid.tasks.<taskmodel.task>``, and ``extract``'s
datasets; the library is :mod:`elmolab.taskmodel`).

Output (``artifacts/taskmodel/``): every input of ``taskmodel.mix_encoders`` and the baseline,
every seed, and the summary in ``metrics.json`` and ``table.md``, where the instances of each
control of the ``controls`` section (if the config has one) are one input. It reads the cached
features of ``taskmodel.features_dir``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from elmolab.core.config import run_stage, section
from elmolab.core.schema import ExtractConfig, GridConfig, TaskModelConfig
from elmolab.data.catalogue import data_catalog
from elmolab.taskmodel.runs import run_taskmodel, tagging_task


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The stage: ``taskmodel`` on the cached features -> ``out_dir``."""
    config = section(cfg, "taskmodel", TaskModelConfig)
    task = tagging_task(config, section(cfg, "grid", GridConfig).tasks)
    extract = section(cfg, "extract", ExtractConfig)
    controls = OmegaConf.select(cfg, "controls", default=None)
    controls = {} if controls is None else OmegaConf.to_container(controls)
    return run_taskmodel(config, task, data_catalog(extract), out_dir, extract.encoders, controls)


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/taskmodel.py``: under DVC ``--params params.yaml`` writes
    ``artifacts/taskmodel/``; ad hoc (``taskmodel=full``) a Hydra run folder."""
    run_stage(run, stage="taskmodel", conf_dir=conf_dir, argv=argv)
