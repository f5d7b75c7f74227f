"""Task-model stage: a BiLSTM-CRF tagger with and without ELMo's mix (config: ``taskmodel``, and
``extract``'s datasets).

Under DVC: ``python pipelines/taskmodel.py --params params.yaml`` writes ``artifacts/taskmodel/``
(every input of ``taskmodel.mix_encoders`` and the baseline, every seed, the summary in
``metrics.json``). Ad hoc: ``python pipelines/taskmodel.py taskmodel=full`` writes into a Hydra
run folder. Both read the cached features of ``taskmodel.features_dir``.
"""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
import _wait_policy  # noqa: F401  (before torch loads: idle OpenMP threads spin)
from omegaconf import DictConfig

from elmolab.config import run_stage, section
from elmolab.extract import ExtractConfig
from elmolab.taskmodel.stage import TaskModelConfig, run_taskmodel

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run(cfg: DictConfig, out_dir: Path) -> dict:
    config = section(cfg, "taskmodel", TaskModelConfig)
    extract = section(cfg, "extract", ExtractConfig)
    return run_taskmodel(config, extract.catalog(), out_dir, extract.encoders)


if __name__ == "__main__":
    run_stage(run, stage="taskmodel", conf_dir=CONF_DIR)
