"""The report on the probe stage's newer outputs: the token_only encoder (the trained token layer
under random LSTMs) beside trained and random, the trained vs token layer comparison, probe
learning curves (fraction_<f>/ runs) and the dependency tasks (deparc, the structural probe)."""

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from fixtures.report.fake_artifacts import (
    DISPLAY,
    EXPECTED,
    SEEDS,
    build_report,
    gather_report,
    report_data,
    task_model_runs,
    write,
    write_pretraining,
    write_probe_runs,
    write_semcor,
)

from elmolab.core.errors import ElmolabError
from elmolab.report import sections, write_report
from elmolab.report.collect import (
    PerSentence,
    ProbeRun,
    collect,
    read_learning_curve_runs,
    read_probe_runs,
)
from elmolab.report.format import fraction_text, mean_std, metric_label
from elmolab.report.layout import Table
from elmolab.taskmodel.runs import summarize

ENCODERS = ("trained", "random", "token_only")
N_SENTENCES = 60
FRACTIONS = (0.01, 0.1)
# Test accuracy per encoder and training fraction of the learning-curve cells (upos, layers 0-1).
CURVE_ACCURACY = {
    "trained": {0.01: 0.80, 0.1: 0.90, 1.0: 0.95},
    "random": {0.01: 0.55, 0.1: 0.65, 1.0: 0.70},
    "token_only": {0.01: 0.70, 0.1: 0.80, 1.0: 0.85},
}
DEPARC_UAS = {"layer0": 0.50, "layer1": 0.80, "layer2": 0.78, "scalar_mix": 0.81}
STRUCTURAL_UUAS = {"layer0": 0.30, "layer1": 0.72, "layer2": 0.66}
STRUCTURAL_DSPR = {"layer0": 0.40, "layer1": 0.80, "layer2": 0.75}


def _totals() -> np.ndarray:
    return np.random.default_rng(3).integers(5, 25, size=N_SENTENCES)  # (sentences,)


def _counts(accuracy: float, seed: int) -> np.ndarray:
    """Correct tokens per test sentence at about ``accuracy``; the same draw for the same
    arguments (identical features give identical predictions)."""
    rng = np.random.default_rng([seed, round(1000 * accuracy)])
    return rng.binomial(_totals(), accuracy)  # (sentences,)


def write_run(
    probes: Path,
    task: str,
    features: str,
    encoder: str,
    seed: int,
    metric: str,
    correct: np.ndarray,
    fraction: float | None = None,
    **extra: object,
) -> Path:
    """One seeded run with per-sentence counts (``fraction``: a learning-curve run)."""
    totals = _totals()
    accuracy = float(correct.sum() / totals.sum())
    folder = probes / task / features / encoder / f"seed{seed}"
    if fraction is not None:
        folder = folder / f"fraction_{fraction}"
    run = {
        "task": task,
        "features": features,
        "encoder": encoder,
        "seed": seed,
        "metric": metric,
        "dev": accuracy + 0.01,
        "test": accuracy,
        "mix_weights": [0.2, 0.5, 0.3] if features == "scalar_mix" else None,
        "gamma": 1.1 if features == "scalar_mix" else None,
        "train_fraction": 1.0 if fraction is None else fraction,
        "n_train_sentences": round(2000 * (1.0 if fraction is None else fraction)),
        "per_sentence_test": {"correct": correct.tolist(), "total": totals.tolist()},
        **extra,
    }
    path = folder / "metrics.json"
    write(path, run)
    return path


def _score(
    encoder: str, features: str, trained: float, token_gap: float, random_gap: float
) -> float:
    """The trained biLM's score less the encoder's gap; token_only's layer 0 is the trained
    biLM's token layer, the same score by construction."""
    if encoder == "random":
        return trained - random_gap
    if encoder == "token_only" and features != "layer0":
        return trained - token_gap
    return trained


