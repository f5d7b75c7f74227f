"""The report's figures, drawn with matplotlib's object API (no pyplot, no GUI backend).

Scores are shown in percent. Colours mean the same thing in every figure: the trained biLM is
blue, the random-initialisation control grey, the trained token layer under random LSTMs orange.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator, StrMethodFormatter

from elmolab.report.collect import (
    SCALAR_MIX,
    SINGLE_LAYERS,
    Display,
    Pretraining,
)
from elmolab.report.format import token_count
from elmolab.report.information import CodeCell, Gain, conditional_label
from elmolab.report.stats import Cell, LayerGap, Selectivity

# An encoder's colour by its role (report.encoders); an encoder without a role is OTHER_COLOR.
ROLE_COLORS = {"main": "#1f5fa8", "random": "#a0a0a0", "token_layer": "#e08a2c"}
OTHER_COLOR = "#6a3d9a"
# Learning curves: a feature mode's marker and line style (the encoder is the colour).
FEATURE_STYLES = {
    "layer0": ("o", ":"),
    "layer1": ("s", "-"),
    "layer2": ("^", "-"),
    "mean": ("D", "--"),
    "scalar_mix": ("*", "-."),
    "concat": ("v", "--"),
}
OTHER_STYLE = ("x", "-")
# Neighbouring lines' points sit this many decades apart so that their error bars stay apart,
# all of them within CURVE_SPREAD decades (a tenth of the 1%-10% step per side).
CURVE_DODGE = 0.025
CURVE_SPREAD = 0.2
BAR_GROUP_WIDTH = 0.8  # of one feature mode's bars together, in x units
# The layer panel: a bar's colour says which layer is significantly better, if either.
FAVOURED_COLORS = {"layer1": "#1b9e77", "layer2": "#7b3294", None: "#c4c4c4"}
FAVOURED_LABELS = {
    "layer1": "layer 1 significantly better",
    "layer2": "layer 2 significantly better",
    None: "no significant difference",
}
CURVES = {  # curve.csv column: (label, colour, line width)
    "val_ppl": ("mean of both directions", "#1f5fa8", 2.4),
    "val_ppl_fwd": ("forward LM", "#d95f02", 1.2),
    "val_ppl_bwd": ("backward LM", "#1b9e77", 1.2),
}

Cells = dict[tuple[str, str, str], Cell]


def to_png(figure: Figure, dpi: int) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", facecolor="white")
    return buffer.getvalue()


def encoder_color(encoder: str, display: Display) -> str:
    role = display.role(encoder)
    return OTHER_COLOR if role is None else ROLE_COLORS[role]


def _tidy(axis: Axes, grid_axis: str = "both") -> None:
    axis.grid(axis=grid_axis, alpha=0.3)
    axis.spines[["top", "right"]].set_visible(False)


def _encoder_legend(encoders: list[str], display: Display) -> tuple[list[Rectangle], list[str]]:
    handles = [Rectangle((0, 0), 1, 1, color=encoder_color(e, display)) for e in encoders]
    return handles, [display.label(e) for e in encoders]


def _bar_x(feature: int, encoder: int, n_encoders: int) -> float:
    """The centre of encoder ``encoder``'s bar in the group of feature mode ``feature``."""
    return feature + (encoder - (n_encoders - 1) / 2) * BAR_GROUP_WIDTH / n_encoders


