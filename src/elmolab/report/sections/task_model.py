"""ELMo in a task model: the task model stage's test F1 per input and what each adds to the
baseline (the ELMo paper's Table 1), and its block of ``summary.json`` (the stage's summary)."""

from __future__ import annotations

from elmolab.core.schema import BASELINE, FINETUNE_PREFIX, MIX_PREFIX
from elmolab.report.collect import ROLE_LABELS, Display
from elmolab.report.data import ReportData
from elmolab.report.format import gain_cells, p_equals, p_text, verdict_cell
from elmolab.report.layout import Table, TableCell, columns_of, comparison_cells, number

TASK_MODEL_METHOD = (
    "Test span F1 (conlleval's count), mean ± std over runs, each trained until its dev F1 stopped"
    " improving and scored at its best dev epoch; a control's runs pool its instances. Against"
    " the baseline: the F1 gained (absolute error reduction, points) with its 95% interval and"
    " the share of the baseline's error removed (relative), by a two-level bootstrap that"
    " resamples the runs (seeds; a control's instances first, then their seeds) and the test"
    " sentences, its p-values Holm-adjusted over the {tests} inputs compared; better or worse"
    " where the adjusted p < {alpha}."
)


def task_model_label(name: str, display: Display, instances: int = 1) -> str:
    """An input of the task model in words: baseline, + ELMo frozen or fine-tuned (a control
    pooled over its ``instances``)."""
    if name == BASELINE:
        return "baseline: layer 0 + own word embedding"
    for prefix, how in ((MIX_PREFIX, "frozen"), (FINETUNE_PREFIX, "fine-tuned")):
        if name.startswith(prefix):
            pooled = f", {instances} instances" if instances > 1 else ""
            encoder = name.removeprefix(prefix)
            # a pooled control is named by its control (conf/controls/: random, token_layer)
            label = ROLE_LABELS[encoder][0] if encoder in ROLE_LABELS else display.label(encoder)
            return f"+ mix of {label} ({how}{pooled})"
    return name


def table(data: ReportData) -> Table | None:
    """ELMo's second stage: the task model's test F1 per input and what each adds to the
    baseline, as the ELMo paper's Table 1 reports it."""
    summary = data.taskmodel
    if not summary:
        return None
    alpha = data.significance.alpha
    columns = columns_of(
        "input",
        ("test F1", "mean ± std"),
        ("runs", "seeds x instances"),
        ("gain over baseline", "F1 points [95% CI]"),
        ("relative error reduction", "of the baseline's"),
        "p (Holm)",
        "verdict",
    )
    rows = []
    for name, row in summary["inputs"].items():
        spread = "" if row["std"] is None else f" ± {row['std']:.2f}"
        instances = row.get("instances", [name])
        seeds = len(row["seeds"])
        runs = f"{seeds} x {len(instances)}" if len(instances) > 1 else str(seeds)
        cells = [
            TableCell(
                task_model_label(name, data.display, len(instances)),
                bold=name == MIX_PREFIX + str(data.display.main),
            ),
            number(f"{row['mean']:.2f}{spread}"),
            number(runs),
        ]
        versus = summary["vs_baseline"].get(name)
        if versus is None:
            cells += [number("–"), number("–"), number("–"), TableCell("")]
        else:
            gain, relative, _ = gain_cells(versus)
            cells += comparison_cells(
                gain,
                p_text(versus["p_adjusted"]),
                *verdict_cell(task_model_verdict(versus, alpha), data.no_verdicts),
                versus["method"],
            )
            cells.insert(4, number(relative))
        rows.append(cells)
    frozen = [
        f"{task_model_label(name, data.display)} against frozen: {gain_cells(v)[0]} F1"
        + ("" if v["p_adjusted"] is None else f", {p_equals(v['p_adjusted'])} (Holm)")
        for name, v in summary.get("vs_frozen", {}).items()
    ]
    method = TASK_MODEL_METHOD.format(alpha=alpha, tests=summary["family"]["tests"])
    cap = (
        f"{summary['hit_epoch_cap']} of {summary['runs']} runs hit the epoch cap"
        f" ({summary['max_epochs']} epochs)."
    )
    return Table(
        columns,
        rows,
        [False] * len(rows),
        note_before="ELMo's second stage: a BiLSTM-CRF tagger on CoNLL-2003 NER, its input the"
        " trained token layer (layer 0, the GloVe analogue) and its own word embedding, with and"
        " without a learned scalar mix of a biLM's layers (the ELMo paper's Table 1).",
        note=" ".join([method, cap, *(f"{line}." for line in frozen)]),
    )


def task_model_verdict(versus: dict, alpha: float) -> str:
    """Better or worse than the baseline where the Holm-adjusted p is below ``alpha``."""
    p_value = versus["p_adjusted"]
    if p_value is None:
        return "not testable"
    if p_value >= alpha:
        return "no significant difference"
    return "better" if versus["effect"] > 0 else "worse"


def summary(data: ReportData) -> dict | None:
    """The task model stage's summary, carried whole; None if the stage has not run."""
    return data.taskmodel
