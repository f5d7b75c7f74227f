"""Report stage: every stage's results -> one self-contained report (config: ``report``).

Under DVC: ``python pipelines/report.py --params params.yaml`` writes ``artifacts/report/``
(index.html, figures/, summary.md, summary.json, plots/). Ad hoc:
``python pipelines/report.py report.polysemy.enabled=false`` writes into a Hydra run folder.
"""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
from omegaconf import DictConfig, OmegaConf

from elmolab.config import run_stage, section
from elmolab.report import ReportConfig, gather, write_report
from elmolab.tracking import redact

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def run(cfg: DictConfig, out_dir: Path) -> dict:
    config = section(cfg, "report", ReportConfig)
    params = OmegaConf.to_yaml(redact(OmegaConf.to_container(cfg, resolve=True)))
    # Each task's family groups the layer panel (a task file's `family`, composed into grid.tasks).
    tasks = OmegaConf.select(cfg, "grid.tasks", default=None) or {}
    families = {name: task.get("family") for name, task in tasks.items()}
    data = gather(
        config,
        f"{cfg.study}: what the biLM's layers know",
        params,
        seed=cfg.seed,
        cwd=Path.cwd(),
        families=families,
    )
    return write_report(data, config, out_dir)


if __name__ == "__main__":
    run_stage(run, stage="report", conf_dir=CONF_DIR)
