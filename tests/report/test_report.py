"""The report stage: reading and validating results, statistics against independent
computations, every output file, missing inputs, bad inputs and atomicity."""

import base64
import dataclasses
import hashlib
import html
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from fixtures.report.fake_artifacts import (
    DISPLAY,
    EXPECTED,
    FEATURES,
    SEEDS,
    TASKS,
    build_report,
    report_config,
    write,
    write_fake_artifacts,
    write_model_and_vocab,
    write_pretraining,
    write_probe_runs,
)
from omegaconf import OmegaConf

from elmolab.core.config import section
from elmolab.core.errors import ElmolabError
from elmolab.core.params import compose_params
from elmolab.core.schema import PolysemyConfig, ReportConfig
from elmolab.io.polysemy import lexname
from elmolab.polysemy.neighbours import parse_example
from elmolab.report import build as build_module
from elmolab.report import writers
from elmolab.report.build import code_version
from elmolab.report.collect import ProbeRun, collect, read_probe_runs
from elmolab.report.stats import (
    Bootstrap,
    compare_mix_to_best_layer,
    group_cells,
    selectivities,
)
from elmolab.stages import report as report_stage

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def _tool(name: str):
    """A module of tools/ (build-time scripts, outside the package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vega_template = _tool("vega_template")
N_RUNS = len(TASKS) * len(FEATURES) * 2 * len(SEEDS) + len(FEATURES) * 2  # seeded + wsd


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> tuple[dict, Path]:
    root = tmp_path_factory.mktemp("full")
    write_fake_artifacts(root)
    return build_report(root)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[ProbeRun]:
    probes = tmp_path_factory.mktemp("probes")
    write_probe_runs(probes)
    return read_probe_runs(probes)


# --- collect ---------------------------------------------------------------------------------


def test_collect_reads_every_run_and_lists_the_newer_outputs_as_missing(tmp_path):
    artifacts = write_fake_artifacts(tmp_path, model=False)
    inputs = collect(
        artifacts / "bilm",
        artifacts / "bilm_random",
        artifacts / "probes",
        display=DISPLAY,
        expected=EXPECTED,
    )
    assert len(inputs.probes) == N_RUNS
    # A tree from before the token_only encoder, the structural probe and learning curves
    # (test_report_extra.py: a complete tree lists nothing).
    assert [line.split(":")[0] for line in inputs.missing] == [
        "no probe runs on the token_only encoder",
        f"no structural-probe results ({artifacts / 'probes' / 'structural'}/)",
        "no learning-curve runs (<task>/<features>/<encoder>/seed<k>/fraction_<f>/)",
    ]
    assert inputs.trained.curve["val_ppl"].shape == (40,)
    assert np.isnan(inputs.trained.curve["val_ppl"]).sum() == 32  # validation every 5th row
    wsd_mix = [r for r in inputs.probes if r.task == "wsd" and r.features == "scalar_mix"]
    assert wsd_mix and not any(r.applicable for r in wsd_mix)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("test"), "missing key 'test'"),
        (lambda d: d.update(dev="high"), "'dev' should be a number"),
        (lambda d: d.update(seed=2), "disagree with the file's path"),
        (lambda d: d["per_sentence_test"]["correct"].pop(), "per_sentence_test: 79 correct"),
    ],
)
def test_a_bad_probe_file_is_an_error_naming_it(tmp_path, edit, message):
    write_probe_runs(tmp_path)
    path = tmp_path / "upos" / "layer1" / "trained" / "seed1" / "metrics.json"
    data = json.loads(path.read_text())
    edit(data)
    write(path, data)
    with pytest.raises(ElmolabError, match=re.escape(str(path)) + ".*" + re.escape(message)):
        read_probe_runs(tmp_path)


def test_bad_json_and_bad_curve_are_errors_naming_the_file(tmp_path):
    none = tmp_path / "none"
    write_pretraining(tmp_path)
    (tmp_path / "bilm" / "metrics.json").write_text('{"val": ', encoding="utf-8")
    with pytest.raises(ElmolabError, match=r"bilm/metrics.json:1: not valid JSON"):
        collect(tmp_path / "bilm", none, none, display=DISPLAY, expected=EXPECTED)
    write_pretraining(tmp_path)
    curve = tmp_path / "bilm" / "curve.csv"
    curve.write_text(curve.read_text().replace("500,1280000", "500,lots"), encoding="utf-8")
    with pytest.raises(ElmolabError, match=r"curve.csv:6: column 'tokens': 'lots'"):
        collect(tmp_path / "bilm", none, none, display=DISPLAY, expected=EXPECTED)


# --- statistics ------------------------------------------------------------------------------


def test_mean_std_and_seeds_match_numpy_over_the_files(runs):
    cells = group_cells(runs)
    for (task, mode, encoder), cell in cells.items():
        files = [r.path for r in runs if (r.task, r.features, r.encoder) == (task, mode, encoder)]
        values = [json.loads(p.read_text()).get("test") for p in files]
        if task == "wsd":
            assert cell.n == (0 if mode == "scalar_mix" else 1) and math.isnan(cell.std)
            continue
        assert cell.seeds == list(SEEDS)
        assert cell.mean == pytest.approx(np.mean(values), abs=1e-12)
        assert cell.std == pytest.approx(np.std(values, ddof=1), abs=1e-12)


def test_best_single_layer_is_chosen_on_dev_not_on_test(tmp_path):
    def run(features, dev, test, seed=1):
        return ProbeRun(tmp_path, "pos", features, "trained", seed, True, "accuracy", dev, test)

    cells = group_cells(
        [run("layer1", 0.90, 0.80), run("layer2", 0.85, 0.95), run("scalar_mix", 0.9, 0.9)]
    )
    [comparison] = compare_mix_to_best_layer(cells, Bootstrap(100, 0))
    assert comparison.best_layer.features == "layer1"
    assert comparison.difference == pytest.approx(0.10)
    assert comparison.p_value is None and comparison.method.startswith("not testable")


def test_accuracy_and_span_f1_tasks_use_the_same_two_level_test(runs):
    comparisons = {
        (c.task, c.encoder): c
        for c in compare_mix_to_best_layer(group_cells(runs), Bootstrap(200, 1))
    }
    for task in ("upos", "ner"):
        method = comparisons[task, "trained"].method
        assert method.startswith("two-level bootstrap (200 resamples of the 3 paired units")
        assert "Holm over the" in method
    assert comparisons["wsd", "trained"].mix is None
    assert comparisons["wsd", "trained"].verdict(0.05) == "n/a"
    assert comparisons["wsd", "trained"].best_layer.features == "layer2"


def test_selectivity_is_task_minus_control_accuracy_per_seed(runs):
    cells = group_cells(runs)
    by_key = {
        (s.task, s.features, s.encoder): s
        for s in selectivities(cells, DISPLAY.controls, Bootstrap(100, 0))
    }
    assert set(by_key) == {("upos", f, e) for f in FEATURES for e in ("trained", "random")}
    task = cells["upos", "layer1", "trained"].test
    control = cells["upos_control", "layer1", "trained"].test
    s = by_key["upos", "layer1", "trained"]
    assert s.values == pytest.approx(tuple(task - control))
    assert s.std == pytest.approx(np.std(task - control, ddof=1))


def test_a_control_task_is_known_by_its_control_of_not_by_its_name(runs):
    renamed = [
        dataclasses.replace(run, task="scrambled") if run.task == "upos_control" else run
        for run in runs
    ]
    found = selectivities(group_cells(renamed), {"scrambled": "upos"}, Bootstrap(100, 0))
    assert {(s.task, s.features, s.encoder) for s in found} == {
        ("upos", f, e) for f in FEATURES for e in ("trained", "random")
    }
    assert (
        selectivities(group_cells(runs), {}, Bootstrap(100, 0)) == []
    )  # a name ending in _control is no control


# --- the report ------------------------------------------------------------------------------


def test_report_writes_every_file(full_report):
    _, out = full_report
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    figures = {
        "pretraining_curves",
        "probes_by_task",
        "task_feature_heatmap",
        "mix_weights",
        "selectivity",
    }
    assert {f"figures/{name}.png" for name in figures} <= names
    assert {"index.html", "summary.md", "summary.json", "metrics.json"} <= names
    assert {f"plots/probes/{task}.csv" for task in [*TASKS, "wsd"]} <= names
    assert "plots/validation_perplexity.csv" in names
    assert not list(out.parent.glob(".report.*"))  # no temporary folder left behind
    for name in figures:
        assert (out / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_index_html_is_self_contained(full_report):
    _, out = full_report
    page = (out / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "<script" not in page and "@import" not in page
    assert page.count('src="data:image/png;base64,') == 6
    main_result = page.index('id="main-result"')
    assert main_result < page.index('id="pretraining"')
    assert (
        "two-level bootstrap" in page and "Holm" in page
    )  # verdicts drawn: a biLM better than unigram
    assert 'class="quick-look"' not in page  # a study, not a quick look
    assert "What each layer encodes" in page and "Syntactic (trained biLM" in page
    assert "polysemy" in page.lower() and "play%2:33:00::" in page


def test_summary_json_has_mean_std_and_seed_values_for_every_cell(full_report, runs):
    summary, out = full_report
    assert json.loads((out / "summary.json").read_text()) == summary
    cells = group_cells(runs)
    for (task, mode, encoder), cell in cells.items():
        entry = summary["probes"][task][mode][encoder]
        assert entry["test"] == pytest.approx(cell.test.tolist())
        if cell.n > 1:
            assert entry["mean"] == pytest.approx(cell.mean)
            assert entry["std"] == pytest.approx(cell.std)
            assert entry["seeds"] == list(SEEDS)
    assert summary["probes"]["wsd"]["scalar_mix"]["trained"]["applicable"] is False
    assert summary["significance"]["alpha"] == 0.05
    assert summary["quick_look"] is False and summary["no_verdicts"] is None
    assert {c["task"] for c in summary["comparisons"]} == {*TASKS, "wsd"}
    assert summary["polysemy"]["contextual_layers"] == [2]
    play = summary["polysemy"]["words"][0]
    assert play["word"] == "play" and play["semcor_occurrences"] == 4
    assert len(play["layer0_neighbours"]) == 5
    senses = {n["sense_key"] for e in play["examples"] for n in e["neighbours"]}
    assert senses == {"play%2:33:00::", "play%1:10:01::"}


def test_metrics_json_and_plot_csvs_are_for_dvc(full_report):
    summary, out = full_report
    metrics = json.loads((out / "metrics.json").read_text())
    comparison = next(c for c in summary["comparisons"] if c["task"] == "upos")
    assert metrics["upos"]["trained"]["best_layer"] == int(comparison["best_layer"][-1])
    assert metrics["upos"]["trained"]["mix_minus_layer"] == pytest.approx(comparison["difference"])
    curve = (out / "plots" / "validation_perplexity.csv").read_text().splitlines()
    assert curve[0] == "step,tokens,val_ppl,val_ppl_fwd,val_ppl_bwd" and len(curve) == 9
    upos = (out / "plots" / "probes" / "upos.csv").read_text().splitlines()
    assert upos[0] == "label,features,encoder,mean,std,n" and len(upos) == 13
    mean = summary["probes"]["upos"]["layer0"]["trained"]["mean"]
    assert upos[1].startswith(f"layer0 trained,layer0,trained,{100 * mean:.4f},")


def test_missing_inputs_render_a_report_that_says_what_is_missing(tmp_path):
    summary, out = build_report(tmp_path)
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "Missing inputs" in page and "No probe results yet" in page
    assert any("no probe results" in line for line in summary["missing"])
    assert any("random-initialisation control" in line for line in summary["missing"])
    assert any("polysemy table not computed" in line for line in summary["missing"])
    assert not list((out / "figures").iterdir())


def test_only_trained_runs_and_no_wsd_say_so(tmp_path):
    write_probe_runs(tmp_path / "artifacts" / "probes", encoders=("trained",))
    for path in (tmp_path / "artifacts" / "probes" / "wsd").rglob("*.json"):
        path.unlink()
    summary, out = build_report(tmp_path, polysemy=False)
    missing = " ".join(summary["missing"])
    assert "random encoder" in missing and "no WSD results" in missing
    assert (out / "figures" / "probes_by_task.png").is_file()
    headline = (out / "summary.md").read_text()
    assert "| upos | layer1" in headline


def test_a_failure_leaves_the_previous_report_untouched(tmp_path, monkeypatch):
    write_fake_artifacts(tmp_path, model=False)
    out = tmp_path / "artifacts" / "report"
    out.mkdir(parents=True)
    (out / "index.html").write_text("previous report", encoding="utf-8")

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(build_module, "_figures", lambda data: [])  # fast; not under test
    monkeypatch.setattr(writers, "render_markdown", fail)  # after index.html is written
    with pytest.raises(RuntimeError, match="disk full"):
        build_report(tmp_path, polysemy=False)
    assert [p.name for p in out.iterdir()] == ["index.html"]
    assert (out / "index.html").read_text() == "previous report"
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []


def test_a_bad_probe_file_fails_the_stage_before_writing(tmp_path):
    write_fake_artifacts(tmp_path, model=False)
    bad = tmp_path / "artifacts" / "probes" / "ner" / "mean" / "random" / "seed2" / "metrics.json"
    bad.write_text('{"task": "ner"}', encoding="utf-8")
    with pytest.raises(ElmolabError, match=re.escape(f"{bad}: missing key 'features'")):
        build_report(tmp_path)
    assert not (tmp_path / "artifacts" / "report").exists()


# --- polysemy, config, version, stage script --------------------------------------------------


def test_polysemy_examples_mark_one_target_and_sense_keys_name_their_file():
    target = parse_example("The [play] opened .")
    assert target.tokens == ("The", "play", "opened", ".") and target.position == 1
    with pytest.raises(ElmolabError, match=r"words\[0\].*exactly one token"):
        parse_example("no target here", "polysemy.words[0].examples[0]")
    assert lexname("play%1:10:01::") == "noun.communication"
    assert lexname("play%2:33:00::") == "verb.competition"
    assert lexname("bank%1:17:01::") == "noun.object"
    assert lexname("garbage") == "?"


def test_without_semcor_the_polysemy_table_has_only_context_free_neighbours(tmp_path):
    write_model_and_vocab(tmp_path / "artifacts")
    summary, _ = build_report(tmp_path)
    assert any("no SemCor" in line for line in summary["missing"])
    words = summary["polysemy"]["words"]
    assert [w["word"] for w in words] == ["play", "bank", "plant", "interest", "state"]
    assert all(len(w["layer0_neighbours"]) == 5 for w in words)
    assert all(e["neighbours"] == [] for w in words for e in w["examples"])


def test_bad_contextual_layer_is_a_config_error(tmp_path):
    write_fake_artifacts(tmp_path)
    with pytest.raises(ElmolabError, match=r"contextual_layers: \[3\]"):
        build_report(tmp_path, **{"polysemy.contextual_layers": [3]})


def test_report_section_composes_and_validates():
    composed = yaml.safe_load(compose_params(CONF))
    if "report" not in composed:  # conf/config.yaml's defaults list does not name it yet
        composed = yaml.safe_load(compose_params(CONF, ["+report=default"]))
    cfg = OmegaConf.create(composed)
    config = section(cfg, "report", ReportConfig)
    assert config.inputs.probes == "artifacts/probes"
    polysemy = section(cfg, "polysemy", PolysemyConfig)
    assert polysemy.words[0].word == "play" and len(polysemy.words) >= 4
    cfg.report.significance.alhpa = 0.01
    with pytest.raises(ElmolabError, match=r"report.significance.alhpa"):
        section(cfg, "report", ReportConfig)


def test_code_version_is_the_commit_or_unknown(tmp_path):
    version = code_version(ROOT)
    assert re.fullmatch(r"[0-9a-f]{40}", version.commit) and version.dirty in (True, False)
    assert str(code_version(tmp_path)) == "unknown"


def test_the_lock_file_dvc_rewrites_during_a_run_is_not_an_uncommitted_change(tmp_path):
    def git(*args: str) -> None:
        identity = ["-c", "user.name=t", "-c", "user.email=t@elmolab.invalid"]
        subprocess.run(["git", *identity, *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "dvc.lock").write_text("schema: '2.0'\n")
    (tmp_path / "conf.yaml").write_text("lr: 0.1\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "start")
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    git("add", "dvc.lock")  # as DVC's autostage leaves it
    assert code_version(tmp_path).dirty is False
    (tmp_path / "conf.yaml").write_text("lr: 0.2\n")
    assert code_version(tmp_path).dirty is True


def test_stage_script_under_dvc_redacts_secrets_and_ends_with_the_reports_path(tmp_path):
    write_pretraining(tmp_path / "artifacts")
    cfg = report_config(tmp_path)
    cfg.logger = {"wandb": {"project": "elmolab", "api_key": "sk-SECRET-123"}}
    cfg.paths.artifacts = str(tmp_path / "artifacts")
    params = tmp_path / "params.yaml"
    params.write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(ROOT / "pipelines" / "report.py"), "--params", str(params)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("The report: artifacts/report/index.html (open it in a browser"), last
    out = tmp_path / "artifacts" / "report"
    for name in ("index.html", "summary.md"):
        text = (out / name).read_text(encoding="utf-8")
        assert "sk-SECRET-123" not in text and "api_key: <redacted>" in html.unescape(text)


def test_summary_md_shows_every_setting_of_the_default_config(tmp_path):
    """Only secrets are redacted: the configuration summary.md shows is the default composition,
    every key and value (max_sentence_tokens, token_column, token_encoder, batch_tokens ...)."""
    write_pretraining(tmp_path / "artifacts")
    overrides = [f"paths.data={tmp_path / 'data'}", f"paths.artifacts={tmp_path / 'artifacts'}"]
    cfg = OmegaConf.create(yaml.safe_load(compose_params(CONF, overrides)))
    settings = OmegaConf.to_container(cfg, resolve=True)
    cfg.logger.wandb_api_key = "sk-SECRET-123"
    report_stage.run(cfg, tmp_path / "report")
    summary = (tmp_path / "report" / "summary.md").read_text(encoding="utf-8")
    shown = summary.split("## Configuration\n\n```yaml\n", 1)[1].split("\n```", 1)[0]
    logger = {**settings["logger"], "wandb_api_key": "<redacted>"}
    assert yaml.safe_load(shown) == {**settings, "logger": logger}


# --- the offline DVC plots template ------------------------------------------------------------


def _fake_tarballs(folder: Path) -> tuple[vega_template.NpmPackage, ...]:
    packages = []
    for package in vega_template.PACKAGES:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            code = f"window.{package.name.replace('-', '_')} = '</script>';".encode()
            info = tarfile.TarInfo(package.script)
            info.size = len(code)
            tar.addfile(info, io.BytesIO(code))
        (folder / package.tarball).write_bytes(buffer.getvalue())
        digest = base64.b64encode(hashlib.sha512(buffer.getvalue()).digest()).decode()
        packages.append(package._replace(integrity=f"sha512-{digest}"))
    return tuple(packages)


def test_vega_template_inlines_the_scripts_and_keeps_dvc_placeholders(tmp_path, monkeypatch):
    monkeypatch.setattr(vega_template, "PACKAGES", _fake_tarballs(tmp_path))
    page = vega_template.build_template(tmp_path)
    assert "{plot_divs}" in page and "{refresh_tag}" in page and "{scripts}" not in page
    assert page.count("<script>") == 3 and "window.vega_lite = '<\\/script>'" in page
    assert "http" not in page


def test_vega_template_rejects_a_tarball_with_another_digest(tmp_path, monkeypatch):
    packages = _fake_tarballs(tmp_path)
    monkeypatch.setattr(vega_template, "PACKAGES", (packages[0]._replace(integrity="sha512-x"),))
    with pytest.raises(ElmolabError, match=r"vega-5\.20\.2\.tgz: integrity mismatch"):
        vega_template.build_template(tmp_path)


def test_vega_template_falls_back_to_the_cdn_only_when_asked(tmp_path, monkeypatch):
    def no_npm(folder):
        raise ElmolabError("npm pack failed: no npm")

    monkeypatch.setattr(vega_template, "fetch_tarballs", no_npm)
    assert vega_template.main([str(tmp_path / "strict.html")]) == 2
    assert not (tmp_path / "strict.html").exists()
    assert vega_template.main([str(tmp_path / "cdn.html"), "--cdn-fallback"]) == 0
    page = (tmp_path / "cdn.html").read_text(encoding="utf-8")
    assert "{scripts}" in page and "{plot_divs}" in page


def test_dvc_plots_show_works_on_a_fresh_clone_and_inlines_vega_when_make_names_the_template(
    tmp_path, monkeypatch
):
    """.dvc/config names no build product: a plain `dvc plots show` on a clone without
    build/dvc-plots.html renders with DVC's own template (vega from a CDN); `make plots` passes
    the offline template (--html-template), whose inlined scripts replace the CDN's."""
    repo = tmp_path / "repo"
    (repo / "plots").mkdir(parents=True)
    (repo / "plots" / "ppl.csv").write_text("tokens,val_ppl\n100,50\n200,40\n", encoding="utf-8")
    (repo / "dvc.yaml").write_text(
        "plots:\n  - plots/ppl.csv:\n      x: tokens\n      y: val_ppl\n", encoding="utf-8"
    )
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}

    def dvc(*args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "dvc", *args],
            cwd=repo,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, timeout=60)
    dvc("init", "-q")
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    dvc("plots", "show", "-o", "plain")
    assert "cdn.jsdelivr" in (repo / "plain" / "index.html").read_text(encoding="utf-8")

    monkeypatch.setattr(vega_template, "PACKAGES", _fake_tarballs(tmp_path))
    (repo / "build").mkdir()
    (repo / "build" / "dvc-plots.html").write_text(
        vega_template.build_template(tmp_path), encoding="utf-8"
    )
    dvc("plots", "show", "-o", "offline", "--html-template", "build/dvc-plots.html")
    page = (repo / "offline" / "index.html").read_text(encoding="utf-8")
    assert "<script src=" not in page and "window.vega_lite" in page and "vegaEmbed(" in page
