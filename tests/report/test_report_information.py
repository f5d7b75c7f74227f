"""The report's information sections on hand-made probe folders: the online code (Voita and Titov
2020; ``online_code.json``) and the information beyond layer 0 (conditional probing, Hewitt et
al. 2021; runs on ``layer0+<mode>`` beside the layer-0 runs, with bits per token)."""

import html
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import expect_error
from fixtures.report.fake_artifacts import (
    DISPLAY,
    EXPECTED,
    build_report,
    gather_report,
    write,
    write_pretraining,
)

from elmolab.core.errors import ElmolabError
from elmolab.report import sections
from elmolab.report.collect import collect, read_online_codes, read_probe_runs
from elmolab.report.format import p_equals
from elmolab.report.stats import Bootstrap

ENCODERS = ("trained", "random", "token_only")
SEEDS = (1, 2, 3)
N_SENTENCES = 40
SAMPLES = 500  # bootstrap resamples (report.significance.bootstrap_samples)
MODES = ("layer0", "layer1", "layer2", "scalar_mix")
CONDITIONAL = ("layer1", "layer2", "scalar_mix")
# upos test bits per token of the probe on layer 0 and on layer 0 beside each mode (seed 0).
BITS = {
    "trained": {"layer0": 1.5, "layer1": 1.0, "layer2": 1.5, "scalar_mix": 0.9},
    "random": {"layer0": 2.0, "layer1": 1.9, "layer2": 1.95, "scalar_mix": 1.85},
    "token_only": {"layer0": 1.5, "layer1": 1.3, "layer2": 1.4, "scalar_mix": 1.25},
}
# upos test accuracy, the same keys (the other modes' own runs: 0.05 less).
ACCURACY = {
    "trained": {"layer0": 0.80, "layer1": 0.95, "layer2": 0.80, "scalar_mix": 0.96},
    "random": {"layer0": 0.60, "layer1": 0.62, "layer2": 0.61, "scalar_mix": 0.63},
    "token_only": {"layer0": 0.80, "layer1": 0.85, "layer2": 0.84, "scalar_mix": 0.86},
}
# Online-code compression per task, feature mode and encoder (seed 0; seed k adds 0.02 k).
COMPRESSION = {
    "upos": {
        "trained": {"layer0": 2.0, "layer1": 3.5, "layer2": 3.0},
        "random": {"layer0": 1.5, "layer1": 1.6, "layer2": 1.55},
        "token_only": {"layer0": 2.0, "layer1": 2.4, "layer2": 2.3},
    },
    "upos_control": {
        "trained": {"layer0": 1.3, "layer1": 1.2, "layer2": 1.1},
        "random": {"layer0": 1.2, "layer1": 1.1, "layer2": 1.0},
        "token_only": {"layer0": 1.3, "layer1": 1.2, "layer2": 1.2},
    },
}
LABELS = 17
FRACTIONS = [0.1, 0.5, 1.0]
BLOCK_TOKENS = [100, 400, 500]
WOBBLE = np.where(np.arange(N_SENTENCES) % 2 == 0, 0.3, -0.3)  # (sentences,) sums to 0


def _totals() -> np.ndarray:
    return np.random.default_rng(3).integers(5, 25, size=N_SENTENCES)  # (sentences,)


def _features(mode: str, conditional: bool) -> str:
    return f"layer0+{mode}" if conditional else mode


def _bits(encoder: str, mode: str, seed: int, conditional: bool) -> np.ndarray:
    """Summed bits per test sentence: a rate per token (layer 0 and the zero-information
    layer0+layer2 of the trained biLM rise by 0.01 a seed, the others by 0.02), the latter with
    a wobble that sums to 0."""
    rate = BITS[encoder]["layer0" if not conditional else mode]
    same_slope = not conditional or (encoder, mode) == ("trained", "layer2")
    rate += (0.01 if same_slope else 0.02) * seed
    bits = rate * _totals()
    if conditional and (encoder, mode) == ("trained", "layer2"):
        bits = bits + WOBBLE
    return bits


