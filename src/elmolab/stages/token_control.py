"""The token-control stage: writes the trained biLM's token layer with random LSTMs
(:mod:`elmolab.models.controls`), the control that shows what pretraining the LSTMs added.

Output folder (like the pretrain stage's, without softmax and perplexities, which a random LSTM
under a trained softmax would not make meaningful)::

    model.pt, options.json, weights.hdf5, vocab.txt   the control biLM
    metrics.json                                      what it was made from, and how
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from elmolab.core.config import run_stage
from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_dir, write_json
from elmolab.models.bilm_tf import export_bilm, load_bilm_from_checkpoint, save_bilm_checkpoint
from elmolab.models.controls import randomize_lstms, token_layer_digest

VOCAB = "vocab.txt"
CHECKPOINT = "model.pt"


def token_layer_control(source_dir: Path, out_dir: Path, seed: int) -> dict[str, Any]:
    """Write the control of the trained biLM in ``source_dir`` (its ``model.pt`` and
    ``vocab.txt``) to ``out_dir``, replaced whole when complete; returns its metrics."""
    started = time.perf_counter()
    for name in (CHECKPOINT, VOCAB):
        if not (source_dir / name).is_file():
            raise ElmolabError(f"no {name}: run the pretrain stage first", source_dir / name)
    model = load_bilm_from_checkpoint(source_dir / CHECKPOINT)
    trained_digest = token_layer_digest(model)
    randomize_lstms(model, seed)
    metrics = {
        "token_control": True,
        "source": str(source_dir),
        "seed": seed,
        "lstm_init": "W_0, W_P orthogonal; B uniform(-1/sqrt(cell), 1/sqrt(cell))",
        "token_layer_sha256": token_layer_digest(model),
        "model": model.options.to_dict(),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    assert metrics["token_layer_sha256"] == trained_digest, "the token layer must stay as trained"
    with atomic_dir(out_dir) as tmp:
        save_bilm_checkpoint(model, tmp / CHECKPOINT)
        export_bilm(model, tmp / "options.json", tmp / "weights.hdf5")
        shutil.copyfile(source_dir / VOCAB, tmp / VOCAB)
        metrics["wall_seconds"] = round(time.perf_counter() - started, 1)
        write_json(tmp / "metrics.json", metrics)
    return metrics


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The stage: the control of ``<paths.artifacts>/bilm`` -> ``out_dir``."""
    return token_layer_control(Path(cfg.paths.artifacts) / "bilm", out_dir, seed=cfg.seed)


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/token_control.py``: under DVC ``--params params.yaml`` reads
    ``artifacts/bilm/`` and writes ``artifacts/bilm_token/`` (encoder ``token_only``)."""
    run_stage(run, stage="bilm_token", conf_dir=conf_dir, argv=argv)
