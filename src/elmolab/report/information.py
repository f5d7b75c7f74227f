"""The information measures of the probe stage, per task, feature mode and encoder:

- the online code (Voita and Titov 2020): the training labels sent block by block, the first
  block under the uniform code, each later one under a probe trained on the blocks before it;
  compression = uniform code length / online code length (higher: the features make the labels
  easier to learn, from less data), mean and sample std over seeds;
- the information beyond layer 0 (conditional probing, Hewitt et al. 2021) of mode k
  (``layer1``, ``layer2``, ``scalar_mix``): per seed, the cross-entropy of the layer-0 probe minus
  that of the probe on ``[layer0; k]`` (features ``layer0+k``), in bits per token (positive: k
  adds information that layer 0 lacks), on test and dev, and the test metric of ``[layer0; k]``
  minus that of layer 0; and that gain net of the same gain on the task's control task (whose
  labels are random per word type, so what a probe gains there is capacity to memorise, not
  knowledge of the task). Runs are paired by unit (encoder instance and seed) and tested with
  the report's two-level test (:class:`~elmolab.report.stats.Bootstrap`), each measure one family
  corrected by Holm's method.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from elmolab.io.results import CONDITIONAL_BASE, CONDITIONAL_MODES, conditional_features
from elmolab.report.collect import (
    BY_NAME,
    DEV_BITS,
    TEST_BITS,
    Display,
    OnlineCode,
    ProbeRun,
    conditioned_mode,
    ordered,
)
from elmolab.report.significance import Effect
from elmolab.report.stats import Bootstrap, Cell, CellKey, Tested, correct, unit_of


@dataclass(frozen=True)
class PerSeed:
    """One quantity per seed: its mean and sample standard deviation (nan for fewer than 2)."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def std(self) -> float:
        return float(np.std(self.values, ddof=1)) if self.n > 1 else math.nan


@dataclass(frozen=True)
class TestedDifference(PerSeed, Tested):
    """A difference per paired unit with its test (``p_value`` adjusted in its family; None: not
    testable)."""

    p_value: float | None
    method: str  # how p_value was computed, or why there is none
    effect: Effect | None = None
    family: str = ""
    family_size: int = 0

    @property
    def difference(self) -> float:  # type: ignore[override]
        return self.mean if self.effect is None else self.effect.effect


@dataclass(frozen=True)
class CodeCell(CellKey):
    """The online codes of one task, feature mode and encoder, one per seed."""

    codes: tuple[OnlineCode, ...]  # sorted by seed

    @property
    def seeds(self) -> list[int]:
        return [code.seed for code in self.codes]

    @property
    def compression(self) -> PerSeed:
        return PerSeed(tuple(code.compression for code in self.codes))

    @property
    def online_bits(self) -> PerSeed:
        return PerSeed(tuple(code.online_bits for code in self.codes))

    @property
    def uniform_bits(self) -> float:
        """The uniform code length (every seed codes the same labels)."""
        return self.codes[0].uniform_bits

    @property
    def labels(self) -> int:
        return self.codes[0].labels

    @property
    def tokens(self) -> int:
        """The training tokens coded, every block together."""
        return sum(self.codes[0].block_tokens)

    @property
    def fractions(self) -> tuple[float, ...]:
        return self.codes[0].fractions

    @property
    def same_features_as(self) -> str | None:
        """The encoder these codes were copied from (identical features), if any."""
        return next((c.same_features_as for c in self.codes if c.same_features_as), None)

    @property
    def wall_seconds(self) -> float:
        """The training time of the block probes, copies (``same_features_as``) not counted."""
        return sum(code.wall_seconds for code in self.codes if code.same_features_as is None)


@dataclass(frozen=True)
class Gain:
    """The information beyond layer 0 of one task, mode and encoder."""

    task: str
    mode: str  # what the probe reads beside layer 0: layer1, layer2, scalar_mix
    encoder: str
    baseline: Cell  # the layer-0 runs
    conditional: Cell  # the [layer0; mode] runs
    test_bits: TestedDifference  # layer 0's test bits per token minus [layer0; mode]'s
    dev_bits: PerSeed  # the same on dev (not tested)
    metric: TestedDifference  # [layer0; mode]'s test metric minus layer 0's

    @property
    def features(self) -> str:
        return conditional_features(self.mode)