def write_information_run(
    probes: Path, task: str, features: str, encoder: str, seed: int, **fields: object
) -> Path:
    run = {
        "task": task,
        "features": features,
        "encoder": encoder,
        "seed": seed,
        "train_fraction": 1.0,
        "best_epoch": 3,
        "epochs": 5,
        "hit_epoch_cap": False,
        "mix_weights": [0.2, 0.5, 0.3] if features.endswith("scalar_mix") else None,
        "gamma": 1.0 if features.endswith("scalar_mix") else None,
        "wall_seconds": 2.0 + seed + (10.0 if "+" in features else 0.0),
        **fields,
    }
    path = probes / task / features / encoder / f"seed{seed}" / "metrics.json"
    write(path, run)
    return path


def write_upos(probes: Path) -> None:
    """upos: every encoder's single layers and scalar mix, and layer 0 beside layer 1, layer 2 and
    the scalar mix, with counts and bits per test sentence; token_only's layer 0 is a copy of
    trained's."""
    totals = _totals()
    runs = [(mode, False) for mode in MODES] + [(mode, True) for mode in CONDITIONAL]
    for encoder in ENCODERS:
        for seed in SEEDS:
            for mode, conditional in runs:
                accuracy = ACCURACY[encoder][mode]
                if not conditional and mode != "layer0":
                    accuracy -= 0.05
                correct = np.floor(accuracy * totals).astype(int)
                bits = _bits(encoder, mode, seed, conditional)
                copy = encoder == "token_only" and mode == "layer0"
                test = float(correct.sum() / totals.sum())
                write_information_run(
                    probes,
                    "upos",
                    _features(mode, conditional),
                    encoder,
                    seed,
                    metric="accuracy",
                    dev=test + 0.01,
                    test=test,
                    per_sentence_test={"correct": correct.tolist(), "total": totals.tolist()},
                    dev_bits=float(bits.sum() / totals.sum()) + 0.05,
                    test_bits=float(bits.sum() / totals.sum()),
                    per_sentence_test_bits=bits.tolist(),
                    **({"same_features_as": "trained"} if copy else {}),
                )


NER = {  # seed: (layer0 test, layer0 test_bits, layer0+layer1 test, layer0+layer1 test_bits)
    1: (0.40, 0.90, 0.55, 0.60),
    2: (0.42, 0.88, 0.56, 0.62),
    3: (0.41, 0.91, 0.58, 0.57),
}


def write_ner(probes: Path) -> None:
    """ner (span F1, no per-sentence counts): the trained biLM's layer 0 and layer 0 beside layer
    1, bits per token without per-sentence sums to pair them."""
    for seed, (test0, bits0, test1, bits1) in NER.items():
        for features, test, bits in (("layer0", test0, bits0), ("layer0+layer1", test1, bits1)):
            write_information_run(
                probes,
                "ner",
                features,
                "trained",
                seed,
                metric="span_f1",
                dev=test,
                test=test,
                per_sentence_test=None,
                dev_bits=bits + 0.1,
                test_bits=bits,
            )


def write_online_code(probes: Path, task: str, features: str, encoder: str, seed: int) -> Path:
    source = "trained" if (encoder, features) == ("token_only", "layer0") else encoder
    compression = COMPRESSION[task][source][features] + 0.02 * seed
    uniform = sum(BLOCK_TOKENS) * math.log2(LABELS)
    online = uniform / compression
    first = BLOCK_TOKENS[0] * math.log2(LABELS)
    code = {
        "task": task,
        "features": features,
        "encoder": encoder,
        "seed": seed,
        "labels": LABELS,
        "fractions": FRACTIONS,
        "block_tokens": BLOCK_TOKENS,
        "block_bits": [first, 0.6 * (online - first), 0.4 * (online - first)],
        "uniform_bits": uniform,
        "online_bits": online,
        "compression": compression,
        "wall_seconds": 20.0 + seed,
    }
    if source != encoder:
        code["same_features_as"] = source
    path = probes / task / features / encoder / f"seed{seed}" / "online_code.json"
    write(path, code)
    return path


def write_online_codes(probes: Path) -> None:
    for task, encoders in COMPRESSION.items():
        for encoder in ENCODERS:
            for features in encoders[encoder]:
                for seed in SEEDS:
                    write_online_code(probes, task, features, encoder, seed)


def write_information_artifacts(root: Path) -> Path:
    artifacts = root / "artifacts"
    write_pretraining(artifacts)
    write_upos(artifacts / "probes")
    write_ner(artifacts / "probes")
    write_online_codes(artifacts / "probes")
    return artifacts


