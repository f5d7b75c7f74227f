"""The report's tables as one model: each section's :class:`Table`, which the HTML template
(``templates/report.html``) and the Markdown template (``templates/report.md``) both render.

:mod:`elmolab.report.tables` computes each section's rows (what the numbers are); this module lays
them out (columns, cells, emphasis, hover text, notes) once, so that the two renderings cannot
drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elmolab.report import tables
from elmolab.report.collect import Display
from elmolab.report.data import ReportData
from elmolab.report.information import conditional_label
from elmolab.schema import BASELINE, FINETUNE_PREFIX, MIX_PREFIX

SIGNIFICANCE_METHOD = (
    "Scalar mix vs the best single layer (chosen on dev), test set: a paired bootstrap over "
    "test sentences when per-sentence counts exist (accuracy tasks), else a paired t-test over "
    "seeds; two-sided, significant when p < {alpha}."
)
ENCODER_METHOD = (
    "Trained biLM minus its trained token layer (char CNN, highway, projection) under random "
    "orthogonal LSTMs, same task, features and seeds, test set: a paired bootstrap over test "
    "sentences when per-sentence counts exist, else a paired t-test over seeds; two-sided, "
    "significant when p < {alpha}. On layer0 both encoders have the same features by "
    "construction, so the difference there is 0."
)


@dataclass(frozen=True)
class Column:
    title: str
    detail: str = ""  # a second, smaller header line (Markdown: in parentheses)


@dataclass(frozen=True)
class TableCell:
    text: str
    numeric: bool = False  # right-aligned figures
    detail: str = ""  # smaller text after the main text (Markdown: in parentheses)
    hover: str = ""  # how a figure came about (HTML: a tooltip; Markdown drops it)
    bold: bool = False
    italic: bool = False
    badge: str = ""  # a verdict's class (good, bad, neutral): HTML draws a badge
    not_significant: bool = False  # a scalar mix not significantly different: marked ≈

    @property
    def classes(self) -> str:
        """The HTML cell's CSS classes."""
        names = [("num", self.numeric), ("best", self.bold), ("ns", self.not_significant)]
        return " ".join(name for name, on in names if on)


@dataclass(frozen=True)
class Table:
    columns: list[Column]
    rows: list[list[TableCell]]
    group_starts: list[bool] = field(default_factory=list)  # per row: a rule above it (HTML)
    note_before: str = ""  # what the figures are, above the table
    note: str = ""  # below the table


def _columns(*titles: str | tuple[str, str]) -> list[Column]:
    """Columns from titles, or (title, detail) pairs."""
    return [Column(*title) if isinstance(title, tuple) else Column(title) for title in titles]


def _number(text: str, hover: str = "") -> TableCell:
    return TableCell(text, numeric=True, hover=hover)


def _test_cells(difference: str, p_value: str, verdict: str, badge: str, method: str):
    """A comparison's difference, its p-value and verdict (both hover with the test's method)."""
    return [
        _number(difference),
        _number(p_value, method),
        TableCell(verdict, badge=badge, hover=method),
    ]


def _starts(keys: list[object]) -> list[bool]:
    """A new group wherever the key differs from the row above."""
    return [i == 0 or key != keys[i - 1] for i, key in enumerate(keys)]


def headline(data: ReportData) -> Table | None:
    """Main result: per task, the trained biLM's best single layer against its scalar mix, and
    every baseline encoder's best layer and mix beside them."""
    rows = tables.headline(data)
    if not rows:
        return None
    columns = _columns(
        "task",
        ("best single layer", "trained, chosen on dev"),
        "its score",
        ("scalar mix", "trained"),
        "mix − layer",
        "p",
        "verdict",
    )
    for b in rows[0].baselines:
        label = data.display.label(b.encoder, short=True)
        columns += [
            Column(f"{label} encoder", "best layer · mix"),
            Column(f"trained − {label}", "best layers"),
        ]
    no_features = any(r.no_features for r in rows)
    if no_features:
        columns.append(Column("baseline without features", "same test set"))
    cells = [
        [
            TableCell(r.task, bold=True, detail=r.metric),
            TableCell(r.best_layer),
            _number(r.best_value),
            _number(r.mix_value),
            *_test_cells(r.difference, r.p_value, r.verdict, r.verdict_class, r.method),
            *(
                cell
                for b in r.baselines
                for cell in (_number(f"{b.best} · {b.mix}"), _number(b.gain))
            ),
            *([_number(r.no_features)] if no_features else []),
        ]
        for r in rows
    ]
    method = SIGNIFICANCE_METHOD.format(alpha=data.significance.alpha)
    note = f"Test scores in %, mean ± std over seeds. {method}"
    return Table(columns, cells, [False] * len(cells), note=note)


