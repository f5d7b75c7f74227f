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

import logging
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.figure import Figure

from elmolab.errors import ElmolabError
from elmolab.fsutil import atomic_dir, write_json
from elmolab.report import figures, tables, writers
from elmolab.report.collect import (
    CONTROL_SUFFIX,
    LAYER_PANEL,
    MAIN_ENCODER,
    RANDOM_ENCODER,
    SCALAR_MIX,
    TOKEN_LAYER_ENCODER,
    Inputs,
    collect,
    read_taskmodel,
)
from elmolab.report.information import (
    CodeCell,
    Gain,
    conditional_gains,
    online_code_cells,
)
from elmolab.report.polysemy import PolysemyConfig, WordNeighbours, nearest_neighbours
from elmolab.report.sections import Sections
from elmolab.report.stats import (
    Cell,
    Comparison,
    EncoderComparison,
    LayerGap,
    Selectivity,
    compare_encoders,
    compare_mix_to_best_layer,
    group_cells,
    layer_gaps,
    learning_curve_cells,
    selectivities,
)

log = logging.getLogger(__name__)

OPTIONS_FILE = "options.json"  # in the trained biLM's folder, bilm-tf format
WEIGHTS_FILE = "weights.hdf5"


@dataclass
class InputsConfig:
    bilm: str
    bilm_random: str
    probes: str
    vocab: str
    semcor: str
    taskmodel: str  # the task model stage's folder (its metrics.json)
    # More probe results: Hydra multirun or run folders, or probes folders (collect.probe_roots).
    sources: list[str] = field(default_factory=list)


@dataclass
class SignificanceConfig:
    alpha: float
    bootstrap_samples: int


@dataclass
class ReportConfig:
    """Schema of the ``report`` config section (values and reasons in conf/report/)."""

    inputs: InputsConfig
    significance: SignificanceConfig
    embed_figures: bool
    figure_dpi: int
    polysemy: PolysemyConfig


@dataclass(frozen=True)
class CodeVersion:
    commit: str  # "unknown" outside git
    dirty: bool | None  # uncommitted changes (tracked or untracked files); None when unknown

    def __str__(self) -> str:
        if self.dirty is None:
            return self.commit
        return self.commit + (" (uncommitted changes)" if self.dirty else "")


@dataclass
class ReportData:
    """Everything the writers show."""

    title: str
    inputs: Inputs
    cells: dict[tuple[str, str, str], Cell]
    comparisons: list[Comparison]
    selectivity: list[Selectivity]
    # The trained biLM against its token layer under random LSTMs, per task and feature mode.
    token_comparisons: list[EncoderComparison]
    # The trained biLM against the random-initialisation control, per task and feature mode.
    random_comparisons: list[EncoderComparison]
    # (task, features, encoder, training fraction) -> runs, for the probe learning curves.
    curve_cells: dict[tuple[str, str, str, float], Cell]
    curve_comparisons: list[EncoderComparison]  # as token_comparisons, per training fraction
    polysemy: list[WordNeighbours]
    polysemy_layers: list[int]
    params_yaml: str
    version: CodeVersion
    significance: SignificanceConfig
    # The information measures (report.information): online codes by (task, features, encoder),
    # the conditional probes by (task, "layer0+<mode>", encoder), their information beyond layer 0.
    online_codes: dict[tuple[str, str, str], CodeCell] = field(default_factory=dict)
    conditional_cells: dict[tuple[str, str, str], Cell] = field(default_factory=dict)
    gains: list[Gain] = field(default_factory=list)
    # The layer panel: each task's family (grid.tasks.<task>.family), and layer 2 minus layer 1
    # per task and encoder.
    families: dict[str, str] = field(default_factory=dict)
    layer_gaps: list[LayerGap] = field(default_factory=list)
    # The task model stage's summary (elmolab.taskmodel.stage.summarize), None if it has not run.
    taskmodel: dict | None = None

    @property
    def tasks(self) -> list[str]:
        """Probing tasks in display order, control tasks excluded."""
        names = dict.fromkeys(task for task, _, _ in self.cells)
        return [task for task in names if not task.endswith(CONTROL_SUFFIX)]

    @property
    def encoders(self) -> list[str]:
        return list(dict.fromkeys(encoder for _, _, encoder in self.cells))


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
) -> ReportData:
    """Read the inputs and compute the statistics and the polysemy table.

    ``families`` gives each task's family (``grid.tasks.<task>.family``: syntactic, semantic);
    a task with results but no family is an error (the layer panel groups tasks by it).
    """
    inputs = collect(
        Path(config.inputs.bilm),
        Path(config.inputs.bilm_random),
        Path(config.inputs.probes),
        [Path(source) for source in config.inputs.sources],
    )
    samples = config.significance.bootstrap_samples
    cells = group_cells(inputs.probes)
    curve_cells = learning_curve_cells(inputs.curves, cells)
    comparisons = compare_mix_to_best_layer(cells, samples, seed)
    conditional_cells = group_cells(inputs.conditional)
    polysemy = _polysemy(config, inputs.missing) if config.polysemy.enabled else []
    lower, upper = LAYER_PANEL
    return ReportData(
        title=title,
        inputs=inputs,
        cells=cells,
        comparisons=comparisons,
        selectivity=selectivities(cells),
        token_comparisons=compare_encoders(
            cells.values(), MAIN_ENCODER, TOKEN_LAYER_ENCODER, samples, seed
        ),
        random_comparisons=compare_encoders(
            cells.values(), MAIN_ENCODER, RANDOM_ENCODER, samples, seed
        ),
        curve_cells=curve_cells,
        curve_comparisons=compare_encoders(
            curve_cells.values(), MAIN_ENCODER, TOKEN_LAYER_ENCODER, samples, seed
        ),
        polysemy=polysemy,
        polysemy_layers=config.polysemy.contextual_layers,
        params_yaml=params_yaml,
        version=code_version(cwd),
        significance=config.significance,
        online_codes=online_code_cells(inputs.online_codes),
        conditional_cells=conditional_cells,
        gains=conditional_gains(cells, conditional_cells, samples, seed),
        families=task_families(cells, families),
        layer_gaps=layer_gaps(cells, lower, upper, samples, seed),
        taskmodel=read_taskmodel(Path(config.inputs.taskmodel), inputs.missing),
    )


