"""The report's files: HTML (jinja2), Markdown, ``summary.json`` and CSVs for DVC plots."""

from __future__ import annotations

import base64
import csv
import io
import math
import re
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from elmolab.report import tables
from elmolab.report.collect import DEV_BITS, STRUCTURAL_TASK, TEST_BITS
from elmolab.report.data import ReportData
from elmolab.report.information import PerSeed, TestedDifference, measure_times
from elmolab.report.sections import (
    CONDITIONAL_METHOD,
    ENCODER_METHOD,
    LAYER_METHOD,
    RANDOM_METHOD,
    SIGNIFICANCE_METHOD,
    Sections,
)
from elmolab.report.stats import Cell, EncoderComparison

TEMPLATES = Path(__file__).parent / "templates"
FIGURE_CAPTIONS = {
    "pretraining_curves": "Pretraining: validation perplexity of each direction and their "
    "mean against training tokens (log scale; dashed: the unigram baseline), and the "
    "training loss.",
    "layer_panel": "What each layer encodes: per task, grouped by family, the trained biLM's "
    "layer 2 minus layer 1 on the test set (bar: mean over seeds, error bar: one standard "
    "deviation of the per-seed differences, *: significant; colour: the layer significantly "
    "better, grey: neither), the baseline encoders' differences as diamonds and the ELMo "
    "paper's as a star; right, the centre of gravity Σ j·s_j of the learned scalar mix's "
    "weights (mean ± std over seeds; 0 = the token layer, 2 = the top layer).",
    "probes_by_task": "Test score of every feature mode per task (bars: mean over seeds, error "
    "bars: one standard deviation, dots: single seeds; outlined bar: the learned scalar mix). "
    "The y axes are zoomed and do not start at 0.",
    "task_feature_heatmap": "Test score (%) per task and feature mode. Colours rank the feature "
    "modes within each row: the darkest cell is that task's best feature mode.",
    "mix_weights": "The scalar-mix weights softmax(w) learned per task and layer (mean over "
    "seeds; γ: the learned scale), as in Figure 2 of the ELMo paper.",
    "selectivity": "Selectivity: task accuracy minus control-task accuracy of the same probe "
    "on the same features (Hewitt and Liang 2019), mean and std over seeds.",
    "probe_learning_curves": "Probe learning curves: test score against the fraction of the "
    "task's training sentences the probe saw (log scale), per encoder (colour) and feature mode "
    "(marker and line style); error bars: one standard deviation over seeds.",
    "online_code": "Online code (Voita and Titov 2020): compression (uniform code length / "
    "online code length) of each task's labels per feature mode and encoder (bars: mean over "
    "seeds, error bars: one standard deviation, dots: single seeds; dashed: the uniform code).",
    "conditional_probing": "Information beyond layer 0 (Hewitt et al. 2021): test bits per token "
    "that the probe on layer 0 beside a mode saves over the probe on layer 0 alone, per encoder "
    "(bars: mean over seeds, error bars: one standard deviation, dots: single seeds).",
}


def _environment(html: bool = True) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=html,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_html(data: ReportData, sections: Sections, pngs: dict[str, bytes], embed: bool) -> str:
    """``index.html``: every section; figures embedded (``embed``) or linked from figures/."""
    images = {
        name: f"data:image/png;base64,{base64.b64encode(png).decode('ascii')}"
        if embed
        else f"figures/{name}.png"
        for name, png in pngs.items()
    }
    return (
        _environment()
        .get_template("report.html")
        .render(
            data=data,
            images=images,
            captions=FIGURE_CAPTIONS,
            findings=sections.findings,
            tables=sections,
        )
    )


def render_markdown(data: ReportData, sections: Sections, pngs: dict[str, bytes]) -> str:
    """``summary.md``: the same tables and findings; figures linked from figures/."""
    text = (
        _environment(html=False)
        .get_template("report.md")
        .render(data=data, figures=list(pngs), findings=sections.findings, tables=sections)
    )
    return re.sub(r"\n{3,}", "\n\n", text)  # the template's optional sections leave gaps


def _number(value: float | None) -> float | None:
    """JSON has no nan: None instead."""
    return None if value is None or math.isnan(value) else value


def _training_summary(data: ReportData) -> dict[str, Any]:
    """How the trained probe runs stopped: how many, and how many at the epoch cap."""
    runs = [
        run
        for run in [*data.inputs.probes, *data.inputs.conditional, *data.inputs.curves]
        if run.applicable and run.hit_epoch_cap is not None
    ]
    capped = [run for run in runs if run.hit_epoch_cap]
    return {
        "trained_runs": len(runs),
        "hit_epoch_cap": len(capped),
        "hit_epoch_cap_share": len(capped) / len(runs) if runs else None,
        "hit_epoch_cap_by_task": {
            task: sum(run.task == task for run in capped)
            for task in sorted({run.task for run in runs})
        },
    }


