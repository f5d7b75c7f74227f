"""The report's data model: everything the sections, figures and writers show, computed once by
:func:`elmolab.report.build.gather` from what the other stages wrote (:mod:`.collect`) and the
statistics over it (:mod:`.stats`, :mod:`.information`), with the study's :class:`Display`; which
of its encoders is the main one, which the baselines; and whether it may draw verdicts at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from elmolab.core.schema import PaperLayersConfig, SignificanceConfig
from elmolab.io.polysemy import WordNeighbours
from elmolab.report.collect import Display, Inputs, Pretraining
from elmolab.report.information import CodeCell, Gain, NetGain
from elmolab.report.stats import Cell, Comparison, EncoderComparison, LayerGap, Selectivity


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
    # The gains of a task net of the same gains on its control task.
    net_gains: list[NetGain] = field(default_factory=list)
    # The layer panel: each task's family (grid.tasks.<task>.family), and layer 2 minus layer 1
    # per task and encoder.
    families: dict[str, str] = field(default_factory=dict)
    layer_gaps: list[LayerGap] = field(default_factory=list)
    # The task model stage's summary (elmolab.taskmodel.runs.summarize), None if it has not run.
    taskmodel: dict | None = None
    # The ELMo paper's layer 1 and layer 2 per task, beside the layer panel (report.paper_layers).
    paper_layers: dict[str, PaperLayersConfig] = field(default_factory=dict)
    # How tasks, feature modes and encoders are ordered and named (conf/: grid.tasks,
    # probe.encoders, report.encoders).
    display: Display = field(default_factory=Display)
    # A run that only checks the pipeline (report.quick_look): the report opens with a banner.
    quick_look: bool = False
    # Why no comparison is called better, worse or significant (no_verdicts_reason), or None.
    no_verdicts: str | None = None
    # The polysemy stage's nearest-neighbour sense agreement per SemCor occurrence (contextual
    # and token layer), or None where the stage has not measured it.
    sense_agreement: Any = None

    @property
    def tasks(self) -> list[str]:
        """Probing tasks in display order, control tasks excluded."""
        names = dict.fromkeys(task for task, _, _ in self.cells)
        return [task for task in names if not self.display.is_control(task)]

    @property
    def encoders(self) -> list[str]:
        return list(dict.fromkeys(encoder for _, _, encoder in self.cells))


def main_encoder(data: ReportData) -> str:
    """The main encoder (``report.encoders.main``) if it has results, else the first that has."""
    encoders = data.encoders
    return data.display.main_of(encoders) if encoders else data.display.main or ""


def baseline_encoders(data: ReportData) -> list[str]:
    """Every encoder but the main one, in display order."""
    main = main_encoder(data)
    return [encoder for encoder in data.encoders if encoder != main]


def no_verdicts_reason(trained: Pretraining | None) -> str | None:
    """The sentence that replaces every verdict when the trained biLM's validation perplexity is
    not below the unigram model's: a biLM that predicts words no better than their frequencies
    has learned nothing its probes could show. None when it is below, or either is unknown."""
    unigram = None if trained is None else trained.metrics.get("unigram_ppl", {}).get("valid")
    if unigram is None:
        return None
    ppl = trained.metrics["val"]["ppl"]
    if ppl < unigram:
        return None
    return (
        f"No verdicts: the trained biLM's validation perplexity ({ppl:,.1f}) is not better than"
        f" the unigram model's ({unigram:,.1f}), so it has not learned to predict words from"
        " their context; the numbers are shown, but none is called better, worse or significant."
    )
