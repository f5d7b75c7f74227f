"""The report's layer panel (what each layer encodes) against a hand computation on the fake
artifacts' files, the family grouping, and the baselines without features beside the scores."""

import html
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from fixtures.report.fake_artifacts import (
    DISPLAY,
    EXPECTED,
    FAMILIES,
    SEEDS,
    TASKS,
    WSD_FIRST_SENSE,
    build_report,
    report_config,
    report_data,
    write,
    write_fake_artifacts,
    write_probe_runs,
)
from omegaconf import OmegaConf
from statsmodels.stats.multitest import multipletests

from elmolab.core.config import section
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import ReportConfig
from elmolab.report import gather, sections
from elmolab.report.collect import ProbeRun
from elmolab.report.significance import RunScores, compare
from elmolab.report.stats import Bootstrap, group_cells, layer_gaps

ALPHA = 0.05
SAMPLES = 2000  # conf/report/default.yaml's bootstrap_samples, which build_report uses


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[dict, Path]:
    root = tmp_path_factory.mktemp("layers")
    write_fake_artifacts(root, model=False)
    write_probe_runs(root / "token_only", encoders=("token_only",))
    for path in (root / "token_only").rglob("metrics.json"):
        write(root / "artifacts" / "probes" / path.relative_to(root / "token_only"), _load(path))
    summary, out = build_report(root, polysemy=False)
    return summary, out


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _run_file(out: Path, task: str, mode: str, encoder: str, seed: int | None) -> dict:
    folder = out.parent / "probes" / task / mode / encoder
    return _load(folder / ("metrics.json" if seed is None else f"seed{seed}/metrics.json"))


def _by_hand(out: Path, task: str, encoder: str) -> dict:
    """Layer 2 - layer 1 from the metrics files: per-seed values, mean, std, and the two-level
    test's unadjusted p-value (the report's seed, 1, plus the hash of the comparison)."""
    seeds = [None] if task == "wsd" else list(SEEDS)
    one = [_run_file(out, task, "layer1", encoder, s) for s in seeds]
    two = [_run_file(out, task, "layer2", encoder, s) for s in seeds]
    values = np.array([b["test"] - a["test"] for a, b in zip(one, two, strict=True)])
    sides = [RunScores(*_sums(runs), tuple(seeds)) for runs in (one, two)]
    effect = compare(
        *sides,
        paired=True,
        samples=SAMPLES,
        seed=1 + zlib.crc32(f"{task}/{encoder}/layer2-layer1".encode()),
        deterministic=task == "wsd",
    )
    std = values.std(ddof=1) if len(values) > 1 else None
    return {"values": values, "mean": values.mean(), "std": std, "p": effect.p_value}


