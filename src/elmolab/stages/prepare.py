"""The prepare stage: raw corpora -> sentence shards per split, a vocabulary and statistics
(``elmolab.text.prepare``, where the output is described)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from elmolab.core.config import run_stage, section
from elmolab.core.schema import CorpusConfig
from elmolab.text.prepare import prepare_corpus


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The stage: ``corpus`` -> ``out_dir``."""
    return prepare_corpus(section(cfg, "corpus", CorpusConfig), out_dir, seed=cfg.seed)


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/prepare.py``: under DVC ``--params params.yaml`` writes ``artifacts/corpus/``;
    ad hoc (``corpus.vocab_max_size=10000``) a Hydra run folder."""
    run_stage(run, stage="corpus", conf_dir=conf_dir, argv=argv)