def summary_json(data: ReportData) -> dict[str, Any]:
    """Every number of the report, machine-readable (scores as fractions, not percent)."""
    alpha = data.significance.alpha
    probes: dict[str, dict[str, dict[str, Any]]] = {}
    for (task, mode, encoder), cell in data.cells.items():
        probes.setdefault(task, {}).setdefault(mode, {})[encoder] = {
            "metric": cell.metric,
            "applicable": cell.applicable,
            "n": cell.n,
            "mean": _number(cell.mean),
            "std": _number(cell.std),
            "seeds": cell.seeds if cell.applicable else [],
            "test": cell.test.tolist(),
            "dev": cell.dev.tolist(),
            "mix_weights": None if cell.mix_weights is None else cell.mix_weights.tolist(),
            "gamma": cell.gamma,
            "n_train_sentences": cell.n_train_sentences,
            "extra": {key: cell.extra(key).tolist() for key in cell.extra_keys},
        }
    return {
        "title": data.title,
        "code_version": {"commit": data.version.commit, "dirty": data.version.dirty},
        "missing": data.inputs.missing,
        "pretraining": {
            "trained": data.inputs.trained.metrics if data.inputs.trained else None,
            "random": data.inputs.random.metrics if data.inputs.random else None,
        },
        "probes": probes,
        "taskmodel": data.taskmodel,
        "training": _training_summary(data),
        "significance": {
            "alpha": alpha,
            "bootstrap_samples": data.significance.bootstrap_samples,
            "method": SIGNIFICANCE_METHOD.format(alpha=alpha),
        },
        "comparisons": [
            {
                "task": c.task,
                "encoder": c.encoder,
                "best_layer": c.best_layer.features,
                "best_layer_mean": _number(c.best_layer.mean),
                "mix_mean": None if c.mix is None else _number(c.mix.mean),
                "difference": _number(c.difference),
                "p_value": c.p_value,
                "method": c.method,
                "significant": c.significant(alpha),
                "verdict": c.verdict(alpha),
            }
            for c in data.comparisons
        ],
        "trained_vs_random": {
            "method": RANDOM_METHOD.format(alpha=alpha),
            "comparisons": [_encoder_comparison(c, alpha) for c in data.random_comparisons],
        },
        "trained_vs_token_only": {
            "method": ENCODER_METHOD.format(alpha=alpha),
            "comparisons": [_encoder_comparison(c, alpha) for c in data.token_comparisons],
        },
        "learning_curves": {
            "points": [
                {
                    "task": task,
                    "features": mode,
                    "encoder": encoder,
                    "train_fraction": fraction,
                    "n_train_sentences": cell.n_train_sentences,
                    "n": cell.n,
                    "mean": _number(cell.mean),
                    "std": _number(cell.std),
                    "seeds": cell.seeds,
                    "test": cell.test.tolist(),
                }
                for (task, mode, encoder, fraction), cell in data.curve_cells.items()
            ],
            "trained_vs_token_only": [
                _encoder_comparison(c, alpha) for c in data.curve_comparisons
            ],
        },
        "structural_probe": {
            "reference_uuas": tables.STRUCTURAL_REFERENCE,
            "rows": [
                _structural_row(cell)
                for (task, _, _), cell in data.cells.items()
                if task == STRUCTURAL_TASK
            ],
        },
        "selectivity": [
            {
                "task": s.task,
                "features": s.features,
                "encoder": s.encoder,
                "task_accuracy": s.task_accuracy,
                "control_accuracy": s.control_accuracy,
                "mean": s.mean,
                "std": _number(s.std),
                "values": list(s.values),
            }
            for s in data.selectivity
        ],
        "layer_panel": _layer_panel_summary(data),
        "baselines_without_features": {
            task: {name: value for name, value in found}
            for task in data.tasks
            if (found := tables.task_baselines(data, task))
        },
        "online_code": _online_code_summary(data),
        "conditional_probing": _conditional_summary(data),
        "information_time": [
            {
                "task": t.task,
                "online_code_seconds": t.online_code,
                "conditional_seconds": t.conditional,
            }
            for t in measure_times(data.online_codes, data.conditional_cells, data.display)
        ],
        "polysemy": {
            "contextual_layers": data.polysemy_layers,
            "words": [
                {
                    "word": w.word,
                    "layer0_neighbours": [{"word": n, "cosine": s} for n, s in w.static],
                    "semcor_occurrences": w.semcor_occurrences,
                    "examples": [
                        {
                            "sentence": " ".join(e.example.tokens),
                            "position": e.example.position,
                            "neighbours": [
                                {
                                    "sentence": " ".join(n.target.tokens),
                                    "position": n.target.position,
                                    "sense_key": n.sense_key,
                                    "lexname": n.lexname,
                                    "cosine": n.similarity,
                                }
                                for n in e.neighbours
                            ],
                        }
                        for e in w.examples
                    ],
                }
                for w in data.polysemy
            ],
        },
    }