def learning_curves(trained: Pretraining) -> Figure:
    """Validation perplexity (log scale) and training loss against training tokens."""
    curve = trained.curve
    if curve is None:
        raise ValueError("learning_curves needs the trained biLM's curve")
    figure = Figure(figsize=(11, 3.8), layout="tight")
    left, right = figure.subplots(1, 2)
    tokens = curve["tokens"]  # (rows,)
    counts = FuncFormatter(lambda x, _: token_count(x))  # a quick look's 20k, not 0.02 million
    for column, (label, color, width) in CURVES.items():
        rows = ~np.isnan(curve[column])  # validation happens on some rows only
        left.plot(
            tokens[rows],
            curve[column][rows],
            "o-",
            markersize=3,
            color=color,
            linewidth=width,
            label=label,
        )
    unigram = trained.metrics.get("unigram_ppl", {}).get("valid")
    if unigram is not None:
        left.axhline(unigram, color="black", linestyle="--", linewidth=1)
        left.annotate(
            f"unigram baseline {unigram:,.0f}",
            (0.01, unigram),
            va="bottom",
            xycoords=("axes fraction", "data"),
            fontsize=9,
        )
    left.set_yscale("log")
    plain = StrMethodFormatter("{x:,.0f}")  # 200, not 2 x 10^2
    low, high = left.get_ylim()
    left.yaxis.set_major_formatter(plain)
    left.yaxis.set_minor_formatter(plain if high / low < 10 else NullFormatter())
    left.xaxis.set_major_formatter(counts)
    left.set(
        xlabel="training tokens",
        ylabel="validation perplexity (log scale)",
        title="Validation perplexity (lower is better)",
    )
    left.legend(frameon=False, fontsize=9)
    rows = ~np.isnan(curve["train_loss"])
    right.plot(tokens[rows], curve["train_loss"][rows], color="#555555", linewidth=1)
    right.xaxis.set_major_formatter(counts)
    right.set(
        xlabel="training tokens",
        ylabel="training loss (nats per token)",
        title="Training loss (both directions)",
    )
    _tidy(left)
    _tidy(right)
    return figure


def probe_bars(cells: Cells, tasks: list[str], encoders: list[str], display: Display) -> Figure:
    """Per task, the test metric of every feature mode, one bar per encoder: mean over seeds,
    error bar one standard deviation, dots the single seeds. The y axes are zoomed."""
    figure, axes = _task_panels(len(tasks), columns=3, width=4.6, height=3.3)
    features = display.ordered_features({f for _, f, _ in cells})
    width = 0.92 * BAR_GROUP_WIDTH / len(encoders)
    for axis, task in zip(axes, tasks, strict=False):
        shown: list[float] = []  # every drawn value, to zoom the y axis
        for e, encoder in enumerate(encoders):
            for i, mode in enumerate(features):
                cell = cells.get((task, mode, encoder))
                x = _bar_x(i, e, len(encoders))
                if cell is None or not cell.n:
                    if cell is not None and not cell.applicable:
                        axis.text(
                            x,
                            0.02,
                            "n/a",
                            transform=axis.get_xaxis_transform(),
                            ha="center",
                            fontsize=8,
                            color="#777777",
                        )
                    continue
                mean, std = 100 * cell.mean, 0.0 if cell.n < 2 else 100 * cell.std
                axis.bar(
                    x,
                    mean,
                    width,
                    color=encoder_color(encoder, display),
                    linewidth=1.2,
                    edgecolor="black" if mode == SCALAR_MIX else "none",
                )
                if cell.n > 1:
                    axis.errorbar(x, mean, yerr=std, color="black", capsize=2, linewidth=1)
                seeds = 100 * cell.test  # (n,)
                axis.plot(np.full(len(seeds), x), seeds, ".", color="black", markersize=3)
                shown += [*seeds, mean - std, mean + std]
        metric = next((c.metric for (t, _, _), c in cells.items() if t == task and c.metric), "")
        axis.set_title(f"{task} ({metric.replace('_', ' ')})", fontsize=11)
        axis.set_xticks(range(len(features)), [f.replace("_", "\n") for f in features], fontsize=8)
        if shown:
            low, high = min(shown), max(shown)
            margin = max(0.5, 0.15 * (high - low))
            axis.set_ylim(max(0.0, low - margin), min(100.0, high + margin))
        axis.set_ylabel("test score (%)", fontsize=9)
        _tidy(axis, "y")
    _encoder_legend_on_top(figure, encoders, display)
    return figure