@dataclass(frozen=True)
class NetGain:
    """A gain beyond layer 0 on a task net of the same gain on its control task: what the
    encoder's layer adds beyond the probe's capacity to memorise random labels per word type."""

    task: str
    control_task: str
    mode: str
    encoder: str
    test_bits: TestedDifference  # the task's bits gained minus the control task's
    metric: TestedDifference  # the task's points gained minus the control task's

    @property
    def features(self) -> str:
        return conditional_features(self.mode)


@dataclass(frozen=True)
class MeasureTime:
    """The probe training time one task's information measures took, in seconds (None: the task
    has no such results)."""

    task: str
    online_code: float | None  # the online-code block probes, copied results not counted
    conditional: float | None  # the conditional probes (layer 0 beside another mode)


def conditional_label(mode: str) -> str:
    """What a conditional probe reads: ``layer1`` -> "layer0 + layer 1", ``scalar_mix`` ->
    "layer0 + scalar mix"."""
    layer = mode.removeprefix("layer")
    name = f"layer {layer}" if layer.isdigit() else mode.replace("_", " ")
    return f"{CONDITIONAL_BASE} + {name}"


def online_code_cells(
    codes: Iterable[OnlineCode], display: Display = BY_NAME
) -> dict[tuple[str, str, str], CodeCell]:
    """Online codes grouped by (task, features, encoder), in ``display`` order."""
    groups: dict[tuple[str, str, str], list[OnlineCode]] = defaultdict(list)
    for code in codes:
        groups[code.task, code.features, code.encoder].append(code)
    return {
        key: CodeCell(*key, tuple(sorted(groups[key], key=lambda code: code.seed)))
        for key in display.sort(groups)
    }


def conditional_gains(
    cells: Mapping[tuple[str, str, str], Cell],
    conditional_cells: Mapping[tuple[str, str, str], Cell],
    tester: Bootstrap,
    display: Display = BY_NAME,
) -> list[Gain]:
    """The information beyond layer 0 of every conditional cell (``conditional_cells``, features
    ``layer0+<mode>``) whose encoder has layer-0 runs of the same task (in ``cells``) with units
    in common; by task, mode (``CONDITIONAL_MODES`` first) and encoder. Bits and points are a
    family each."""
    by_task_mode: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for (task, features, _), cell in conditional_cells.items():
        mode = conditioned_mode(features)
        if mode is not None:
            by_task_mode[task, mode].append(cell)
    tasks = display.ordered_tasks(task for task, _ in by_task_mode)
    modes = ordered({mode for _, mode in by_task_mode}, CONDITIONAL_MODES)
    pairs = [
        (task, mode, baseline, cell)
        for task in tasks
        for mode in modes
        for cell in by_task_mode.get((task, mode), [])
        if (baseline := cells.get((task, CONDITIONAL_BASE, cell.encoder))) is not None
    ]
    gains = [gain for pair in pairs if (gain := _gain(*pair, tester)) is not None]
    bits = correct([g.test_bits for g in gains], lambda _: "information beyond layer 0 (bits)")
    metric = correct([g.metric for g in gains], lambda _: "information beyond layer 0 (points)")
    return [
        dataclasses.replace(gain, test_bits=b, metric=m)
        for gain, b, m in zip(gains, bits, metric, strict=True)
    ]