def _per_seed(values: PerSeed) -> dict[str, Any]:
    return {"mean": _number(values.mean), "std": _number(values.std), "values": list(values.values)}


def _tested(difference: TestedDifference, alpha: float) -> dict[str, Any]:
    return {
        **_per_seed(difference),
        "p_value": difference.p_value,
        "method": difference.method,
        "significant": difference.significant(alpha),
    }


def _layer_panel_summary(data: ReportData) -> dict[str, Any]:
    """Per task: its family, layer 2 minus layer 1 of every encoder with its test (fractions,
    like every score here), the main encoder's mix weights and centre of gravity, and the ELMo
    paper's layers; the findings per family."""
    alpha = data.significance.alpha
    tasks = []
    for family, task in tables.panel_tasks(data):
        mix = tables.mix_summary(data, task)
        paper = tables.PAPER_LAYERS.get(task)
        tasks.append(
            {
                "task": task,
                "family": family,
                "encoders": {
                    g.encoder: {
                        "layer1_mean": _number(g.lower.mean),
                        "layer2_mean": _number(g.upper.mean),
                        "difference": _number(g.difference),
                        "difference_std": _number(g.std),
                        "values": list(g.values),
                        "p_value": g.p_value,
                        "method": g.method,
                        "significant": g.significant(alpha),
                        "favoured": g.favoured(alpha),
                    }
                    for g in data.layer_gaps
                    if g.task == task
                },
                "mix_weights": None if mix is None else mix.weights.tolist(),
                "centre_of_gravity": None
                if mix is None
                else {
                    "mean": float(mix.gravity.mean()),
                    "std": _number(
                        float(mix.gravity.std(ddof=1)) if len(mix.gravity) > 1 else None
                    ),
                    "values": mix.gravity.tolist(),
                },
                "paper": None
                if paper is None
                else {"measure": paper[0], "layer1": paper[1], "layer2": paper[2]},
            }
        )
    return {
        "method": LAYER_METHOD.format(alpha=alpha),
        "findings": tables.family_findings(data),
        "tasks": tasks,
    }


def _online_code_summary(data: ReportData) -> dict[str, Any]:
    """Per task, feature mode and encoder: the online codes' compression and length over seeds,
    and every seed's blocks."""
    return {
        "findings": tables.online_code_findings(data),
        "cells": [
            {
                "task": cell.task,
                "features": cell.features,
                "encoder": cell.encoder,
                "seeds": cell.seeds,
                "labels": cell.labels,
                "uniform_bits": cell.uniform_bits,
                "compression": _per_seed(cell.compression),
                "online_bits": _per_seed(cell.online_bits),
                "wall_seconds": cell.wall_seconds,
                "same_features_as": cell.same_features_as,
                "blocks": [
                    {
                        "seed": code.seed,
                        "fractions": list(code.fractions),
                        "block_tokens": list(code.block_tokens),
                        "block_bits": list(code.block_bits),
                    }
                    for code in cell.codes
                ],
            }
            for cell in data.online_codes.values()
        ],
    }


def _conditional_summary(data: ReportData) -> dict[str, Any]:
    """Per task, mode and encoder: the information beyond layer 0 (bits per token on test and
    dev; the test metric's difference as a fraction, like every score here) and the runs' own
    numbers."""
    alpha = data.significance.alpha
    return {
        "method": CONDITIONAL_METHOD.format(alpha=alpha),
        "findings": tables.conditional_findings(data),
        "gains": [
            {
                "task": g.task,
                "mode": g.mode,
                "features": g.features,
                "encoder": g.encoder,
                "metric": g.conditional.metric,
                "test_bits_gain": _tested(g.test_bits, alpha),
                "dev_bits_gain": _per_seed(g.dev_bits),
                "metric_gain": _tested(g.metric, alpha),
                "layer0": _bits_runs(g.baseline),
                "conditional": _bits_runs(g.conditional),
            }
            for g in data.gains
        ],
    }


