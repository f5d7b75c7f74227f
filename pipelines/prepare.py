"""Prepare stage: raw corpora -> sentence shards, vocabulary and statistics (config: ``corpus``).

Under DVC: ``python pipelines/prepare.py --params params.yaml`` writes ``artifacts/corpus/``.
Ad hoc: ``python pipelines/prepare.py corpus.vocab_max_size=10000`` writes into a Hydra run folder.
"""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
from omegaconf import DictConfig

from elmolab.config import run_stage, section
from elmolab.prepare import CorpusConfig, prepare_corpus

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run(cfg: DictConfig, out_dir: Path) -> dict:
    corpus = section(cfg, "corpus", CorpusConfig)
    return prepare_corpus(corpus, out_dir, seed=cfg.seed)


if __name__ == "__main__":
    run_stage(run, stage="corpus", conf_dir=CONF_DIR)