def _gain(
    task: str, mode: str, baseline: Cell, conditional: Cell, tester: Bootstrap
) -> Gain | None:
    """``conditional`` against its layer-0 ``baseline``; None without units in common."""
    by_unit = {unit_of(run): run for run in baseline.runs if run.applicable}
    pairs = [(by_unit[unit_of(run)], run) for run in conditional.runs if unit_of(run) in by_unit]
    pairs = [(base, run) for base, run in pairs if run.applicable]
    if not pairs:
        return None
    key = f"{task}/{mode}/{conditional.encoder}"
    terms = [(-1.0, baseline.runs), (1.0, conditional.runs)]
    saved = [(-w, runs) for w, runs in terms]
    bits_effect, bits_method = tester.test(key + "/bits", saved, paired=True, bits=True)
    metric_effect, metric_method = tester.test(key, terms, paired=True)
    return Gain(
        task=task,
        mode=mode,
        encoder=conditional.encoder,
        baseline=baseline,
        conditional=conditional,
        test_bits=TestedDifference(_bits_saved(pairs, TEST_BITS), None, bits_method, bits_effect),
        dev_bits=PerSeed(_bits_saved(pairs, DEV_BITS)),
        metric=TestedDifference(
            tuple(
                run.test - base.test
                for base, run in pairs
                if run.test is not None and base.test is not None
            ),
            None,
            metric_method,
            metric_effect,
        ),
    )


def net_gains(
    gains: Sequence[Gain], tester: Bootstrap, display: Display = BY_NAME
) -> list[NetGain]:
    """Every gain of a task that has a control task (``display.controls``) net of the same gain
    (mode, encoder) on the control task, paired by unit: a family each for bits and points."""
    by_key = {(g.task, g.mode, g.encoder): g for g in gains}
    nets = []
    for control_task, task in display.controls.items():
        for (name, mode, encoder), gain in by_key.items():
            other = by_key.get((control_task, mode, encoder))
            if name != task or other is None:
                continue
            key = f"{task}-{control_task}/{mode}/{encoder}"
            runs = (gain.baseline, gain.conditional, other.baseline, other.conditional)
            terms = list(zip((-1.0, 1.0, 1.0, -1.0), (cell.runs for cell in runs), strict=True))
            saved = [(-w, r) for w, r in terms]
            bits_effect, bits_method = tester.test(key + "/bits", saved, paired=True, bits=True)
            metric_effect, metric_method = tester.test(key, terms, paired=True)
            nets.append(
                NetGain(
                    task,
                    control_task,
                    mode,
                    encoder,
                    TestedDifference(
                        _net(gain.test_bits, other.test_bits), None, bits_method, bits_effect
                    ),
                    TestedDifference(
                        _net(gain.metric, other.metric), None, metric_method, metric_effect
                    ),
                )
            )
    bits = correct([n.test_bits for n in nets], lambda _: "gains net of the control task (bits)")
    metric = correct([n.metric for n in nets], lambda _: "gains net of the control task (points)")
    return [
        dataclasses.replace(net, test_bits=b, metric=m)
        for net, b, m in zip(nets, bits, metric, strict=True)
    ]


def _net(task: PerSeed, control: PerSeed) -> tuple[float, ...]:
    """Per unit both have (they are in the same unit order when both have every unit): the
    task's value minus the control task's; their means' difference where the units differ."""
    if task.n == control.n:
        return tuple(t - c for t, c in zip(task.values, control.values, strict=True))
    return (task.mean - control.mean,) if task.n and control.n else ()


def _bits_saved(pairs: list[tuple[ProbeRun, ProbeRun]], key: str) -> tuple[float, ...]:
    """Per pair that has ``key`` (``test_bits``, ``dev_bits``): the first's bits minus the
    second's."""
    return tuple(
        base.extra[key] - run.extra[key]
        for base, run in pairs
        if key in base.extra and key in run.extra
    )


def measure_times(
    online_codes: Mapping[tuple[str, str, str], CodeCell],
    conditional_cells: Mapping[tuple[str, str, str], Cell],
    display: Display = BY_NAME,
) -> list[MeasureTime]:
    """Per task with either measure: the summed ``wall_seconds`` of its online codes and of its
    conditional probes (runs that do not record it count 0)."""
    online: dict[str, float] = defaultdict(float)
    for (task, _, _), code_cell in online_codes.items():
        online[task] += code_cell.wall_seconds
    conditional: dict[str, float] = defaultdict(float)
    for (task, _, _), cell in conditional_cells.items():
        conditional[task] += sum(run.wall_seconds or 0.0 for run in cell.runs)
    return [
        MeasureTime(task, online.get(task), conditional.get(task))
        for task in display.ordered_tasks({*online, *conditional})
    ]