def _bits_runs(cell: Cell) -> dict[str, Any]:
    """A cell's seeds, test metric and bits per token (test, dev; None where a run lacks them)."""
    return {
        "seeds": cell.seeds,
        "test": [run.test for run in cell.runs],
        "test_bits": [run.extra.get(TEST_BITS) for run in cell.runs],
        "dev_bits": [run.extra.get(DEV_BITS) for run in cell.runs],
    }


def _structural_row(cell: Cell) -> dict[str, Any]:
    dspr = cell.extra(tables.DSPR_KEY)  # (runs with it,)
    return {
        "features": cell.features,
        "encoder": cell.encoder,
        "n": cell.n,
        "uuas_mean": _number(cell.mean),
        "uuas_std": _number(cell.std),
        "dspr_mean": float(dspr.mean()) if len(dspr) else None,
        "dspr_std": float(dspr.std(ddof=1)) if len(dspr) > 1 else None,
        "dspr": dspr.tolist(),
    }


def _encoder_comparison(c: EncoderComparison, alpha: float) -> dict[str, Any]:
    return {
        "task": c.task,
        "features": c.features,
        "train_fraction": c.train_fraction,
        "encoder": c.encoder,
        "baseline": c.baseline,
        "encoder_mean": _number(c.cell.mean),
        "encoder_std": _number(c.cell.std),
        "baseline_mean": _number(c.baseline_cell.mean),
        "baseline_std": _number(c.baseline_cell.std),
        "n": c.cell.n,
        "difference": _number(c.difference),
        "p_value": c.p_value,
        "method": c.method,
        "significant": c.significant(alpha),
        "verdict": c.verdict(alpha),
    }


def headline_metrics(data: ReportData) -> dict[str, Any]:
    """``metrics.json``: the numbers to compare across experiments (``dvc exp show``), numeric
    only: validation perplexity, and per task and encoder the best single layer (its index and
    test score), the scalar mix's test score, their difference and its p-value."""
    metrics: dict[str, Any] = {}
    if data.inputs.trained is not None:
        val = data.inputs.trained.metrics["val"]
        metrics["pretraining"] = {f"val_{key}": val[key] for key in ("ppl", "ppl_fwd", "ppl_bwd")}
    for c in data.comparisons:
        metrics.setdefault(c.task, {})[c.encoder] = {
            "best_layer": int(c.best_layer.features.removeprefix("layer")),
            "best_layer_test": _number(c.best_layer.mean),
            "scalar_mix_test": None if c.mix is None else _number(c.mix.mean),
            "mix_minus_layer": _number(c.difference),
            "p_value": c.p_value,
        }
    return metrics


def plot_csvs(data: ReportData) -> dict[str, str]:
    """CSVs for DVC plots, by path under ``plots/``, scores in percent:

    - ``validation_perplexity.csv``: curve.csv's rows that have a validation (DVC's vega plots
      would draw the empty cells of the other rows as zeros);
    - ``probes/<task>.csv``: one row per feature mode and encoder (``label`` is
      ``"<features> <encoder>"``), mean and std over seeds.
    """
    files = {}
    trained = data.inputs.trained
    if trained is not None and trained.curve is not None:
        columns = ["step", "tokens", "val_ppl", "val_ppl_fwd", "val_ppl_bwd"]
        rows = ~np.isnan(trained.curve["val_ppl"])
        table = np.stack([trained.curve[c][rows] for c in columns], axis=1)  # (rows, columns)
        lines = [",".join(columns)]
        lines += [
            ",".join(f"{v:.0f}" for v in row[:2]) + "," + ",".join(f"{v:.4f}" for v in row[2:])
            for row in table
        ]
        files["validation_perplexity.csv"] = "\n".join(lines) + "\n"
    features = data.display.ordered_features({f for _, f, _ in data.cells})
    for task in dict.fromkeys(t for t, _, _ in data.cells):
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["label", "features", "encoder", "mean", "std", "n"])
        for mode in features:
            for encoder in data.encoders:
                cell = data.cells.get((task, mode, encoder))
                if cell is None or not cell.n:
                    continue
                std = "" if math.isnan(cell.std) else f"{100 * cell.std:.4f}"
                writer.writerow(
                    [f"{mode} {encoder}", mode, encoder, f"{100 * cell.mean:.4f}", std, cell.n]
                )
        files[f"probes/{task}.csv"] = buffer.getvalue()
    return files
