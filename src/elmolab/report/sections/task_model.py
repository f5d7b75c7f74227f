"""ELMo in a task model: the task model stage's test F1 per input and what each adds to the
baseline (the ELMo paper's Table 1), and its block of ``summary.json`` (the stage's summary)."""

from __future__ import annotations

from elmolab.core.schema import BASELINE, FINETUNE_PREFIX, MIX_PREFIX
from elmolab.report.collect import Display
from elmolab.report.data import ReportData
from elmolab.report.format import p_equals, p_text, verdict_cell
from elmolab.report.layout import Table, TableCell, columns_of, comparison_cells, number

TASK_MODEL_METHOD = (
    "Test span F1 (conlleval's count), mean ± std over seeds; each input trained with the same"
    " seeds. Against the baseline: the F1 gained (absolute error reduction, points) and the"
    " share of the baseline's error removed (relative), with a two-sided paired t-test over"
    " seeds, significant when p < {alpha}."
)


def task_model_label(name: str, display: Display) -> str:
    """An input of the task model in words: baseline, + ELMo frozen or fine-tuned."""
    if name == BASELINE:
        return "baseline: layer 0 + own word embedding"
    for prefix, how in ((MIX_PREFIX, "frozen"), (FINETUNE_PREFIX, "fine-tuned")):
        if name.startswith(prefix):
            return f"+ mix of {display.label(name.removeprefix(prefix))} ({how})"
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
        "seeds",
        ("gain over baseline", "F1 points"),
        ("relative error reduction", "of the baseline's"),
        "p",
        "verdict",
    )
    rows = []
    for name, row in summary["inputs"].items():
        spread = "" if row["std"] is None else f" ± {row['std']:.2f}"
        cells = [
            TableCell(
                task_model_label(name, data.display),
                bold=name == MIX_PREFIX + str(data.display.main),
            ),
            number(f"{row['mean']:.2f}{spread}"),
            number(str(len(row["seeds"]))),
        ]
        versus = summary["vs_baseline"].get(name)
        if versus is None:
            cells += [number("–"), number("–"), number("–"), TableCell("")]
        else:
            p_value = versus["p_value"]
            relative = versus["relative"]
            if p_value is None:
                verdict = "not testable"
            elif p_value >= alpha:
                verdict = "no significant difference"
            else:
                verdict = "better" if versus["absolute"] > 0 else "worse"
            cells += comparison_cells(
                f"{versus['absolute']:+.2f}",
                p_text(p_value) if p_value is not None else "–",
                *verdict_cell(verdict, data.no_verdicts),
                versus["test"],
            )
            cells.insert(4, number("–" if relative is None else f"{relative:+.1f}%"))
        rows.append(cells)
    frozen = [
        f"{task_model_label(name, data.display)} against frozen: {v['absolute']:+.2f} F1"
        + ("" if v["p_value"] is None else f", {p_equals(v['p_value'])}")
        for name, v in summary.get("vs_frozen", {}).items()
    ]
    return Table(
        columns,
        rows,
        [False] * len(rows),
        note_before="ELMo's second stage: a BiLSTM-CRF tagger on CoNLL-2003 NER, its input the"
        " trained token layer (layer 0, the GloVe analogue) and its own word embedding, with and"
        " without a learned scalar mix of a biLM's layers (the ELMo paper's Table 1).",
        note=" ".join([TASK_MODEL_METHOD.format(alpha=alpha), *(f"{line}." for line in frozen)]),
    )


def summary(data: ReportData) -> dict | None:
    """The task model stage's summary, carried whole; None if the stage has not run."""
    return data.taskmodel