def _curve_accuracy(encoder: str, features: str, fraction: float) -> float:
    """upos test accuracy of the learning-curve cells (layer0 and layer1)."""
    if features == "layer0" and encoder == "token_only":
        encoder = "trained"
    return CURVE_ACCURACY[encoder][fraction]


def write_dependency_tasks(probes: Path) -> None:
    """deparc (UAS; no mean, no concat) and the structural probe (UUAS and DSpr; single layers
    only, no scalar mix): the trained biLM well above its token layer on layers 1-2."""
    for encoder in ENCODERS:
        for seed in SEEDS:
            for features, uas in DEPARC_UAS.items():
                correct = _counts(_score(encoder, features, uas, 0.12, 0.2), seed)
                write_run(probes, "deparc", features, encoder, seed, "uas", correct)
            for features, uuas in STRUCTURAL_UUAS.items():
                accuracy = _score(encoder, features, uuas, 0.2, 0.25)
                dspr = _score(encoder, features, STRUCTURAL_DSPR[features], 0.2, 0.3)
                write_run(
                    probes,
                    "structural",
                    features,
                    encoder,
                    seed,
                    "uuas",
                    _counts(accuracy, seed),
                    dev_dspr=dspr + 0.01,
                    test_dspr=dspr + 0.001 * seed,
                )


def write_learning_curves(probes: Path) -> None:
    """upos layer0 and layer1 on 1% and 10% of the training sentences, every encoder; the runs on
    all the data are rewritten to match CURVE_ACCURACY."""
    for encoder in ENCODERS:
        for features in ("layer0", "layer1"):
            for seed in SEEDS:
                for fraction in (*FRACTIONS, None):
                    correct = _counts(_curve_accuracy(encoder, features, fraction or 1.0), seed)
                    write_run(
                        probes, "upos", features, encoder, seed, "accuracy", correct, fraction
                    )


def write_complete_artifacts(root: Path) -> Path:
    """Every input the report reads now, polysemy model aside."""
    artifacts = root / "artifacts"
    write_pretraining(artifacts)
    write_probe_runs(artifacts / "probes", encoders=ENCODERS)
    write_dependency_tasks(artifacts / "probes")
    write_learning_curves(artifacts / "probes")
    write_semcor(root / "data" / "probing" / "wsd" / "semcor30" / "semcor30.tsv.gz")
    return artifacts


@pytest.fixture(scope="module")
def complete_report(tmp_path_factory) -> tuple[dict, Path]:
    root = tmp_path_factory.mktemp("complete")
    write_complete_artifacts(root)
    return build_report(root, polysemy=False)


def _run(encoder: str, features: str, seed: int, correct: np.ndarray) -> ProbeRun:
    totals = _totals()
    accuracy = float(correct.sum() / totals.sum())
    return ProbeRun(
        Path("m.json"),
        "upos",
        features,
        encoder,
        seed,
        metric="accuracy",
        dev=accuracy,
        test=accuracy,
        per_sentence_test=PerSentence(correct, totals),
    )


# --- collect ---------------------------------------------------------------------------------


def test_a_complete_tree_lists_nothing_missing(tmp_path):
    artifacts = write_complete_artifacts(tmp_path)
    probes = artifacts / "probes"
    inputs = collect(
        artifacts / "bilm", artifacts / "bilm_random", probes, display=DISPLAY, expected=EXPECTED
    )
    assert inputs.missing == []
    assert {r.encoder for r in inputs.probes} == set(ENCODERS)
    assert all(r.train_fraction == 1.0 for r in inputs.probes)  # fraction runs are not runs
    assert len(inputs.curves) == len(ENCODERS) * 2 * len(SEEDS) * len(FRACTIONS)
    assert {r.train_fraction for r in inputs.curves} == set(FRACTIONS)
    assert {r.n_train_sentences for r in inputs.curves} == {20, 200}
    structural = [r for r in inputs.probes if r.task == "structural"]
    assert all(set(r.extra) == {"dev_dspr", "test_dspr"} for r in structural)