def _sums(runs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per run and test sentence: correct and total, or span F1's 2 tp and pred + gold."""
    if runs[0].get("per_sentence_test"):
        counts = [r["per_sentence_test"] for r in runs]
        return (
            np.array([c["correct"] for c in counts]),
            np.array([c["total"] for c in counts]),
        )
    spans = [r["per_sentence_test_spans"] for r in runs]
    tp, pred, gold = (np.array([c[key] for c in spans]) for key in ("tp", "pred", "gold"))
    return 2 * tp, pred + gold


def _holm(raw: dict[str, float]) -> dict[str, float]:
    return dict(zip(raw, multipletests(list(raw.values()), method="holm")[1], strict=True))


def test_layer2_minus_layer1_matches_a_hand_computation(report):
    summary, out = report
    panel = {row["task"]: row for row in summary["layer_panel"]["tasks"]}
    assert set(panel) == {task for task in FAMILIES if task in TASKS or task == "wsd"} - {
        "upos_control"
    }
    for encoder in ("trained", "random", "token_only"):
        hands = {task: _by_hand(out, task, encoder) for task in panel}
        adjusted = _holm({task: hand["p"] for task, hand in hands.items()})
        for task, row in panel.items():
            hand, got = hands[task], row["encoders"][encoder]
            assert got["values"] == pytest.approx(hand["values"].tolist(), abs=1e-12)
            assert got["difference"] == pytest.approx(hand["mean"], abs=1e-9)
            if hand["std"] is None:
                assert got["difference_std"] is None  # WSD: one run, no spread
            else:
                assert got["difference_std"] == pytest.approx(hand["std"], abs=1e-12)
            assert got["p_unadjusted"] == pytest.approx(hand["p"], rel=1e-9)
            assert got["p_value"] == pytest.approx(adjusted[task], rel=1e-9)
            assert got["family_tests"] == len(panel)
            assert got["significant"] == (adjusted[task] < ALPHA)
    wsd = panel["wsd"]["encoders"]["trained"]["method"]
    assert wsd.startswith("two-level bootstrap (2000 resamples of the 1 paired units")
    assert "of the 80 test sentences" in wsd
    chunk = panel["chunk"]["encoders"]["trained"]["method"]
    assert chunk.startswith("two-level bootstrap (2000 resamples of the 3 paired units")


def test_mix_weights_and_centre_of_gravity_match_a_hand_computation(report):
    summary, out = report
    panel = {row["task"]: row for row in summary["layer_panel"]["tasks"]}
    for task in TASKS:
        if task.endswith("_control"):
            continue
        weights = np.array(
            [_run_file(out, task, "scalar_mix", "trained", s)["mix_weights"] for s in SEEDS]
        )  # (seeds, layers)
        gravity = weights[:, 1] + 2 * weights[:, 2]  # 0 * s_0 + 1 * s_1 + 2 * s_2, per seed
        assert panel[task]["mix_weights"] == pytest.approx(weights.mean(axis=0).tolist())
        centre = panel[task]["centre_of_gravity"]
        assert centre["values"] == pytest.approx(gravity.tolist())
        assert centre["mean"] == pytest.approx(gravity.mean())
        assert centre["std"] == pytest.approx(gravity.std(ddof=1))
    assert panel["wsd"]["mix_weights"] is None and panel["wsd"]["centre_of_gravity"] is None


def test_each_family_states_its_verdict_counts(report):
    summary, out = report
    findings = summary["layer_panel"]["findings"]
    panel_tasks = [row["task"] for row in summary["layer_panel"]["tasks"]]
    for family, line in zip(("syntactic", "semantic"), findings, strict=True):
        tasks = [
            t for t in ("upos", "xpos", "chunk", "ner", "deplabel", "wsd") if FAMILIES[t] == family
        ]
        every = {task: _by_hand(out, task, "trained") for task in panel_tasks}
        adjusted = _holm({task: hand["p"] for task, hand in every.items()})
        hands = {task: every[task] for task in tasks}
        lower = [t for t, h in hands.items() if adjusted[t] < ALPHA and h["mean"] < 0]
        upper = [t for t, h in hands.items() if adjusted[t] < ALPHA and h["mean"] > 0]
        neither = [t for t in tasks if t not in lower + upper]
        assert line.startswith(
            f"{family.capitalize()} (trained biLM, layer 2 − layer 1, Holm-adjusted p < 0.05): "
        )
        expected = f"{len(lower)} of {len(tasks)} tasks favour layer 1 significantly"
        expected += f" ({', '.join(lower)})" if lower else ""
        assert expected + ", " in line
        verb = "favours" if len(upper) == 1 else "favour"
        assert f"{len(upper)} {verb} layer 2" in line
        verb = "shows" if len(neither) == 1 else "show"
        assert f"{len(neither)} {verb} no significant difference" in line
        for task in neither:
            assert task in line.split("no significant difference")[1]
    # the fake artifacts: chunk and deplabel drop by 16 and 8 points from layer 1 to layer 2
    assert (
        findings[0]
        .split(": ", 1)[1]
        .startswith("2 of 4 tasks favour layer 1 significantly (chunk, deplabel)")
    )
    # the main result states them too, where the paper's layer orders used to be
    page = html.unescape((out / "index.html").read_text(encoding="utf-8"))
    main_result = page[page.index('id="main-result"') : page.index('id="layers"')]
    assert all(line in main_result for line in findings)


def test_the_panel_groups_tasks_by_family_in_the_figure_table_and_both_renderings(report):
    summary, out = report
    assert [(r["family"], r["task"]) for r in summary["layer_panel"]["tasks"]] == [
        ("syntactic", "upos"),
        ("syntactic", "xpos"),
        ("syntactic", "chunk"),
        ("syntactic", "deplabel"),
        ("semantic", "ner"),
        ("semantic", "wsd"),
    ]
    page = html.unescape((out / "index.html").read_text(encoding="utf-8"))
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    assert (out / "figures" / "layer_panel.png").stat().st_size > 10_000
    assert 'alt="layer 2 minus layer 1 per task"' in page
    assert (
        page.index('id="main-result"') < page.index('id="layers"') < page.index('id="pretraining"')
    )
    for text in (page, markdown):
        assert "What each layer encodes" in text
        assert "WSD, 1-NN, F1, layer 1 67.4, layer 2 69.0" in text  # the paper's references
        assert "POS, linear probe, accuracy, layer 1 97.3, layer 2 96.8" in text
        assert "97.30 · 96.80 (-0.50)" in text and "67.40 · 69.00 (+1.60)" in text
    assert "ELMo paper's layer orders" not in page
    rows = [line for line in markdown.splitlines() if line.startswith("| **syntactic**")]
    assert len(rows) == 1 and "| upos (accuracy) |" in rows[0]  # the family on its first row only
    wsd = next(line for line in markdown.splitlines() if line.startswith("|  | wsd (F1)"))
    assert "| – | – |" in wsd  # no mix weights, no centre of gravity: 1-NN learns no mix


def test_an_unknown_family_follows_the_known_ones_sorted():
    runs = [
        ProbeRun(Path("m.json"), task, mode, "trained", seed, metric="accuracy", test=score)
        for task, base in (("zeta", 0.5), ("upos", 0.9), ("alpha", 0.7))
        for seed in SEEDS
        for mode, score in (("layer1", base), ("layer2", base + 0.01 * seed))
    ]
    data = report_data(
        runs, families={"zeta": "lexical", "upos": "syntactic", "alpha": "discourse"}
    )
    assert sections.layers.panel_tasks(data) == [
        ("syntactic", "upos"),
        ("discourse", "alpha"),
        ("lexical", "zeta"),
    ]


def test_layer_gaps_pair_the_seeds_both_layers_have():
    def run(mode: str, seed: int, score: float) -> ProbeRun:
        return ProbeRun(Path("m.json"), "ner", mode, "trained", seed, metric="span_f1", test=score)

    scores = {"layer1": {1: 0.50, 2: 0.52, 3: 0.51}, "layer2": {2: 0.60, 3: 0.55, 4: 0.90}}
    cells = group_cells(
        run(m, seed, x) for m, by_seed in scores.items() for seed, x in by_seed.items()
    )
    (gap,) = layer_gaps(cells, "layer1", "layer2", Bootstrap(100, 1), controls={})
    assert gap.values == pytest.approx((0.08, 0.04))  # seeds 2 and 3 only
    assert gap.difference == pytest.approx(0.06) and gap.std == pytest.approx(
        np.std([0.08, 0.04], ddof=1)
    )
    assert gap.method == "not testable: runs without per-sentence counts"
    assert gap.p_value is None and gap.interval is None


def test_a_task_without_a_family_is_an_error_and_nothing_is_written(tmp_path):
    write_fake_artifacts(tmp_path, model=False)
    cfg = report_config(tmp_path)
    families = {**FAMILIES, "ner": None}
    with pytest.raises(
        ElmolabError, match=r"grid\.tasks\.ner\.family: task 'ner' has probe results but no family"
    ):
        gather(
            section(cfg, "report", ReportConfig),
            "t",
            OmegaConf.to_yaml(cfg),
            1,
            tmp_path,
            families,
            DISPLAY,
            EXPECTED,
        )
    assert not (tmp_path / "artifacts" / "report").exists()


def test_the_papers_figures_on_a_task_outside_the_grid_name_the_key(tmp_path):
    cfg = report_config(tmp_path)
    cfg.report.paper_layers.nope = {"measure": "POS", "layer1": 0.9, "layer2": 0.8}
    config = section(cfg, "report", ReportConfig)
    with pytest.raises(
        ElmolabError, match=r"report\.paper_layers\.nope: not a task of grid\.tasks \(upos, xpos,"
    ):
        gather(config, "t", OmegaConf.to_yaml(cfg), 1, tmp_path, FAMILIES, DISPLAY, EXPECTED)


def test_the_first_sense_and_majority_baselines_stand_beside_the_scores(report, tmp_path):
    summary, out = report
    assert summary["baselines_without_features"] == {
        "wsd": {"WordNet first sense": WSD_FIRST_SENSE["test"]}
    }
    page = html.unescape((out / "index.html").read_text(encoding="utf-8"))
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    for text in (page, markdown):
        assert "baseline without features" in text and "WordNet first sense 58.00" in text
    # a sentence task's majority-class baseline (dev_/test_majority_baseline in its metrics.json)
    write_fake_artifacts(tmp_path, model=False)
    for mode in ("layer1", "layer2", "scalar_mix"):
        for seed in SEEDS:
            score = 0.40 + 0.01 * seed + (0.02 if mode == "layer2" else 0.0)
            write(
                tmp_path
                / "artifacts"
                / "probes"
                / "sentiment"
                / mode
                / "trained"
                / f"seed{seed}"
                / "metrics.json",
                {
                    "task": "sentiment",
                    "features": mode,
                    "encoder": "trained",
                    "seed": seed,
                    "metric": "accuracy",
                    "dev": score,
                    "test": score,
                    "mix_weights": [0.2, 0.3, 0.5] if mode == "scalar_mix" else None,
                    "dev_majority_baseline": 0.253,
                    "test_majority_baseline": 0.2312,
                },
            )
    cfg = report_config(tmp_path)
    families = {**FAMILIES, "sentiment": "semantic"}
    config = section(cfg, "report", ReportConfig)
    data = gather(config, "t", OmegaConf.to_yaml(cfg), 1, tmp_path, families, DISPLAY, EXPECTED)
    (row,) = [r for r in sections.headline.headline_rows(data) if r.task == "sentiment"]
    assert row.no_features == "majority class 23.12"
    (wsd,) = [r for r in sections.headline.headline_rows(data) if r.task == "wsd"]
    assert wsd.no_features == "WordNet first sense 58.00"
    assert ("semantic", "sentiment") in sections.layers.panel_tasks(data)
    (gravity,) = {sections.layers.mix_summary(data, "sentiment").gravity.mean()}
    assert gravity == pytest.approx(0.3 + 2 * 0.5)