def heatmap(cells: Cells, tasks: list[str], encoders: list[str], display: Display) -> Figure:
    """Task x feature mode, one panel per encoder; numbers are test scores (%), colours rank the
    feature modes within each task and panel (the best is darkest)."""
    features = display.ordered_features({f for _, f, _ in cells})
    grid = np.full((len(encoders), len(tasks), len(features)), np.nan)  # (encoders, tasks, modes)
    for (task, mode, encoder), cell in cells.items():
        if task in tasks and encoder in encoders and cell.n:
            grid[encoders.index(encoder), tasks.index(task), features.index(mode)] = 100 * cell.mean
    # Colour = rank within the row: the layer-0 scores sit far below the rest and would wash
    # out a linear scale. 0 for the worst mode, 1 for the best; nan stays nan.
    ranks = np.where(np.isnan(grid), np.nan, np.argsort(np.argsort(np.nan_to_num(grid, nan=-1))))
    present = (~np.isnan(grid)).sum(axis=2, keepdims=True)  # (encoders, tasks, 1)
    missing = grid.shape[2] - present  # nan cells rank lowest; shift them out
    relative = (ranks - missing) / np.maximum(present - 1, 1)
    figure = Figure(
        figsize=(0.95 * len(features) * len(encoders) + 2, 0.5 * len(tasks) + 1.6),
        layout="constrained",
    )
    for e, (axis, encoder) in enumerate(
        zip(figure.subplots(1, len(encoders), squeeze=False)[0], encoders, strict=True)
    ):
        axis.imshow(relative[e], cmap="Blues", vmin=-0.15, vmax=1.0, aspect="auto")
        for t, task in enumerate(tasks):
            for f, mode in enumerate(features):
                cell, value = cells.get((task, mode, encoder)), grid[e, t, f]
                if cell is not None and not cell.applicable:
                    text = "n/a"
                else:
                    text = "–" if math.isnan(value) else f"{value:.1f}"
                dark = not math.isnan(value) and relative[e, t, f] > 0.6
                axis.text(
                    f,
                    t,
                    text,
                    ha="center",
                    va="center",
                    fontsize=9,
                    color="white" if dark else "black",
                )
        axis.set_xticks(range(len(features)), features, rotation=30, ha="right", fontsize=9)
        axis.set_yticks(range(len(tasks)), tasks if e == 0 else [""] * len(tasks), fontsize=9)
        axis.set_title(display.label(encoder), fontsize=11)
    return figure