LAYER_METHOD = (
    "Layer 2 minus layer 1 (the two biLSTM layers), test set, in points; mean ± std of the"
    " per-seed differences. p: a paired bootstrap over test sentences when per-sentence counts"
    " exist (accuracy tasks; WSD: correct instances), else a paired t-test over seeds;"
    " two-sided, significant when p < {alpha} (*: significant). Mix: the learned scalar mix's"
    " weights after softmax for layers 0 · 1 · 2 (mean over seeds) and their centre of gravity"
    " Σ j·s_j (Tenney et al. 2019; 0 = the token layer), mean ± std over seeds; WSD 1-NN learns"
    " no mix."
)


def layers(data: ReportData) -> Table | None:
    """The layer panel: per task, grouped by family, what layer 2 adds to layer 1 on the trained
    biLM (with its test), where its scalar mix puts its weight, the baseline encoders' layer 2
    minus layer 1, and the ELMo paper's numbers."""
    rows = tables.layer_panel(data)
    if not rows:
        return None
    main = tables.main_encoder(data)
    baselines = tables.baseline_encoders(data)
    columns = _columns(
        "family",
        "task",
        ("layer 1 · layer 2", data.display.label(main, short=True)),
        ("layer 2 − layer 1", data.display.label(main, short=True)),
        "p",
        "verdict",
        ("mix weights", "layers 0 · 1 · 2"),
        ("centre of gravity", "Σ j·s_j"),
        *(("layer 2 − layer 1", data.display.label(e, short=True)) for e in baselines),
        ("ELMo paper", "layer 1 · layer 2"),
    )
    starts = _starts([r.family for r in rows])
    cells = [
        [
            TableCell(r.family if start else "", bold=True),  # once per family
            TableCell(r.task, detail=r.metric),
            _number(r.layers),
            _number(r.difference),
            _number(r.p_value, r.method),
            TableCell(r.verdict, badge=r.verdict_class, hover=r.method),
            _number(r.weights),
            _number(r.gravity),
            *(_number(v, h) for v, h in zip(r.baselines, r.baseline_hovers, strict=True)),
            _number(r.paper, r.paper_hover),
        ]
        for r, start in zip(rows, starts, strict=True)
    ]
    references = "; ".join(
        f"{task}: {what}, layer 1 {100 * one:.1f}, layer 2 {100 * two:.1f}"
        for task, (what, one, two) in tables.PAPER_LAYERS.items()
    )
    return Table(
        columns,
        cells,
        starts,
        note_before="What each layer encodes: per task, the second biLSTM layer against the"
        " first (the ELMo paper: syntax is better in layer 1, word sense in layer 2).",
        note=f"{LAYER_METHOD.format(alpha=data.significance.alpha)} ELMo paper (Peters et al."
        f" 2018, the original 5.5B-token model): {references}.",
    )


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


