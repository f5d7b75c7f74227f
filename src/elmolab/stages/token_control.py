"""The token-control stage: writes the trained biLM's token layer with random LSTMs
(:mod:`elmolab.models.controls`), the control that shows what pretraining the LSTMs added.

One instance of the control a run (``--instance <name>``, a key of ``controls.token_layer``, whose
value seeds its LSTMs); its output folder ``artifacts/bilm_<name>/`` (like the pretrain stage's,
without softmax and perplexities, which a random LSTM under a trained softmax would not make
meaningful)::

    model.pt, options.json, weights.hdf5, vocab.txt   the control biLM
    metrics.json                                      what it was made from, and how
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from elmolab.core.config import run_stage, section, take_option
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import ControlsConfig, control_folder
from elmolab.models.controls import token_layer_control

INSTANCE = "--instance"


def run(cfg: DictConfig, out_dir: Path, instance: str) -> dict[str, Any]:
    """The stage: the control's ``instance`` (a key of ``controls.token_layer``, its seed there)
    made of ``<paths.artifacts>/bilm`` -> ``out_dir``."""
    instances = section(cfg, "controls", ControlsConfig).token_layer
    if instance not in instances:
        raise ElmolabError(
            f"{INSTANCE} {instance!r}: not an instance of controls.token_layer"
            f" ({', '.join(instances)})"
        )
    bilm = Path(cfg.paths.artifacts) / "bilm"
    return token_layer_control(bilm, out_dir, seed=instances[instance])


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/token_control.py``: under DVC ``--params params.yaml --instance <name>`` reads
    ``artifacts/bilm/`` and writes ``artifacts/bilm_<name>/`` (encoder ``<name>``)."""
    instance, argv = take_option(sys.argv[1:] if argv is None else argv, INSTANCE)
    fn = functools.partial(run, instance=instance or "")
    run_stage(fn, stage=control_folder(instance or ""), conf_dir=conf_dir, argv=argv)
