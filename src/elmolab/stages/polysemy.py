"""The polysemy stage: the ELMo paper's Table 4 on the trained biLM, the nearest neighbours of
polysemous words out of context and in context, and how often an occurrence's nearest SemCor
neighbour shares its sense, in context and on the token layer (config: ``polysemy``; the library
is :mod:`elmolab.polysemy.neighbours`).

Output (``artifacts/polysemy/``, replaced whole when complete): ``neighbours.json``, which the
report shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from elmolab.core.config import run_stage, section
from elmolab.core.fsutil import atomic_dir
from elmolab.core.schema import PolysemyConfig
from elmolab.io.polysemy import TABLE_FILE, write_table
from elmolab.polysemy.neighbours import table


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The stage: the biLM of ``polysemy.bilm`` -> ``out_dir/neighbours.json``."""
    result = table(section(cfg, "polysemy", PolysemyConfig))
    with atomic_dir(out_dir) as tmp:
        write_table(result, tmp / TABLE_FILE)
    return {"words": len(result.words), "notes": result.notes}


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/polysemy.py``: under DVC ``--params params.yaml`` writes
    ``artifacts/polysemy/``; ad hoc (``polysemy.contextual_layers=[1]``) a Hydra run folder."""
    run_stage(run, stage="polysemy", conf_dir=conf_dir, argv=argv)