def task_model(data: ReportData) -> Table | None:
    """ELMo's second stage: the task model's test F1 per input and what each adds to the
    baseline, as the ELMo paper's Table 1 reports it."""
    summary = data.taskmodel
    if not summary:
        return None
    alpha = data.significance.alpha
    columns = _columns(
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
            _number(f"{row['mean']:.2f}{spread}"),
            _number(str(len(row["seeds"]))),
        ]
        versus = summary["vs_baseline"].get(name)
        if versus is None:
            cells += [_number("–"), _number("–"), _number("–"), TableCell("")]
        else:
            p_value = versus["p_value"]
            relative = versus["relative"]
            if p_value is None:
                verdict = "not testable"
            elif p_value >= alpha:
                verdict = "no significant difference"
            else:
                verdict = "better" if versus["absolute"] > 0 else "worse"
            cells += _test_cells(
                f"{versus['absolute']:+.2f}",
                tables.p_text(p_value) if p_value is not None else "–",
                verdict,
                tables.VERDICT_CLASSES[verdict],
                versus["test"],
            )
            cells.insert(4, _number("–" if relative is None else f"{relative:+.1f}%"))
        rows.append(cells)
    frozen = [
        f"{task_model_label(name, data.display)} against frozen: {v['absolute']:+.2f} F1"
        + ("" if v["p_value"] is None else f", {tables.p_equals(v['p_value'])}")
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


def pretraining(data: ReportData) -> Table:
    rows = tables.pretraining_table(data)
    return Table(
        _columns("", "trained biLM", "random init"),
        [[TableCell(label), _number(trained), _number(random)] for label, trained, random in rows],
        [False] * len(rows),
    )


def trained_vs_token_layer(data: ReportData) -> Table | None:
    return _encoder_table(
        tables.trained_vs_token_layer(data),
        data.display.token_layer,
        data.display,
        "What pretraining the LSTMs added beyond a good token layer: the trained biLM against its"
        " own token layer (char CNN, highway, projection) under random orthogonal LSTMs.",
        ENCODER_METHOD.format(alpha=data.significance.alpha),
    )


def _encoder_table(
    rows: list[tables.EncoderRow],
    baseline: str | None,
    display: Display,
    note_before: str,
    method: str,
) -> Table | None:
    """The trained biLM against a baseline encoder, a row per task and feature mode."""
    if not rows:
        return None
    return Table(
        _columns(
            "task",
            "features",
            display.label(display.main or ""),
            display.label(baseline or ""),
            ("difference", "points"),
            "p",
            "verdict",
        ),
        [
            [
                TableCell(r.task),
                TableCell(r.features),
                _number(r.value),
                _number(r.baseline_value),
                *_test_cells(r.difference, r.p_value, r.verdict, r.verdict_class, r.method),
            ]
            for r in rows
        ],
        _starts([r.task for r in rows]),
        note_before=note_before,
        note=f"Test scores in %, mean ± std over seeds. {method}",
    )


RANDOM_METHOD = (
    "Trained biLM minus the same network never trained (random initialisation), same task,"
    " features and seeds, test set: a paired bootstrap over test sentences when per-sentence"
    " counts exist, else a paired t-test over seeds; two-sided, significant when p < {alpha}."
)


def trained_vs_random(data: ReportData) -> Table | None:
    """Per task and feature mode: the trained biLM against the random-initialisation control."""
    return _encoder_table(
        tables.trained_vs_random(data),
        data.display.random,
        data.display,
        "What pretraining added at all: the trained biLM against the same network with its"
        " initial random weights.",
        RANDOM_METHOD.format(alpha=data.significance.alpha),
    )


def learning_curves(data: ReportData) -> Table | None:
    rows = tables.learning_curve_table(data)
    if not rows:
        return None
    fractions = [tables.fraction_text(x) for x in tables.learning_curve_fractions(data)]
    return Table(
        _columns("task", "features", "encoder", *fractions),
        [
            [
                TableCell(r.task),
                TableCell(r.features),
                TableCell(r.label, italic=True)
                if r.difference
                else TableCell(data.display.label(r.label, short=True)),
                *(_number(value, title) for value, title in zip(r.values, r.titles, strict=True)),
            ]
            for r in rows
        ],
        _starts([(r.task, r.features) for r in rows]),
        note_before="Test score by fraction of the task's training sentences, mean ± std over"
        " seeds. Difference rows: trained biLM minus its token layer under random LSTMs, in"
        f" points; *: significant (p < {data.significance.alpha}, paired test as above).",
    )


def structural(data: ReportData) -> Table | None:
    rows = tables.structural_table(data)
    if not rows:
        return None
    return Table(
        _columns("features", "encoder", "UUAS (%)", "DSpr", ("ELMo UUAS", "paper, PTB")),
        [
            [
                TableCell(r.features),
                TableCell(data.display.label(r.encoder)),
                _number(r.uuas),
                _number(r.dspr),
                _number(r.reference),
            ]
            for r in rows
        ],
        _starts([r.features for r in rows]),
        note=tables.STRUCTURAL_CAPTION,
    )


def selectivity(data: ReportData) -> Table | None:
    rows = tables.selectivity_table(data)
    if not rows:
        return None
    return Table(
        _columns(
            "task",
            "features",
            "encoder",
            "task accuracy",
            "control accuracy",
            "selectivity ± std (n)",
        ),
        [[*map(TableCell, row[:3]), *map(_number, row[3:])] for row in rows],
        [False] * len(rows),
    )


def all_results(data: ReportData) -> Table | None:
    rows = tables.results_table(data)
    if not rows:
        return None
    return Table(
        [
            Column("task"),
            Column("features"),
            *(Column(data.display.label(e)) for e in data.encoders),
        ],
        [
            [
                TableCell(task),
                TableCell(mode),
                *(
                    TableCell(
                        c.text,
                        numeric=True,
                        bold=c.best_layer,
                        not_significant=c.not_significant,
                    )
                    for c in cells
                ),
            ]
            for task, mode, cells in rows
        ],
        _starts([task for task, _, _ in rows]),
        note_before="Bold: the task's best single layer (chosen on dev). ≈: the scalar mix is"
        " not significantly different from it"
        f" (p ≥ {data.significance.alpha}). n/a: the mode does not apply (WSD 1-NN trains no"
        " scalar mix).",
    )


ONLINE_CODE_METHOD = (
    "Online code (Voita and Titov 2020): the training labels sent in blocks that end at {blocks}"
    " of the training sentences, the first block under the uniform code, each later one under a"
    " probe trained on the blocks before it. Compression: uniform code length / online code"
    " length (higher: the features make the labels easier to learn, from less data); mean ± std"
    " over seeds."
)
CONDITIONAL_METHOD = (
    "Information beyond layer 0 (conditional probing, Hewitt et al. 2021): the test"
    " cross-entropy of the probe on layer 0 minus that of the probe on layer 0 beside the mode,"
    " in bits per token (positive: the mode adds information that layer 0 lacks), and the test"
    " metric of the latter minus the former, in points; mean ± std over seeds. *: significant"
    " (p < {alpha}): a paired bootstrap over test sentences (bits: each sentence's summed bits over"
    " its tokens, a ratio of sums; the metric: per-sentence counts) where the runs have them, else"
    " a paired t-test over seeds."
)


def online_code(data: ReportData) -> Table | None:
    rows = tables.online_code_table(data)
    if not rows:
        return None
    encoders = tables.online_code_encoders(data)
    controlled = any(r.control_task for r in rows)
    columns = [Column("task"), Column("features")]
    for encoder in encoders:
        label = data.display.label(encoder, short=True)
        columns += [Column(label, "compression"), Column(label, "online code, kbits")]
        columns += [Column(label, "control task's compression")] if controlled else []
    cells = []
    for r in rows:
        row = [TableCell(r.task), TableCell(r.features)]
        for e in range(len(encoders)):
            row += [_number(r.compression[e], r.hovers[e]), _number(r.kbits[e])]
            control = f"control task {r.control_task}" if r.control_task else ""
            row += [_number(r.control[e], control)] if controlled else []
        cells.append(row)
    blocks = tables.online_code_blocks(data)
    note = f"Uniform code: {tables.uniform_codes(data)}."
    note += f" Probe time of the online codes: {tables.measure_time_text(data, 'online_code')}."
    return Table(
        columns,
        cells,
        _starts([r.task for r in rows]),
        note_before=ONLINE_CODE_METHOD.format(blocks=blocks),
        note=note + " Copies (an encoder with identical features) are not counted.",
    )


def conditional(data: ReportData) -> Table | None:
    rows = tables.conditional_table(data)
    if not rows:
        return None
    encoders = tables.conditional_encoders(data)
    columns = [Column("task"), Column("probe reads")]
    for encoder in encoders:
        label = data.display.label(encoder, short=True)
        columns += [Column(label, "bits/token gained"), Column(label, "metric gained, points")]
    cells = [
        [
            TableCell(r.task, detail=r.metric),
            TableCell(conditional_label(r.mode)),
            *(
                cell
                for e in range(len(encoders))
                for cell in (
                    _number(r.bits[e], r.bits_hovers[e]),
                    _number(r.metric_gains[e], r.metric_hovers[e]),
                )
            ),
        ]
        for r in rows
    ]
    seconds = tables.measure_time_text(data, "conditional")
    return Table(
        columns,
        cells,
        _starts([r.task for r in rows]),
        note_before=CONDITIONAL_METHOD.format(alpha=data.significance.alpha),
        note=f"Dev bits per token gained: in each bits cell's hover text. Probe time of the"
        f" conditional probes: {seconds}.",
    )


@dataclass(frozen=True)
class Sections:
    """The main result's findings and every table of the report (None: a section without results
    yet): what index.html and summary.md both render."""

    findings: list[str]
    headline: Table | None
    layers: Table | None
    layer_findings: list[str]  # a sentence per task family
    task_model: Table | None
    pretraining: Table
    random: Table | None
    token_layer: Table | None
    curves: Table | None
    structural: Table | None
    selectivity: Table | None
    results: Table | None
    online_code: Table | None
    online_code_findings: list[str]  # a sentence per task
    conditional: Table | None
    conditional_findings: list[str]  # a sentence per task

    @classmethod
    def of(cls, data: ReportData) -> Sections:
        return cls(
            findings=tables.findings(data),
            headline=headline(data),
            layers=layers(data),
            layer_findings=tables.family_findings(data),
            task_model=task_model(data),
            pretraining=pretraining(data),
            random=trained_vs_random(data),
            token_layer=trained_vs_token_layer(data),
            curves=learning_curves(data),
            structural=structural(data),
            selectivity=selectivity(data),
            results=all_results(data),
            online_code=online_code(data),
            online_code_findings=tables.online_code_findings(data),
            conditional=conditional(data),
            conditional_findings=tables.conditional_findings(data),
        )