def task_families(
    cells: Mapping[tuple[str, str, str], Cell], families: Mapping[str, str | None]
) -> dict[str, str]:
    """The family of every task with results (control tasks excluded), or an error naming the
    first task without one."""
    tasks = dict.fromkeys(t for t, _, _ in cells if not t.endswith(CONTROL_SUFFIX))
    for task in tasks:
        if not families.get(task):
            raise ElmolabError(
                f"grid.tasks.{task}.family: task {task!r} has probe results but no family "
                f"(syntactic or semantic, set in conf/task/{task}.yaml): the report's layer "
                "panel groups tasks by family"
            )
    return {task: str(families[task]) for task in tasks}


def _polysemy(config: ReportConfig, missing: list[str]) -> list[WordNeighbours]:
    options = Path(config.inputs.bilm) / OPTIONS_FILE
    weights = Path(config.inputs.bilm) / WEIGHTS_FILE
    vocab = Path(config.inputs.vocab)
    absent = [str(path) for path in (options, weights, vocab) if not path.is_file()]
    if absent:
        missing.append(f"polysemy table not computed: no {', '.join(absent)}")
        return []
    from elmolab.models.bilm_tf import load_bilm
    from elmolab.text.vocab import Vocabulary
    from elmolab.text.wsd import read_semcor

    semcor = None
    if Path(config.inputs.semcor).is_file():
        log.info("reading SemCor for the polysemy table: %s", config.inputs.semcor)
        semcor = read_semcor(config.inputs.semcor)
    else:
        missing.append(f"no SemCor ({config.inputs.semcor}): polysemy table without contexts")
    model = load_bilm(options, weights)
    return nearest_neighbours(model, Vocabulary.from_file(vocab).tokens, semcor, config.polysemy)


def write_report(data: ReportData, config: ReportConfig, out_dir: Path) -> dict:
    """Write every output into a temporary folder that replaces ``out_dir`` when complete.

    Returns the content of ``summary.json``.
    """
    pngs = {name: figures.to_png(figure, config.figure_dpi) for name, figure in _figures(data)}
    summary = writers.summary_json(data)
    sections = Sections.of(data)  # the tables both renderings show
    with atomic_dir(out_dir) as tmp:
        (tmp / "figures").mkdir()
        for name, png in pngs.items():
            (tmp / "figures" / f"{name}.png").write_bytes(png)
        for name, text in writers.plot_csvs(data).items():
            (tmp / "plots" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "plots" / name).write_text(text, encoding="utf-8")
        (tmp / "index.html").write_text(
            writers.render_html(data, sections, pngs, config.embed_figures), encoding="utf-8"
        )
        (tmp / "summary.md").write_text(
            writers.render_markdown(data, sections, pngs), encoding="utf-8"
        )
        write_json(tmp / "summary.json", summary)
        write_json(tmp / "metrics.json", writers.headline_metrics(data))
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
        drawn.append(("probes_by_task", figures.probe_bars(data.cells, tasks, encoders)))
        drawn.append(("task_feature_heatmap", figures.heatmap(data.cells, tasks, encoders)))
    mixed = list(
        dict.fromkeys(
            task
            for (task, mode, _), cell in data.cells.items()
            if mode == SCALAR_MIX and cell.mix_weights is not None
        )
    )
    if mixed:
        drawn.append(("mix_weights", figures.mix_weights(data.cells, mixed, encoders)))
    if data.selectivity:
        drawn.append(("selectivity", figures.selectivity_bars(data.selectivity, encoders)))
    if data.curve_cells:
        drawn.append(("probe_learning_curves", figures.probe_learning_curves(data.curve_cells)))
    if data.online_codes:
        drawn.append(("online_code", figures.online_code_bars(data.online_codes)))
    if data.gains:
        drawn.append(("conditional_probing", figures.conditional_bars(data.gains)))
    return drawn


def _layer_panel(data: ReportData) -> Figure:
    """The layer panel's figure: every task's layer 2 - layer 1, mix and paper reference."""
    panel = tables.panel_tasks(data)
    shown = {task for _, task in panel}
    gravity = {
        task: mix.gravity for task in shown if (mix := tables.mix_summary(data, task)) is not None
    }
    paper = {
        task: two - one for task, (_, one, two) in tables.PAPER_LAYERS.items() if task in shown
    }
    return figures.layer_panel(
        panel,
        data.layer_gaps,
        gravity,
        paper,
        tables.main_encoder(data),
        data.significance.alpha,
    )
