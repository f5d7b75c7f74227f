"""Extract stage: every biLM layer of the probing datasets, per encoder (config: ``extract``).

Under DVC: ``python pipelines/extract.py --params params.yaml extract.dataset=ud_english_ewt``
writes ``artifacts/features/<encoder>/ud_english_ewt/`` for every encoder (one stage per dataset;
without ``extract.dataset`` every dataset of ``extract.datasets``; ``extract.encoder`` picks one
encoder). Ad hoc: ``python pipelines/extract.py extract.max_sentences=200`` writes into a Hydra
run folder.
"""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
import _wait_policy  # noqa: F401  (before torch loads: idle OpenMP threads spin)
from omegaconf import DictConfig

from elmolab.config import run_stage, section
from elmolab.extract import ExtractConfig, extract
from elmolab.tracking import init_run, run_tags

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run(cfg: DictConfig, out_dir: Path) -> dict:
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


if __name__ == "__main__":
    run_stage(run, stage="features", conf_dir=CONF_DIR)