def _build(root: Path):
    """(ReportData, summary.json, report folder) of the report on ``root/artifacts``."""
    overrides = {"significance.bootstrap_samples": SAMPLES}
    data, _ = gather_report(root, polysemy=False, **overrides)
    summary, out = build_report(root, polysemy=False, **overrides)
    return data, summary, out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("information")
    write_information_artifacts(root)
    return _build(root)


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _mean_std(values: list[float], digits: int, signed: bool = False) -> str:
    mean = f"{np.mean(values):{'+z' if signed else 'z'}.{digits}f}"  # z: -0.000 as 0.000
    return f"{mean} ± {np.std(values, ddof=1):.{digits}f}"


# --- collect ---------------------------------------------------------------------------------


def test_conditional_runs_and_online_codes_are_read_apart_from_the_layer_runs(tmp_path):
    artifacts = write_information_artifacts(tmp_path)
    inputs = collect(
        artifacts / "bilm",
        artifacts / "bilm_random",
        artifacts / "probes",
        display=DISPLAY,
        expected=EXPECTED,
    )
    assert {r.features for r in inputs.probes} == set(MODES)
    assert {r.features for r in inputs.conditional} == {f"layer0+{m}" for m in CONDITIONAL}
    assert len(inputs.conditional) == len(ENCODERS) * len(CONDITIONAL) * len(SEEDS) + len(NER)
    assert len(inputs.online_codes) == 2 * len(ENCODERS) * 3 * len(SEEDS)
    key = ("upos", "layer0", "trained", 2)
    run = next(r for r in inputs.probes if (r.task, r.features, r.encoder, r.seed) == key)
    assert run.extra["test_bits"] == pytest.approx(1.52)  # dev_bits, test_bits land in extra
    assert run.per_sentence_test_bits == pytest.approx(1.52 * _totals())
    assert run.wall_seconds == 4.0
    ner = next(r for r in inputs.conditional if r.task == "ner")
    assert ner.per_sentence_test_bits is None and ner.per_sentence_test is None
    copy = next(
        c for c in inputs.online_codes if (c.encoder, c.features) == ("token_only", "layer0")
    )
    assert copy.same_features_as == "trained" and copy.block_tokens == tuple(BLOCK_TOKENS)


def test_a_conditional_run_without_its_layer0_run_is_listed_as_missing(tmp_path):
    write_ner(tmp_path)
    (tmp_path / "ner" / "layer0" / "trained" / "seed3" / "metrics.json").unlink()
    inputs = collect(tmp_path / "b", tmp_path / "r", tmp_path, display=DISPLAY, expected=EXPECTED)
    assert (
        "conditional probes without the layer0 run of their seed (not shown): "
        "ner/layer0+layer1/trained/seed3"
    ) in inputs.missing


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d.pop("compression"), "missing key 'compression'"),
        (lambda d: d.update(labels="17"), "'labels' should be int, got str"),
        (lambda d: d.update(seed=2), "disagree with the file's path"),
        (lambda d: d.update(features="layer2"), "disagree with the file's path"),
        (lambda d: d["block_bits"].pop(), "one entry per block, got 3, 3 and 2"),
        (lambda d: d.update(block_tokens=[100, 400.5, 500]), "'block_tokens' should be a list"),
        (lambda d: d.update(fractions=[0.1, "half", 1.0]), "'fractions' should be a number"),
        (lambda d: d.update(same_features_as=3), "'same_features_as' should be str"),
        (lambda d: d.update(wall_seconds=True), "'wall_seconds' should be a number"),
    ],
)
def test_a_bad_online_code_is_an_error_naming_the_file(tmp_path, edit, problem):
    path = write_online_code(tmp_path, "upos", "layer1", "trained", 1)
    data = _read(path)
    edit(data)
    write(path, data)
    expect_error(lambda: read_online_codes(tmp_path), path, None, problem)


