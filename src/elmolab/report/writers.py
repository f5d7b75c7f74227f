"""The report's renderings: HTML and Markdown (jinja2 templates) of the sections, and CSVs for DVC
plots."""

from __future__ import annotations

import base64
import csv
import io
import math
import re
from pathlib import Path

import jinja2
import numpy as np

from elmolab.report.data import ReportData
from elmolab.report.sections import Sections

TEMPLATES = Path(__file__).parent / "templates"
LAYER_PANEL_CAPTION = (
    "What each layer encodes: per task, grouped by family, the trained biLM's layer 2 minus layer"
    " 1 on the test set (bar: mean over seeds, error bar: one standard deviation of the per-seed"
    " differences{verdicts}), the baseline encoders' differences as diamonds and the ELMo paper's"
    " as a star; right, the centre of gravity Σ j·s_j of the learned scalar mix's weights (mean ±"
    " std over seeds; 0 = the token layer, 2 = the top layer)."
)
FIGURE_CAPTIONS = {
    "pretraining_curves": "Pretraining: validation perplexity of each direction and their "
    "mean against training tokens (log scale; dashed: the unigram baseline), and the "
    "training loss.",
    "layer_panel": LAYER_PANEL_CAPTION.format(
        verdicts=", *: significant; colour: the layer significantly better, grey: neither"
    ),
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
# The captions that change where the report draws no verdicts (ReportData.no_verdicts).
NO_VERDICT_CAPTIONS = {
    "layer_panel": LAYER_PANEL_CAPTION.format(verdicts="; no verdicts: see the main result")
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
            captions=FIGURE_CAPTIONS | (NO_VERDICT_CAPTIONS if data.no_verdicts else {}),
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
