"""The extract stage: every biLM layer of every split of a dataset, per encoder
(``elmolab.extraction.features``, where the files and their format are described)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from elmolab.core.config import run_stage, section
from elmolab.core.schema import ExtractConfig
from elmolab.core.tracking import init_run, run_tags
from elmolab.extraction.features import extract


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The stage: the selected datasets and encoders of ``extract`` -> ``out_dir``."""
    config = section(cfg, "extract", ExtractConfig)
    tags = run_tags(encoder=config.encoder, dataset=config.dataset)
    with init_run(cfg, job_type="extract", tags=tags) as tracked:
        summaries = extract(config, out_dir)
        for encoder, datasets in summaries.items():
            model = next(iter(datasets.values()))["model"] if datasets else None
            if model is not None:
                tracked.add_input(f"bilm-{encoder}", "model", Path(model))
            for dataset, summary in datasets.items():
                name = f"features-{encoder}-{dataset}"
                tracked.add_output(name, "features", out_dir / encoder / dataset)
                tracked.summarize({f"{encoder}/{dataset}/wall_seconds": summary["wall_seconds"]})
    return summaries


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/extract.py``: under DVC ``--params params.yaml extract.dataset=ud_english_ewt``
    writes ``artifacts/features/<encoder>/ud_english_ewt/`` for every encoder (one DVC stage per
    dataset; without it every dataset); ``--external <name>`` extracts a bilm-tf model
    from elsewhere into its own study. Ad hoc (``extract.max_sentences=200``): a Hydra run
    folder."""
    run_stage(run, stage="features", conf_dir=conf_dir, argv=argv)