def test_an_online_code_that_is_no_object_fails_the_stage_before_writing(tmp_path):
    write_information_artifacts(tmp_path)
    bad = tmp_path / "artifacts" / "probes" / "upos" / "layer2" / "random" / "seed3"
    (bad / "online_code.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ElmolabError, match=r"online_code\.json: expected a JSON object"):
        build_report(tmp_path, polysemy=False)
    assert not (tmp_path / "artifacts" / "report").exists()


@pytest.mark.parametrize(
    ("bits", "problem"),
    [
        ([1.0] * (N_SENTENCES - 1), f"{N_SENTENCES - 1} sentences but per_sentence_test has 40"),
        ([1.0, "x"] * (N_SENTENCES // 2), "'per_sentence_test_bits' should be a number"),
        ({"bits": 1.0}, "'per_sentence_test_bits' should be list"),
    ],
)
def test_bad_per_sentence_bits_are_an_error_naming_the_file(tmp_path, bits, problem):
    write_upos(tmp_path)
    path = tmp_path / "upos" / "layer0+layer1" / "random" / "seed2" / "metrics.json"
    write(path, {**_read(path), "per_sentence_test_bits": bits})
    expect_error(lambda: read_probe_runs(tmp_path), path, None, problem)


# --- the online code ---------------------------------------------------------------------------


def test_online_code_table_has_each_encoders_compression_length_and_control(report):
    data, _, _ = report
    probes = Path(data.inputs.online_codes[0].path).parents[4]
    rows = sections.online_code.online_code_rows(data)
    assert [(r.task, r.features, r.control_task) for r in rows] == [
        ("upos", mode, "upos_control") for mode in ("layer0", "layer1", "layer2")
    ]
    assert sections.online_code.online_code_encoders(data) == list(ENCODERS)
    for row in rows:
        for e, encoder in enumerate(ENCODERS):
            files = [
                _read(probes / task / row.features / encoder / f"seed{s}" / "online_code.json")
                for task in ("upos", "upos_control")
                for s in SEEDS
            ]
            upos, control = files[:3], files[3:]
            assert row.compression[e] == _mean_std([f["compression"] for f in upos], 2)
            assert row.kbits[e] == _mean_std([f["online_bits"] / 1000 for f in upos], 1)
            assert row.control[e] == _mean_std([f["compression"] for f in control], 2)
    layer1 = rows[1]
    assert layer1.compression[0] == "3.54 ± 0.02"  # 3.5 + 0.02 k, k = 1, 2, 3
    assert layer1.kbits[0] == f"{1000 * math.log2(17) / 1000 / 3.54:.1f} ± 0.0"
    assert layer1.control[0] == "1.24 ± 0.02"
    assert rows[0].hovers[2] == (
        "seeds 1, 2, 3: 2.02, 2.04, 2.06; copied from trained (identical features)"
    )
    assert sections.online_code.uniform_codes(data) == (
        f"upos {1000 * math.log2(17) / 1000:.1f} kbits (17 labels, 1,000 tokens); "
        f"upos_control {1000 * math.log2(17) / 1000:.1f} kbits (17 labels, 1,000 tokens)"
    )
    assert sections.online_code.online_code_blocks(data) == "10%, 50%, 100%"


def test_online_code_finding_is_computed_from_the_numbers(report):
    data, _, _ = report
    (line,) = sections.online_code.findings(data)
    assert line == (
        "upos: with the trained biLM, layer1 compresses the labels best (3.54 ± 0.02); on layer1, "
        "random init reaches 1.64 and trained token layer + random LSTMs reaches 2.44, so the "
        f"trained encoder compresses {3.54 / 1.64:.2f} and {3.54 / 2.44:.2f} times as well; its "
        "control task upos_control reaches 1.24 there, lower than the task."
    )


def test_probe_time_counts_every_fit_but_copies(report):
    data, summary, _ = report
    table = sections.online_code.table(data)
    # 2 tasks x 3 modes x 3 encoders x seeds 20 + k, less token_only's copied layer 0
    online = 3 * 3 * sum(20 + s for s in SEEDS) - sum(20 + s for s in SEEDS)
    assert (
        f"Probe time of the online codes: upos {online} s, upos_control {online} s." in table.note
    )
    conditional = 3 * 3 * sum(12 + s for s in SEEDS)  # layer0+<mode> runs: 2 + k + 10 s
    assert f"conditional probes: upos {conditional} s, ner {sum(12 + s for s in SEEDS)} s." in (
        sections.conditional.table(data).note
    )
    times = {t["task"]: t for t in summary["information_time"]}
    assert times["upos"] == {
        "task": "upos",
        "online_code_seconds": online,
        "conditional_seconds": conditional,
    }
    assert times["upos_control"]["conditional_seconds"] is None


# --- information beyond layer 0 ----------------------------------------------------------------


def test_conditional_table_is_layer0_minus_conditional_bits_and_the_metric_gain(report):
    data, _, out = report
    probes = out.parent / "probes" / "upos"
    gains = {(g.mode, g.encoder): g for g in data.gains if g.task == "upos"}
    rows = [r for r in sections.conditional.conditional_rows(data) if r.task == "upos"]
    assert [r.mode for r in rows] == list(CONDITIONAL)
    assert sections.conditional.conditional_encoders(data) == list(ENCODERS)
    for row in rows:
        for e, encoder in enumerate(ENCODERS):
            base = [_read(probes / "layer0" / encoder / f"seed{s}" / "metrics.json") for s in SEEDS]
            cond = [
                _read(probes / f"layer0+{row.mode}" / encoder / f"seed{s}" / "metrics.json")
                for s in SEEDS
            ]
            bits = [b["test_bits"] - c["test_bits"] for b, c in zip(base, cond, strict=True)]
            dev = [b["dev_bits"] - c["dev_bits"] for b, c in zip(base, cond, strict=True)]
            gain = [100 * (c["test"] - b["test"]) for b, c in zip(base, cond, strict=True)]
            tested = gains[row.mode, encoder].test_bits
            assert tested.effect.effect == pytest.approx(np.mean(bits), abs=1e-3)
            mark = " *" if tested.significant(0.05) else ""
            assert row.bits[e].startswith(f"{np.mean(bits):+z.3f} [")
            assert row.bits[e].endswith("]" + mark)
            assert row.bits_hovers[e].startswith(
                f"dev: {_mean_std(dev, 3, signed=True)} bits/token; test: p "
            )
            assert row.metric_gains[e].startswith(f"{np.mean(gain):+z.2f} [")
            assert "two-level bootstrap" in row.metric_hovers[e]
            assert "of the 40 test sentences" in row.metric_hovers[e]
    trained = {g.mode: g for g in data.gains if (g.task, g.encoder) == ("upos", "trained")}
    assert trained["layer1"].test_bits.values == pytest.approx((0.49, 0.48, 0.47))
    assert trained["layer1"].test_bits.p_value < 0.05
    assert trained["layer2"].test_bits.values == pytest.approx((0.0, 0.0, 0.0))
    assert trained["layer2"].test_bits.p_value > 0.5
    assert trained["layer2"].metric.p_value == 1.0  # the same counts in every sentence
    assert rows[0].bits[0].startswith("+0.480 [") and rows[0].bits[0].endswith("] *")
    assert rows[1].bits[0].startswith("+0.000 [")  # no "-0.000" from rounding
    assert rows[1].metric_gains[0] == "+0.00 [+0.00, +0.00]"


def test_without_per_sentence_sums_the_differences_are_not_tested(report):
    data, _, _ = report
    (gain,) = [g for g in data.gains if g.task == "ner"]
    bits = [NER[s][1] - NER[s][3] for s in SEEDS]
    scores = [NER[s][2] - NER[s][0] for s in SEEDS]
    assert gain.test_bits.values == pytest.approx(bits)
    assert gain.test_bits.p_value is None and gain.metric.p_value is None
    assert gain.test_bits.method == "not testable: runs without per-sentence bits"
    assert gain.metric.method == "not testable: runs without per-sentence counts"
    assert gain.metric.values == pytest.approx(scores)
    (row,) = [r for r in sections.conditional.conditional_rows(data) if r.task == "ner"]
    assert row.metric == "span F1" and row.bits[1:] == ["–", "–"]
    assert row.bits[0] == f"{np.mean(bits):+.3f} (untested)"


def test_conditional_finding_is_computed_from_the_numbers(report):
    data, _, out = report
    upos, ner = sections.conditional.findings(data)
    layer0, mix = (
        _read(out.parent / "probes" / "upos" / features / "trained" / "seed1" / "metrics.json")
        for features in ("layer0", "layer0+scalar_mix")
    )
    points = 100 * (mix["test"] - layer0["test"])  # the same counts for every seed
    gain = next(
        g for g in data.gains if (g.task, g.mode, g.encoder) == ("upos", "scalar_mix", "trained")
    )
    bits_p, points_p = (p_equals(t.p_value) for t in (gain.test_bits, gain.metric))
    # the most on dev: the scalar mix (0.6 - 0.01 k bits/token against layer 1's 0.5 - 0.01 k)
    assert upos == (
        "upos: for the trained biLM, layer0 + scalar mix adds the most beyond layer 0 (chosen on "
        f"dev): +0.580 ± 0.010 bits/token on test (significant, Holm-adjusted {bits_p}) and"
        f" +{points:.2f} ± 0.00 points of accuracy (significant, Holm-adjusted {points_p}); with"
        " the same mode, random init "
        "gains +0.130 bits/token and trained token layer + random LSTMs gains +0.230 bits/token."
    )
    assert ner.startswith("ner: for the trained biLM, layer0 + layer 1 adds the most beyond")


# --- the report --------------------------------------------------------------------------------


def test_conditional_modes_stay_out_of_the_layer_tables_and_figures(report):
    data, summary, out = report
    assert {f for _, f, _ in data.cells} == set(MODES)
    assert set(summary["probes"]["upos"]) == set(MODES)
    assert {mode for _, mode, _ in sections.results.result_rows(data)} == set(MODES)
    assert all(
        r.best_layer in ("layer0", "layer1", "layer2")
        for r in sections.headline.headline_rows(data)
    )
    assert "layer0+" not in (out / "plots" / "probes" / "upos.csv").read_text()
    page = (out / "index.html").read_text(encoding="utf-8")
    all_results = page[page.index('id="all-results"') : page.index('id="polysemy"')]
    assert "layer0+" not in all_results and "layer0 + " not in all_results
    main_result = page[page.index('id="main-result"') : page.index('id="pretraining"')]
    assert "layer0+" not in main_result and "layer0 + " not in main_result
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    scores = markdown[markdown.index("## Test scores") : markdown.index("## Configuration")]
    assert "layer0+" not in scores
    assert summary["training"]["trained_runs"] == len(data.inputs.probes) + len(
        data.inputs.conditional
    )


def test_the_report_shows_both_sections_in_html_and_markdown(report):
    data, _, out = report
    page = html.unescape((out / "index.html").read_text(encoding="utf-8"))
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    for anchor in ("online-code", "conditional-probing"):
        assert f'id="{anchor}"' in page and f'href="#{anchor}"' in page
    for name in ("online_code", "conditional_probing"):
        assert (out / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert f"figures/{name}.png" in markdown
    assert "## Online code (description length)" in markdown
    assert "## Information beyond layer 0 (conditional probing)" in markdown
    built = sections.Sections.of(data)
    for table in (built.online_code, built.conditional):
        header = "| " + " | ".join(
            c.title + (f" ({c.detail})" if c.detail else "") for c in table.columns
        )
        assert header in markdown
        for row in table.rows:
            assert any(all(c.text in line for c in row) for line in markdown.splitlines())
            assert all(c.text in page for c in row)
        assert table.note in page and table.note in markdown
    for line in [*built.online_code_findings, *built.conditional_findings]:
        assert line in page and f"- {line}" in markdown
    assert [c.detail for c in built.online_code.columns[2:5]] == [
        "compression",
        "online code, kbits",
        "control task's compression",
    ]
    assert [c.text for c in built.conditional.rows[0][:2]] == ["upos", "layer0 + layer 1"]


def test_summary_json_has_the_information_numbers(report):
    data, summary, out = report
    assert _read(out / "summary.json") == summary
    cells = {(c["task"], c["features"], c["encoder"]): c for c in summary["online_code"]["cells"]}
    layer1 = cells["upos", "layer1", "trained"]
    assert layer1["compression"]["values"] == pytest.approx([3.52, 3.54, 3.56])
    assert layer1["compression"]["mean"] == pytest.approx(3.54)
    assert layer1["compression"]["std"] == pytest.approx(0.02)
    assert layer1["uniform_bits"] == pytest.approx(1000 * math.log2(17))
    assert layer1["blocks"][0]["block_tokens"] == BLOCK_TOKENS and layer1["seeds"] == list(SEEDS)
    assert cells["upos", "layer0", "token_only"]["same_features_as"] == "trained"
    assert summary["online_code"]["findings"] == sections.online_code.findings(data)
    conditional = summary["conditional_probing"]
    gains = {(g["task"], g["mode"], g["encoder"]): g for g in conditional["gains"]}
    mix = gains["upos", "scalar_mix", "trained"]
    assert mix["features"] == "layer0+scalar_mix" and mix["metric"] == "accuracy"
    assert mix["test_bits_gain"]["values"] == pytest.approx([0.59, 0.58, 0.57])
    assert mix["test_bits_gain"]["significant"] is True
    assert mix["dev_bits_gain"]["mean"] == pytest.approx(0.58)
    assert mix["metric_gain"]["mean"] == pytest.approx(
        np.mean(mix["conditional"]["test"]) - np.mean(mix["layer0"]["test"])
    )
    assert mix["layer0"]["test_bits"] == pytest.approx([1.51, 1.52, 1.53])
    assert gains["upos", "layer2", "trained"]["test_bits_gain"]["significant"] is False
    assert gains["ner", "layer1", "trained"]["test_bits_gain"]["method"].startswith("not test")
    assert mix["test_bits_gain"]["low"] < 0.58 < mix["test_bits_gain"]["high"]
    assert mix["test_bits_gain"]["family"] == "information beyond layer 0 (bits)"
    assert conditional["findings"] == sections.conditional.findings(data)


def test_without_information_results_the_sections_are_absent(tmp_path):
    """A tree without online codes and conditional probes (but with bits per token on its runs):
    no section, no figure, empty summary entries."""
    write_pretraining(tmp_path / "artifacts")
    probes = tmp_path / "artifacts" / "probes"
    write_upos(probes)
    for folder in probes.glob("upos/layer0+*"):
        shutil.rmtree(folder)
    data, summary, out = _build(tmp_path)
    built = sections.Sections.of(data)
    assert (built.online_code, built.conditional) == (None, None)
    assert built.online_code_findings == built.conditional_findings == []
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "conditional-probing" not in page
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    assert "beyond layer 0" not in markdown
    # the online code is reported as off, with the command that turns it on
    assert built.online_code_off == sections.ONLINE_CODE_OFF
    assert "make run EXPERIMENT=information" in page
    assert "## Online code (description length)\n\n" + sections.ONLINE_CODE_OFF in markdown
    assert not (out / "figures" / "online_code.png").exists()
    assert not (out / "figures" / "conditional_probing.png").exists()
    assert summary["online_code"] == {"findings": [], "cells": []}
    assert summary["conditional_probing"]["gains"] == []
    assert summary["information_time"] == []
    assert summary["probes"]["upos"]["layer0"]["trained"]["extra"]["test_bits"] == pytest.approx(
        [1.51, 1.52, 1.53]
    )


def test_a_span_task_pairs_its_bits_by_sentence_through_its_token_counts(tmp_path):
    """Span F1 is not counted per sentence, so its runs carry each test sentence's tokens beside
    the bits (``per_sentence_test_tokens``): the bits difference gets the two-level test."""

    tokens = _totals()
    for seed in (1, 2, 3):
        for features, rate in (("layer0", 1.5), ("layer0+layer1", 1.0)):
            write_information_run(
                tmp_path,
                "chunk",
                features,
                "trained",
                seed,
                metric="span_f1",
                dev=0.8,
                test=0.8,
                per_sentence_test=None,
                dev_bits=rate,
                test_bits=rate,
                per_sentence_test_bits=(rate * tokens + WOBBLE).tolist(),
                per_sentence_test_tokens=tokens.tolist(),
            )
    runs = read_probe_runs(tmp_path)
    base = tuple(r for r in runs if r.features == "layer0")
    conditioned = tuple(r for r in runs if r.features == "layer0+layer1")
    assert all((r.per_sentence_test_tokens == tokens).all() for r in runs)
    effect, method = Bootstrap(500, 1).test(
        "chunk", [(1.0, base), (-1.0, conditioned)], paired=True, bits=True
    )
    assert method.startswith("two-level bootstrap") and effect is not None
    assert effect.effect == pytest.approx(0.5, abs=0.01) and effect.p_value < 0.01


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        (list(range(N_SENTENCES - 1)), f"{N_SENTENCES} sentences but per_sentence_test_tokens"),
        ([1.5] * N_SENTENCES, "per_sentence_test_tokens must be a list of counts"),
    ],
)
def test_bad_per_sentence_tokens_are_an_error_naming_the_file(tmp_path, tokens, problem):
    path = write_information_run(
        tmp_path,
        "chunk",
        "layer0",
        "trained",
        1,
        metric="span_f1",
        dev=0.8,
        test=0.8,
        per_sentence_test=None,
        per_sentence_test_bits=[1.0] * N_SENTENCES,
        per_sentence_test_tokens=tokens,
    )
    expect_error(lambda: read_probe_runs(tmp_path), path, None, problem)