def mix_weights(cells: Cells, tasks: list[str], encoders: list[str], display: Display) -> Figure:
    """The learned scalar-mix weights softmax(w)_j per task and layer (ELMo paper, Figure 2),
    mean over seeds, one panel per encoder; gamma right of each row."""
    figure = Figure(
        figsize=(3.8 * len(encoders) + 1, 0.45 * len(tasks) + 1.5), layout="constrained"
    )
    panels = figure.subplots(1, len(encoders), squeeze=False)[0]
    for e, (axis, encoder) in enumerate(zip(panels, encoders, strict=True)):
        weights = np.full((len(tasks), len(SINGLE_LAYERS)), np.nan)  # (tasks, layers)
        for t, task in enumerate(tasks):
            cell = cells.get((task, SCALAR_MIX, encoder))
            mean = None if cell is None else cell.mix_weights
            if mean is not None:
                weights[t, : len(mean)] = mean
            if cell is not None and cell.gamma is not None:
                axis.text(
                    len(SINGLE_LAYERS) - 0.4, t, f" γ = {cell.gamma:.2f}", va="center", fontsize=8
                )
        axis.imshow(weights, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
        for (t, j), value in np.ndenumerate(weights):
            axis.text(
                j,
                t,
                "–" if math.isnan(value) else f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=9,
                color="white" if value > 0.6 else "black",
            )
        axis.set_xticks(
            range(len(SINGLE_LAYERS)), ["layer 0\n(char CNN)", "layer 1", "layer 2"], fontsize=9
        )
        axis.set_yticks(range(len(tasks)), tasks if e == 0 else [""] * len(tasks), fontsize=9)
        axis.set_title(display.label(encoder), fontsize=11)
    return figure


def selectivity_bars(
    selectivity: list[Selectivity], encoders: list[str], display: Display
) -> Figure:
    """Selectivity (task accuracy minus control accuracy, points) per feature mode and encoder."""
    tasks = list(dict.fromkeys(s.task for s in selectivity))
    by_key = {(s.task, s.features, s.encoder): s for s in selectivity}
    features = display.ordered_features({s.features for s in selectivity})
    width = 0.92 * BAR_GROUP_WIDTH / len(encoders)
    figure = Figure(figsize=(6.5 * len(tasks), 3.4), layout="constrained")
    for axis, task in zip(figure.subplots(1, len(tasks), squeeze=False)[0], tasks, strict=True):
        for e, encoder in enumerate(encoders):
            for i, mode in enumerate(features):
                s = by_key.get((task, mode, encoder))
                if s is None:
                    continue
                x = _bar_x(i, e, len(encoders))
                std = 0.0 if math.isnan(s.std) else 100 * s.std
                axis.bar(
                    x,
                    100 * s.mean,
                    width,
                    yerr=std,
                    capsize=2,
                    color=encoder_color(encoder, display),
                )
                axis.text(
                    x,
                    100 * s.mean + std,
                    f"{100 * s.mean:.1f}",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        axis.set_xticks(range(len(features)), [f.replace("_", "\n") for f in features], fontsize=8)
        axis.set_ylabel("selectivity (accuracy points)", fontsize=9)
        axis.set_title(f"{task}: accuracy minus {task}_control accuracy", fontsize=11)
        axis.legend(*_encoder_legend(encoders, display), frameon=False, fontsize=8)
        _tidy(axis, "y")
    return figure


def probe_learning_curves(
    curve_cells: dict[tuple[str, str, str, float], Cell], display: Display
) -> Figure:
    """Per task, the test metric against the fraction of training sentences (log axis): a line
    per encoder (colour) and feature mode (marker, line style), error bars one standard deviation
    over seeds. One legend for all panels."""
    tasks = list(dict.fromkeys(key[0] for key in curve_cells))
    lines = list(dict.fromkeys(key[1:3] for key in curve_cells))  # (features, encoder)
    fractions = sorted({key[3] for key in curve_cells})
    # at least as wide as the one-row legend
    figure, axes = _task_panels(len(tasks), columns=3, width=4.6, min_width=9.0, legend=0.8)
    step = min(CURVE_DODGE, CURVE_SPREAD / max(len(lines) - 1, 1))
    for axis, task in zip(axes, tasks, strict=False):
        for n, (features, encoder) in enumerate(lines):
            points = [
                (x, cell)
                for x in fractions
                if (cell := curve_cells.get((task, features, encoder, x))) is not None and cell.n
            ]
            if not points:
                continue
            dodge = 10 ** (step * (n - (len(lines) - 1) / 2))
            x = np.array([fraction for fraction, _ in points]) * dodge  # (points,)
            mean = np.array([100 * cell.mean for _, cell in points])  # (points,)
            std = np.array([0.0 if cell.n < 2 else 100 * cell.std for _, cell in points])
            marker, style = FEATURE_STYLES.get(features, OTHER_STYLE)
            axis.errorbar(
                x,
                mean,
                yerr=std,
                color=encoder_color(encoder, display),
                marker=marker,
                linestyle=style,
                markersize=5,
                linewidth=1.4,
                capsize=2,
            )
        metric = next(
            (c.metric for (t, _, _, _), c in curve_cells.items() if t == task and c.metric), ""
        )
        axis.set_xscale("log")
        axis.set_xticks(fractions, [f"{100 * x:g}%" for x in fractions])
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xlim(min(fractions) / 1.6, max(fractions) * 1.6)
        axis.set(xlabel="training sentences (log scale)", ylabel="test score (%)")
        axis.set_title(f"{task} ({metric.replace('_', ' ')})", fontsize=11)
        _tidy(axis)
    encoders = display.ordered_encoders({encoder for _, encoder in lines})
    modes = display.ordered_features({features for features, _ in lines})
    handles = [Line2D([], [], color=encoder_color(e, display), linewidth=3) for e in encoders]
    handles += [
        Line2D(
            [],
            [],
            color="black",
            marker=FEATURE_STYLES.get(m, OTHER_STYLE)[0],
            linestyle=FEATURE_STYLES.get(m, OTHER_STYLE)[1],
        )
        for m in modes
    ]
    figure.legend(
        handles,
        [display.label(e) for e in encoders] + modes,
        loc="outside upper center",
        ncol=len(handles),  # one row: the encoders (colours), then the modes (markers)
        frameon=False,
        fontsize=9,
    )
    return figure


def _task_panels(
    n_tasks: int,
    columns: int,
    width: float,
    height: float = 3.4,
    min_width: float = 0.0,
    legend: float = 0.4,
) -> tuple[Figure, list[Axes]]:
    """A figure with one panel per task, at most ``columns`` a row (each ``width`` x ``height``
    inches, ``legend`` inches on top for the legend), and its first ``n_tasks`` axes; the
    panels left over are hidden."""
    columns = min(columns, n_tasks)
    rows = math.ceil(n_tasks / columns)
    size = (max(width * columns, min_width), height * rows + legend)
    figure = Figure(figsize=size, layout="constrained")
    axes = list(figure.subplots(rows, columns, squeeze=False).flat)
    for axis in axes[n_tasks:]:
        axis.set_visible(False)
    return figure, axes[:n_tasks]


def _encoder_legend_on_top(figure: Figure, encoders: list[str], display: Display) -> None:
    figure.legend(
        *_encoder_legend(encoders, display),
        loc="outside upper center",
        ncol=len(encoders),
        frameon=False,
    )


def _value_bars(
    axis: Axes,
    modes: list[str],
    encoders: list[str],
    values: Callable[[str, str], np.ndarray | None],
    *,
    label: str,
    ticks: list[str],
    ylabel: str,
    title: str,
    display: Display,
) -> None:
    """A panel of bars, a group per mode (``ticks`` its labels), one bar per encoder
    (:func:`_bar_value`): ``values(mode, encoder)`` gives the per-seed values (None: no bar),
    ``label`` formats their mean."""
    width = 0.92 * BAR_GROUP_WIDTH / len(encoders)
    for e, encoder in enumerate(encoders):
        for i, mode in enumerate(modes):
            seeds = values(mode, encoder)
            if seeds is not None:
                x = _bar_x(i, e, len(encoders))
                color = encoder_color(encoder, display)
                _bar_value(axis, x, seeds, width, color, label.format(seeds.mean()))
    axis.set_xticks(range(len(modes)), ticks, fontsize=8)
    axis.set_xlim(-0.5, len(modes) - 0.5)
    axis.set_ylabel(ylabel, fontsize=9)
    axis.set_title(title, fontsize=11)
    _tidy(axis, "y")


def _bar_value(
    axis: Axes, x: float, values: np.ndarray, width: float, color: str, label: str
) -> None:
    """One bar: the mean of ``values`` (one per seed), an error bar of one standard deviation
    for several, the seeds as dots, and ``label`` above it."""
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    axis.bar(x, mean, width, yerr=std if len(values) > 1 else None, capsize=2, color=color)
    axis.plot(np.full(len(values), x), values, ".", color="black", markersize=3)
    top = max(mean + std, float(values.max()), 0.0)
    axis.text(x, top, label, ha="center", va="bottom", fontsize=7)


def online_code_bars(code_cells: dict[tuple[str, str, str], CodeCell], display: Display) -> Figure:
    """Per task (control tasks included), the compression of the online code (uniform / online
    code length) per feature mode, one bar per encoder; the dashed line is the uniform code."""
    tasks = list(dict.fromkeys(task for task, _, _ in code_cells))
    encoders = display.ordered_encoders({encoder for _, _, encoder in code_cells})
    figure, axes = _task_panels(len(tasks), columns=2, width=6.5)
    for axis, task in zip(axes, tasks, strict=True):
        features = display.ordered_features({f for t, f, _ in code_cells if t == task})

        def compression(mode: str, encoder: str, task: str = task) -> np.ndarray | None:
            cell = code_cells.get((task, mode, encoder))
            return None if cell is None else np.array(cell.compression.values)  # (seeds,)

        axis.axhline(1.0, color="black", linestyle="--", linewidth=1)
        _value_bars(
            axis,
            features,
            encoders,
            compression,
            label="{:.2f}",
            ticks=[f.replace("_", "\n") for f in features],
            ylabel="compression (uniform / online)",
            title=f"{task}: online code",
            display=display,
        )
    _encoder_legend_on_top(figure, encoders, display)
    return figure


def conditional_bars(gains: list[Gain], display: Display) -> Figure:
    """Per task, the information beyond layer 0 (test bits per token the probe on layer 0 beside
    a mode saves over the probe on layer 0 alone) per mode, one bar per encoder."""
    tasks = list(dict.fromkeys(gain.task for gain in gains))
    encoders = display.ordered_encoders({gain.encoder for gain in gains})
    by_key = {(g.task, g.mode, g.encoder): g for g in gains}
    figure, axes = _task_panels(len(tasks), columns=2, width=6.0)
    for axis, task in zip(axes, tasks, strict=True):
        modes = list(dict.fromkeys(g.mode for g in gains if g.task == task))

        def bits(mode: str, encoder: str, task: str = task) -> np.ndarray | None:
            gain = by_key.get((task, mode, encoder))
            return None if gain is None or not gain.test_bits.n else np.array(gain.test_bits.values)

        axis.axhline(0.0, color="black", linewidth=0.8)
        _value_bars(
            axis,
            modes,
            encoders,
            bits,
            label="{:+z.2f}",
            ticks=[conditional_label(mode).replace(" + ", " +\n") for mode in modes],
            ylabel="bits/token beyond layer 0 (test)",
            title=f"{task}: information beyond layer 0",
            display=display,
        )
    _encoder_legend_on_top(figure, encoders, display)
    return figure


def layer_panel(
    tasks: list[tuple[str, str]],
    gaps: list[LayerGap],
    gravity: dict[str, np.ndarray],
    paper: dict[str, float],
    main: str,
    alpha: float | None,
    display: Display,
) -> Figure:
    """What each layer encodes, a row per task grouped by family (``tasks``: (family, task)).

    Left: layer 2 minus layer 1 of the ``main`` encoder (bar: mean over seeds, error bar: one
    standard deviation of the per-seed differences; colour: which layer is significantly better
    at ``alpha``; None: no verdicts, every bar grey and unmarked), the other encoders' as markers,
    the ELMo paper's (``paper``, task -> difference) as a star. Right: the centre of gravity of
    the main encoder's scalar mix (``gravity``, task -> per-seed values), 0 = the token layer.
    """
    by_key = {(g.task, g.encoder): g for g in gaps}
    others = display.ordered_encoders({g.encoder for g in gaps} - {main})
    y_of: dict[str, float] = {}  # task -> its row; a family's header row above its tasks
    headers: dict[str, float] = {}
    y = 0.0
    for family in dict.fromkeys(family for family, _ in tasks):
        headers[family] = y
        y += 1
        for _, task in (row for row in tasks if row[0] == family):
            y_of[task] = y
            y += 1
    figure = Figure(figsize=(10.5, 0.42 * y + 1.7), layout="constrained")
    bars, centre = figure.subplots(1, 2, sharey=True, width_ratios=[3.2, 1])
    for task, row in y_of.items():
        gap = by_key.get((task, main))
        if gap is not None:
            std = 0.0 if math.isnan(gap.std) else 100 * gap.std
            bars.barh(
                row,
                100 * gap.difference,
                0.62,
                xerr=std if std else None,
                capsize=2,
                color=FAVOURED_COLORS[None if alpha is None else gap.favoured(alpha)],
            )
            mark = "*" if alpha is not None and gap.significant(alpha) else ""
            end = 100 * gap.difference + (std if gap.difference >= 0 else -std)
            bars.text(
                end,
                row,
                f" {100 * gap.difference:+.2f}{mark} ",
                va="center",
                ha="left" if gap.difference >= 0 else "right",
                fontsize=8,
            )
        for k, encoder in enumerate(others):
            other = by_key.get((task, encoder))
            if other is not None:
                offset = 0.22 * (k - (len(others) - 1) / 2)
                bars.plot(
                    100 * other.difference,
                    row + offset,
                    "D",
                    color=encoder_color(encoder, display),
                    markersize=5,
                    markeredgecolor="black",
                    markeredgewidth=0.5,
                )
        if task in paper:
            bars.plot(100 * paper[task], row, "*", color="black", markersize=11)
        values = gravity.get(task)
        if values is None:
            centre.text(1.0, row, "no mix (1-NN)", ha="center", va="center", fontsize=8)
        else:
            spread = float(values.std(ddof=1)) if len(values) > 1 else None
            centre.errorbar(
                float(values.mean()), row, xerr=spread, fmt="o", color="black", capsize=2
            )
            centre.text(
                float(values.mean()), row - 0.32, f"{values.mean():.2f}", ha="center", fontsize=7
            )
    labels = {**{row: task for task, row in y_of.items()}, **{r: f for f, r in headers.items()}}
    bars.set_yticks(sorted(labels), [labels[r] for r in sorted(labels)], fontsize=9)
    for tick, row in zip(bars.get_yticklabels(), sorted(labels), strict=True):
        if row in headers.values():
            tick.set_fontweight("bold")
            tick.set_fontsize(10)
    bars.invert_yaxis()
    bars.axvline(0.0, color="black", linewidth=0.8)
    bars.set_xlabel("layer 2 − layer 1, test score points   (← layer 1 better | layer 2 better →)")
    bars.set_title(f"{display.label(main)}: layer 2 minus layer 1", fontsize=11)
    _tidy(bars, "x")
    bars.margins(x=0.18)
    centre.axvline(1.0, color="#888888", linestyle="--", linewidth=0.8)
    centre.set_xlim(-0.1, 2.1)
    centre.set_xticks([0, 1, 2], ["0\n(token)", "1", "2"], fontsize=8)
    centre.set_title("scalar mix: centre of gravity Σ j·s_j", fontsize=10)
    _tidy(centre, "x")
    verdicts = FAVOURED_COLORS if alpha is not None else {}
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in verdicts.values()]
    names = [FAVOURED_LABELS[favoured] for favoured in verdicts]
    for encoder in others:
        handles.append(
            Line2D(
                [],
                [],
                marker="D",
                linestyle="",
                color=encoder_color(encoder, display),
                markersize=5,
            )
        )
        names.append(f"{display.label(encoder)}: layer 2 − layer 1")
    if paper:
        handles.append(Line2D([], [], marker="*", linestyle="", color="black", markersize=10))
        names.append("ELMo paper")
    figure.legend(handles, names, loc="outside upper center", ncol=3, frameon=False, fontsize=8)
    return figure