def test_the_run_glob_ignores_learning_curve_runs(tmp_path):
    write_learning_curves(tmp_path)
    runs = read_probe_runs(tmp_path)
    assert len(runs) == len(ENCODERS) * 2 * len(SEEDS)
    assert all("fraction_" not in str(r.path) for r in runs)


def test_a_learning_curve_run_whose_fraction_disagrees_with_its_folder_is_an_error(tmp_path):
    path = write_run(tmp_path, "upos", "layer1", "trained", 1, "accuracy", _counts(0.9, 1), 0.1)
    data = json.loads(path.read_text())
    write(path, {**data, "train_fraction": 0.01})
    message = "train_fraction 0.01 disagrees with the file's path (fraction_0.1)"
    with pytest.raises(ElmolabError, match=re.escape(f"{path}: {message}")):
        read_learning_curve_runs(tmp_path)


@pytest.mark.parametrize(
    ("folder", "edit", "message"),
    [
        ("fraction_0.1", lambda d: d.pop("train_fraction"), "missing key 'train_fraction'"),
        ("fraction_big", lambda d: None, "'fraction_big' should be fraction_<f> with 0 < f < 1"),
        ("fraction_1.0", lambda d: d.update(train_fraction=1.0), "should be fraction_<f>"),
        ("fraction_0.1", lambda d: d.update(n_train_sentences=2.5), "'n_train_sentences' should"),
        ("fraction_0.1", lambda d: d.update(test_dspr="high"), "'test_dspr' should be a number"),
    ],
)
def test_bad_learning_curve_runs_are_errors_naming_the_file(tmp_path, folder, edit, message):
    path = write_run(tmp_path, "upos", "layer1", "trained", 1, "accuracy", _counts(0.9, 1), 0.1)
    data = json.loads(path.read_text())
    edit(data)
    bad = path.parent.parent / folder / "metrics.json"
    path.unlink()
    write(bad, data)
    with pytest.raises(ElmolabError, match=re.escape(str(bad)) + ".*" + re.escape(message)):
        read_learning_curve_runs(tmp_path)


def test_a_run_on_all_the_data_must_have_fraction_one(tmp_path):
    path = write_run(tmp_path, "upos", "layer1", "trained", 1, "accuracy", _counts(0.9, 1))
    write(path, {**json.loads(path.read_text()), "train_fraction": 0.1})
    with pytest.raises(ElmolabError, match=re.escape(f"{path}: train_fraction 0.1 outside")):
        read_probe_runs(tmp_path)


def test_older_runs_without_fraction_count_as_all_thereport_data(tmp_path):
    path = write_run(tmp_path, "upos", "layer1", "trained", 1, "accuracy", _counts(0.9, 1))
    data = json.loads(path.read_text())
    del data["train_fraction"], data["n_train_sentences"]
    write(path, data)
    (run,) = read_probe_runs(tmp_path)
    assert run.train_fraction == 1.0 and run.n_train_sentences is None and run.extra == {}


# --- trained vs token layer --------------------------------------------------------------------


