"""The report stage: every stage's results -> one self-contained report (config: ``report``; the
library is :mod:`elmolab.report`).

Output (``artifacts/report/``): ``index.html``, ``figures/``, ``summary.md``, ``summary.json``,
``metrics.json`` and ``plots/``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from elmolab.core.config import run_stage, section
from elmolab.core.schema import ReportConfig
from elmolab.core.tracking import redact
from elmolab.report import gather, write_report
from elmolab.report.build import PAGE
from elmolab.report.collect import Display, Expected


def run(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """The stage: the results named by ``report.inputs`` -> ``out_dir``."""
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
        display=Display.of(cfg),
        expected=Expected.of(cfg),
    )
    summary = write_report(data, config, out_dir)
    # The page is what a run is for: say where it is (DVC shows a stage's output under repro).
    print(open_line(out_dir / PAGE), flush=True)
    return summary


def open_line(page: Path) -> str:
    """One line naming ``page`` (relative to the working directory when under it, as under DVC)
    and a command that opens it in a browser."""
    page, cwd = page.resolve(), Path.cwd().resolve()
    shown = page.relative_to(cwd) if page.is_relative_to(cwd) else page
    opener = "open" if sys.platform == "darwin" else "xdg-open"
    return f"The report: {shown} (open it in a browser, offline: {opener} {shown})"


def main(conf_dir: Path, argv: list[str] | None = None) -> None:
    """``pipelines/report.py``: under DVC ``--params params.yaml`` writes ``artifacts/report/``
    (``--external <name>``: that model's study); ad hoc (``report.figure_dpi=200``) a
    Hydra run folder."""
    run_stage(run, stage="report", conf_dir=conf_dir, argv=argv)
