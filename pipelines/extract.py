"""Extract stage: every biLM layer for every probing dataset, per encoder (config: ``extract``).

Under DVC: ``python pipelines/extract.py --params params.yaml extract.encoder=trained`` writes
``artifacts/features/trained/`` (one stage per encoder; without ``extract.encoder`` every encoder
of ``extract.encoders``). Ad hoc: ``python pipelines/extract.py extract.max_sentences=200`` writes
into a Hydra run folder.
"""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
from omegaconf import DictConfig

from elmolab.config import run_stage, section
from elmolab.extract import ExtractConfig, extract
from elmolab.tracking import init_run, run_tags

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run(cfg: DictConfig, out_dir: Path) -> dict:
    config = section(cfg, "extract", ExtractConfig)
    with init_run(cfg, job_type="extract", tags=run_tags(encoder=config.encoder)) as tracked:
        summaries = extract(config, out_dir)
        for encoder, summary in summaries.items():
            tracked.add_input(f"bilm-{encoder}", "model", Path(summary["model"]))
            tracked.add_output(f"features-{encoder}", "features", out_dir / encoder)
            tracked.summarize({f"{encoder}/wall_seconds": summary["wall_seconds"]})
    return summaries


if __name__ == "__main__":
    run_stage(run, stage="features", conf_dir=CONF_DIR)