def test_trained_vs_token_layer_is_significant_only_where_the_counts_differ():
    totals = _totals()
    base = (0.6 * totals).astype(int)  # (sentences,)
    wobble = np.where(np.arange(N_SENTENCES) % 2 == 0, 1, -1)  # +1, -1, ...: sums to 0
    runs = []
    for seed in SEEDS:
        runs += [
            _run("trained", "layer0", seed, base),  # the same features: identical counts
            _run("token_only", "layer0", seed, base),
            _run("trained", "layer1", seed, np.minimum(base + 4, totals)),  # clearly better
            _run("token_only", "layer1", seed, base),
            _run("trained", "layer2", seed, base + wobble),  # a wash
            _run("token_only", "layer2", seed, base),
            _run("random", "layer1", seed, base // 2),
        ]
    data = report_data(runs)
    by_mode = {c.features: c for c in data.token_comparisons}
    assert list(by_mode) == ["layer0", "layer1", "layer2"]
    assert by_mode["layer0"].difference == 0 and by_mode["layer0"].p_value == 1.0
    assert by_mode["layer1"].p_value < 1e-6  # every seed and sentence agree
    assert by_mode["layer2"].p_value > 0.5
    assert f"of the {N_SENTENCES} test sentences" in by_mode["layer1"].method
    assert "Holm over the 3 tests of trained - token_only" in by_mode["layer1"].method
    rows = {r.features: r for r in sections.encoders.token_layer_rows(data)}
    assert (rows["layer1"].verdict, rows["layer1"].verdict_class) == ("trained better", "good")
    assert rows["layer1"].p_value == "< 0.001"
    expected = (np.minimum(base + 4, totals).sum() - base.sum()) / totals.sum()
    assert rows["layer1"].difference.startswith(f"{100 * expected:+.2f} [")
    assert rows["layer1"].value == mean_std(data.cells["upos", "layer1", "trained"])
    assert (rows["layer2"].verdict, rows["layer2"].verdict_class) == (
        "no significant difference",
        "neutral",
    )
    assert (rows["layer0"].verdict, rows["layer0"].difference) == (
        "no significant difference",
        "+0.00 [+0.00, +0.00]",
    )
    (line,) = sections.encoders.token_finding(data)
    assert line == (
        "Trained biLM vs its token layer with random LSTMs (Holm-adjusted p < 0.05): significantly"
        " better on "
        "upos (layer1); not significant on upos (layer0, layer2)."
    )


def test_without_sentence_counts_the_encoders_are_not_tested():
    """Results written before runs stored per-sentence sums: the means are compared, untested
    (no test without the sentences' level)."""
    runs = [
        ProbeRun(Path("m.json"), "ner", "layer1", encoder, seed, metric="span_f1", dev=t, test=t)
        for encoder, scores in (("trained", (0.80, 0.82, 0.81)), ("token_only", (0.70, 0.73, 0.7)))
        for seed, t in zip(SEEDS, scores, strict=True)
    ]
    (comparison,) = report_data(runs).token_comparisons
    assert comparison.method == "not testable: runs without per-sentence counts"
    assert comparison.verdict(0.05) == "not testable"
    assert comparison.difference == pytest.approx(0.81 - 0.71)


# --- learning curves ---------------------------------------------------------------------------


def test_learning_curve_table_has_each_size_and_the_marked_difference(tmp_path):
    probes = tmp_path / "probes"
    write_learning_curves(probes)
    data = report_data(read_probe_runs(probes), read_learning_curve_runs(probes))
    assert sections.learning_curves.learning_curve_fractions(data) == [0.01, 0.1, 1.0]
    assert [fraction_text(x) for x in (0.01, 0.1, 1.0)] == ["1%", "10%", "100%"]
    rows = sections.learning_curves.curve_rows(data)
    assert [(r.features, r.label) for r in rows] == [
        (features, label)
        for features in ("layer0", "layer1")
        for label in (*ENCODERS, "trained − token layer")
    ]
    totals = _totals().sum()

    def accuracies(encoder: str, features: str, fraction: float) -> np.ndarray:
        accuracy = _curve_accuracy(encoder, features, fraction)
        return np.array([_counts(accuracy, s).sum() / totals for s in SEEDS])

    for row in rows[:3] + rows[4:7]:
        for fraction, text in zip((0.01, 0.1, 1.0), row.values, strict=True):
            values = accuracies(row.label, row.features, fraction)
            assert text == f"{100 * values.mean():.2f} ± {100 * values.std(ddof=1):.2f}"
    layer0, layer1 = rows[3], rows[7]
    # the same token layer: no difference, and no star (the encoders are unpaired: their seeds'
    # spread is in the interval)
    assert all(v.startswith("+0.00 [") and not v.endswith("*") for v in layer0.values)
    assert "two-level bootstrap" in layer0.titles[0]
    for fraction, text, title in zip((0.01, 0.1, 1.0), layer1.values, layer1.titles, strict=True):
        gain = accuracies("trained", "layer1", fraction) - accuracies(
            "token_only", "layer1", fraction
        )
        assert text.startswith(f"{100 * gain.mean():+.2f} [")
        assert "of the 60 test sentences" in title
        # 2 fractions x 2 modes below 100%; at 100% the encoders' table's 2 modes
        family = "4 tests of trained - token_only (learning curves)"
        assert ("2 tests of trained - token_only" if fraction == 1 else family) in title


def test_learning_curves_need_no_full_run_and_no_token_layer(tmp_path):
    probes = tmp_path / "probes"
    for seed in SEEDS:
        write_run(probes, "chunk", "layer2", "trained", seed, "span_f1", _counts(0.5, seed), 0.1)
    data = report_data(read_probe_runs(probes), read_learning_curve_runs(probes))
    (row,) = sections.learning_curves.curve_rows(data)
    assert (row.label, len(row.values), data.curve_comparisons) == ("trained", 1, [])


# --- the structural probe ----------------------------------------------------------------------


def test_structural_table_has_uuas_and_dspr_per_mode_and_encoder(tmp_path):
    write_dependency_tasks(tmp_path)
    data = report_data(read_probe_runs(tmp_path))
    rows = sections.structural.structural_rows(data)
    assert [(r.features, r.encoder) for r in rows] == [
        (mode, encoder) for mode in STRUCTURAL_UUAS for encoder in ENCODERS
    ]
    layer1 = rows[3]
    dspr = np.array([STRUCTURAL_DSPR["layer1"] + 0.001 * s for s in SEEDS])
    assert layer1.dspr == f"{dspr.mean():.3f} ± {dspr.std(ddof=1):.3f}"
    assert layer1.uuas == mean_std(data.cells["structural", "layer1", "trained"])
    assert [r.reference for r in rows] == ["26.80", "", "", "77.00", "", "", "", "", ""]
    assert metric_label("uuas").startswith("UUAS")
    assert metric_label("uas").startswith("UAS")


# --- the report --------------------------------------------------------------------------------


def test_the_report_shows_three_encoders_and_the_new_sections(complete_report):
    _, out = complete_report
    page = (out / "index.html").read_text(encoding="utf-8")
    for anchor in ("trained-vs-token-layer", "learning-curves", "structural-probe"):
        assert f'id="{anchor}"' in page and f'href="#{anchor}"' in page
    assert page.count('src="data:image/png;base64,') == 7  # the layer panel's included
    assert 'alt="probe learning curves"' in page
    assert (out / "figures" / "probe_learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    main_result = page[page.index('id="main-result"') : page.index('id="pretraining"')]
    line = "Trained biLM vs its token layer with random LSTMs (Holm-adjusted p &lt; 0.05)"
    assert line in main_result
    assert "significantly better on" in main_result and "deparc (layer1" in main_result
    assert "xpos (all modes)" in main_result  # the fixture's token_only is far below trained
    assert "token layer encoder<br>" in main_result and "trained − token layer" in main_result
    assert "random encoder<br>" in main_result
    assert "<th>trained token layer + random LSTMs</th>" in page  # all results
    assert "Published ELMo reference (Hewitt and Manning 2019, PTB): layer 0 26.8 UUAS" in page
    assert "UUAS (undirected attachment)" in page
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    assert "## Trained biLM vs trained token layer" in markdown
    assert "| task | features | encoder | 1% | 10% | 100% |" in markdown
    assert "## Structural probe (Hewitt and Manning 2019)" in markdown


def test_summary_json_has_the_new_numbers(complete_report):
    summary, out = complete_report
    assert json.loads((out / "summary.json").read_text()) == summary
    token = {(c["task"], c["features"]): c for c in summary["trained_vs_token_only"]["comparisons"]}
    deparc1 = token["deparc", "layer1"]
    assert (deparc1["encoder"], deparc1["baseline"]) == ("trained", "token_only")
    assert deparc1["significant"] is True and deparc1["verdict"] == "better"
    assert deparc1["difference"] == pytest.approx(
        deparc1["encoder_mean"] - deparc1["baseline_mean"]
    )
    assert deparc1["encoder_mean"] == pytest.approx(
        summary["probes"]["deparc"]["layer1"]["trained"]["mean"]
    )
    assert token["deparc", "layer0"]["p_value"] == 1.0
    assert deparc1["low"] < deparc1["difference"] < deparc1["high"]
    assert deparc1["p_unadjusted"] <= deparc1["p_value"]
    assert deparc1["family"] == "trained - token_only" and deparc1["family_tests"] == len(token)
    assert ("upos_control", "layer1") not in token and ("wsd", "layer1") in token
    points = summary["learning_curves"]["points"]
    assert {(p["features"], p["train_fraction"]) for p in points} == {
        (f, x) for f in ("layer0", "layer1") for x in (0.01, 0.1, 1.0)
    }
    point = next(p for p in points if p["encoder"] == "trained" and p["train_fraction"] == 0.1)
    assert point["n_train_sentences"] == 200 and point["seeds"] == list(SEEDS)
    assert point["mean"] == pytest.approx(np.mean(point["test"]))
    curve = summary["learning_curves"]["trained_vs_token_only"]
    assert {(c["features"], c["train_fraction"]) for c in curve} == {
        (f, x) for f in ("layer0", "layer1") for x in (0.01, 0.1)
    }  # at 100%: trained_vs_token_only's comparisons
    assert {c["family"] for c in curve} == {"trained - token_only (learning curves)"}
    structural = summary["structural_probe"]
    assert structural["reference_uuas"] == {"layer0": 0.268, "layer1": 0.770}
    row = next(
        r for r in structural["rows"] if (r["features"], r["encoder"]) == ("layer1", "trained")
    )
    assert row["dspr"] == pytest.approx([0.801, 0.802, 0.803])
    assert row["dspr_mean"] == pytest.approx(0.802) and row["dspr_std"] == pytest.approx(0.001)
    assert summary["probes"]["structural"]["layer1"]["trained"]["extra"]["test_dspr"] == row["dspr"]


def test_html_and_markdown_render_every_table_of_one_model(tmp_path):
    """index.html and summary.md come from the same Table objects: every header and every cell
    of every section shows in both (Markdown as its pipe rows, HTML as its cells)."""
    write_complete_artifacts(tmp_path)
    # the task model stage's summary of two inputs, two seeds
    results = task_model_runs({"baseline": [81.0, 82.0], "elmo_trained": [82.0, 83.0]})
    summary = summarize(results, {"baseline": ["baseline"], "elmo_trained": ["elmo_trained"]}, 20)
    write(tmp_path / "artifacts" / "taskmodel" / "metrics.json", summary)
    data, config = gather_report(tmp_path, polysemy=False)
    out = tmp_path / "artifacts" / "report"
    write_report(data, config, out)
    page = html.unescape((out / "index.html").read_text(encoding="utf-8"))
    markdown = (out / "summary.md").read_text(encoding="utf-8").splitlines()
    built = sections.Sections.of(data)
    present = [t for t in vars(built).values() if isinstance(t, Table)]
    assert len(present) == 11  # every section of the complete fixture has its table
    for table in present:
        header = "| " + " | ".join(
            c.title + (f" ({c.detail})" if c.detail else "") for c in table.columns
        )
        assert any(line.startswith(header) for line in markdown), header
        for row in table.rows:
            texts = [c.text.replace("|", "\\|") for c in row]
            assert any(all(t in line for t in texts) for line in markdown if line.startswith("|"))
            assert all(c.text in page for c in row)
        if table.note:
            assert table.note in page and table.note in markdown
