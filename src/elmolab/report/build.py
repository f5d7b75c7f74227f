"""Gather every input of the report and write ``artifacts/report/`` in one atomic step.

Output (replaced whole, and only when complete)::

    index.html        self-contained: CSS inline, figures as data URIs (or figures/ links)
    figures/*.png     the figures
    summary.md        the tables in Markdown
    summary.json      every number: per task, feature mode and encoder mean, std, per-seed values
    metrics.json      the headline numbers, flat, for `dvc metrics` / `dvc exp show`
    plots/            CSVs for DVC plots: validation_perplexity.csv, probes/<task>.csv
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from matplotlib.figure import Figure

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_dir, write_json
from elmolab.core.schema import ReportConfig
from elmolab.io.polysemy import TABLE_FILE, PolysemyTable, read_table
from elmolab.report import figures, writers
from elmolab.report.collect import (
    LAYER_PANEL,
    SCALAR_MIX,
    Display,
    Expected,
    collect,
    read_taskmodel,
)
from elmolab.report.data import CodeVersion, ReportData, main_encoder, no_verdicts_reason
from elmolab.report.information import (
    conditional_gains,
    net_gains,
    online_code_cells,
)
from elmolab.report.sections import Sections, summary_json
from elmolab.report.sections.headline import metrics_json
from elmolab.report.sections.layers import mix_summary, panel_tasks
from elmolab.report.stats import (
    Bootstrap,
    Cell,
    compare_encoders,
    compare_mix_to_best_layer,
    group_cells,
    layer_gaps,
    learning_curve_cells,
    selectivities,
)

PAGE = "index.html"  # the report itself, in the output folder


def code_version(cwd: Path) -> CodeVersion:
    """The git commit of ``cwd`` and whether it has uncommitted changes ('unknown' outside git).

    ``dvc.lock`` does not count: ``dvc repro`` rewrites it while the pipeline runs, before the
    report stage, so it differs from the commit in every run that changed anything.
    """
    try:
        commit = _git(cwd, "rev-parse", "HEAD")
        dirty = bool(_git(cwd, "status", "--porcelain", "--", ".", ":(exclude)dvc.lock"))
    except (OSError, subprocess.CalledProcessError):
        return CodeVersion("unknown", None)
    return CodeVersion(commit, dirty)


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()


def gather(
    config: ReportConfig,
    title: str,
    params_yaml: str,
    seed: int,
    cwd: Path,
    families: Mapping[str, str | None],
    display: Display,
    expected: Expected,
) -> ReportData:
    """Read the inputs (the polysemy table among them) and compute the statistics.

    ``families`` gives each task's family (``grid.tasks.<task>.family``: syntactic, semantic);
    a task with results but no family is an error (the layer panel groups tasks by it).
    ``display`` orders and names what is shown, and says which encoder is compared with which;
    ``expected`` says which absent results are missing. ``report.paper_layers`` names tasks of
    ``display`` only.
    """
    unknown = [task for task in config.paper_layers if task not in display.tasks]
    if unknown:
        raise ElmolabError(
            f"report.paper_layers.{unknown[0]}: not a task of grid.tasks"
            f" ({', '.join(display.tasks)})"
        )
    inputs = collect(
        Path(config.inputs.bilm),
        Path(config.inputs.bilm_random),
        Path(config.inputs.probes),
        [Path(source) for source in config.inputs.sources],
        display,
        expected=expected,
    )
    tester = Bootstrap(config.significance.bootstrap_samples, seed)
    controls = display.controls
    cells = group_cells(inputs.probes, display)
    curve_cells = learning_curve_cells(inputs.curves, cells, display)
    comparisons = compare_mix_to_best_layer(cells, tester)
    conditional_cells = group_cells(inputs.conditional, display)
    gains = conditional_gains(cells, conditional_cells, tester, display)
    polysemy = _polysemy(config, inputs.missing)
    lower, upper = LAYER_PANEL
    return ReportData(
        title=title,
        inputs=inputs,
        cells=cells,
        comparisons=comparisons,
        selectivity=selectivities(cells, controls, tester),
        token_comparisons=compare_encoders(
            cells.values(), display.main, display.token_layer, tester, controls=controls
        ),
        random_comparisons=compare_encoders(
            cells.values(), display.main, display.random, tester, controls=controls
        ),
        curve_cells=curve_cells,
        curve_comparisons=compare_encoders(
            [c for c in curve_cells.values() if c.train_fraction < 1.0],
            display.main,
            display.token_layer,
            tester,
            controls=controls,
        ),
        polysemy=polysemy.words,
        polysemy_layers=polysemy.contextual_layers,
        params_yaml=params_yaml,
        version=code_version(cwd),
        significance=config.significance,
        online_codes=online_code_cells(inputs.online_codes, display),
        conditional_cells=conditional_cells,
        gains=gains,
        net_gains=net_gains(gains, tester, display),
        families=task_families(cells, families, controls),
        layer_gaps=layer_gaps(cells, lower, upper, tester, controls=controls),
        taskmodel=read_taskmodel(Path(config.inputs.taskmodel), inputs.missing),
        paper_layers=config.paper_layers,
        display=display,
        quick_look=config.quick_look,
        no_verdicts=no_verdicts_reason(inputs.trained),
        sense_agreement=getattr(polysemy, "agreement", None),
    )


def task_families(
    cells: Mapping[tuple[str, str, str], Cell],
    families: Mapping[str, str | None],
    controls: Mapping[str, str],
) -> dict[str, str]:
    """The family of every task with results (the control tasks, the keys of ``controls``,
    excluded), or an error naming the first task without one."""
    tasks = dict.fromkeys(t for t, _, _ in cells if t not in controls)
    for task in tasks:
        if not families.get(task):
            raise ElmolabError(
                f"grid.tasks.{task}.family: task {task!r} has probe results but no family "
                f"(syntactic or semantic, set in conf/tasks/{task}.yaml): the report's layer "
                "panel groups tasks by family"
            )
    return {task: str(families[task]) for task in tasks}


def _polysemy(config: ReportConfig, missing: list[str]) -> PolysemyTable:
    """The polysemy stage's table, with its notes listed as missing; an empty table (and a line
    in ``missing``) when the stage has not run."""
    path = Path(config.inputs.polysemy) / TABLE_FILE
    if not path.is_file():
        missing.append(f"polysemy table not computed: no {path} (the polysemy stage has not run)")
        return PolysemyTable([], [])
    table = read_table(path)
    missing.extend(table.notes)
    return table


def write_report(data: ReportData, config: ReportConfig, out_dir: Path) -> dict:
    """Write every output into a temporary folder that replaces ``out_dir`` when complete.

    Returns the content of ``summary.json``.
    """
    pngs = {name: figures.to_png(figure, config.figure_dpi) for name, figure in _figures(data)}
    summary = summary_json(data)
    sections = Sections.of(data)  # the tables both renderings show
    with atomic_dir(out_dir) as tmp:
        (tmp / "figures").mkdir()
        for name, png in pngs.items():
            (tmp / "figures" / f"{name}.png").write_bytes(png)
        for name, text in writers.plot_csvs(data).items():
            (tmp / "plots" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "plots" / name).write_text(text, encoding="utf-8")
        (tmp / PAGE).write_text(
            writers.render_html(data, sections, pngs, config.embed_figures), encoding="utf-8"
        )
        (tmp / "summary.md").write_text(
            writers.render_markdown(data, sections, pngs), encoding="utf-8"
        )
        write_json(tmp / "summary.json", summary)
        write_json(tmp / "metrics.json", metrics_json(data))
    return summary


def _figures(data: ReportData) -> list[tuple[str, Figure]]:
    """(name, matplotlib figure) for every figure the data allows."""
    drawn: list[tuple[str, Figure]] = []
    trained = data.inputs.trained
    if trained is not None and trained.curve is not None:
        drawn.append(("pretraining_curves", figures.learning_curves(trained)))
    tasks, encoders = data.tasks, data.encoders
    if data.layer_gaps:
        drawn.append(("layer_panel", _layer_panel(data)))
    if tasks:
        drawn.append(
            ("probes_by_task", figures.probe_bars(data.cells, tasks, encoders, data.display))
        )
        drawn.append(
            ("task_feature_heatmap", figures.heatmap(data.cells, tasks, encoders, data.display))
        )
    mixed = list(
        dict.fromkeys(
            task
            for (task, mode, _), cell in data.cells.items()
            if mode == SCALAR_MIX and cell.mix_weights is not None
        )
    )
    if mixed:
        drawn.append(
            ("mix_weights", figures.mix_weights(data.cells, mixed, encoders, data.display))
        )
    if data.selectivity:
        drawn.append(
            ("selectivity", figures.selectivity_bars(data.selectivity, encoders, data.display))
        )
    if data.curve_cells:
        drawn.append(
            ("probe_learning_curves", figures.probe_learning_curves(data.curve_cells, data.display))
        )
    if data.online_codes:
        drawn.append(("online_code", figures.online_code_bars(data.online_codes, data.display)))
    if data.gains:
        drawn.append(("conditional_probing", figures.conditional_bars(data.gains, data.display)))
    return drawn


def _layer_panel(data: ReportData) -> Figure:
    """The layer panel's figure: every task's layer 2 - layer 1, mix and paper reference."""
    panel = panel_tasks(data)
    shown = {task for _, task in panel}
    gravity = {task: mix.gravity for task in shown if (mix := mix_summary(data, task)) is not None}
    paper = {
        task: paper.layer2 - paper.layer1
        for task, paper in data.paper_layers.items()
        if task in shown
    }
    return figures.layer_panel(
        panel,
        data.layer_gaps,
        gravity,
        paper,
        main_encoder(data),
        None if data.no_verdicts else data.significance.alpha,
        data.display,
    )
