"""The report of a quick look (experiment=smoke) says what it is: a banner from conf/, nothing
listed as missing that the configuration leaves out, no verdicts where the biLM predicts words no
better than a unigram model, and token counts readable at every size."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from fixtures.report.fake_artifacts import (
    DISPLAY,
    EXPECTED,
    FAMILIES,
    gather_report,
    pretraining_metrics,
    report_config,
    write,
    write_fake_artifacts,
    write_probe_runs,
)
from omegaconf import DictConfig, OmegaConf

from elmolab.core.config import section
from elmolab.core.params import compose_params
from elmolab.core.schema import ReportConfig
from elmolab.report import figures, gather, sections, write_report
from elmolab.report.collect import Display, Expected, Pretraining, collect
from elmolab.report.format import NO_VERDICT, token_count
from elmolab.report.layout import Table

CONF = Path(__file__).resolve().parents[2] / "conf"
VAL_PPL, UNIGRAM_PPL = 1275.3, 268.0  # a smoke run's biLM after 60 steps, and the unigram model
TOKENS = 19_200  # 60 steps of 16 streams of 20 tokens
CONDITIONAL_TASKS = ("upos", "chunk", "upos_control")  # conditional: true in conf/tasks/
VERDICTS = ("mix better", "best layer better", "no significant difference", "trained better")


@pytest.fixture(scope="module")
def smoke() -> DictConfig:
    """The composed config of experiment=smoke."""
    return OmegaConf.create(yaml.safe_load(compose_params(CONF, ["experiment=smoke"])))


def write_bad_pretraining(artifacts: Path) -> None:
    """A biLM worse than the unigram model, after a quick look's tokens."""
    metrics = pretraining_metrics(VAL_PPL, 60, TOKENS)
    metrics["unigram_ppl"] = {"valid": UNIGRAM_PPL, "test": 270.1}
    write(artifacts / "bilm" / "metrics.json", metrics)
    write(artifacts / "bilm_random" / "metrics.json", pretraining_metrics(28000.0, 0, 0))


def write_quick_look_probes(probes: Path, smoke: DictConfig) -> None:
    """What the smoke grid writes: its feature modes, its one seed, and conditional probes on
    layer 0 beside each of its modes, without a layer-0 run (the grid has none)."""
    write_probe_runs(probes, encoders=tuple(smoke.probe.encoders))
    for pattern, kept in (("*/*", smoke.grid.features), ("*/*/*/seed*", smoke.grid.seeds)):
        for folder in list(probes.glob(pattern)):
            if folder.name.removeprefix("seed") not in map(str, kept):
                shutil.rmtree(folder)
    for path in probes.glob("*/*/*/seed*/metrics.json"):
        task, mode = path.parts[-5:-3]
        if task in CONDITIONAL_TASKS:
            run = {**json.loads(path.read_text(encoding="utf-8")), "features": f"layer0+{mode}"}
            write(probes / task / run["features"] / Path(*path.parts[-3:]), run)


@pytest.fixture(scope="module")
def quick_look(tmp_path_factory, smoke) -> tuple[dict, Path]:
    """The report of a smoke-shaped tree under the smoke preset's configuration."""
    root = tmp_path_factory.mktemp("quick_look")
    write_bad_pretraining(root / "artifacts")
    write_quick_look_probes(root / "artifacts" / "probes", smoke)
    cfg = report_config(root, quick_look=True)
    config = section(cfg, "report", ReportConfig)
    data = gather(
        config,
        "quick look",
        OmegaConf.to_yaml(cfg),
        seed=1,
        cwd=root,
        families=FAMILIES,
        display=Display.of(smoke),
        expected=Expected.of(smoke),
    )
    out = root / "artifacts" / "report"
    return write_report(data, config, out), out


def test_the_smoke_preset_sets_the_quick_look_and_expects_its_own_grid(smoke):
    assert smoke.report.quick_look is True
    assert OmegaConf.load(CONF.parent / "params.yaml").report.quick_look is False
    expected = Expected.of(smoke)
    assert expected.features == ("layer1", "scalar_mix") and expected.learning_curves
    assert expected.tasks == tuple(smoke.grid.tasks) and "wsd" in expected.tasks


def test_the_quick_look_opens_with_its_banner(quick_look):
    summary, out = quick_look
    page = (out / "index.html").read_text(encoding="utf-8")
    banner = page.index('class="quick-look"')
    assert page.index("<h1>") < banner < page.index("<nav>")
    assert "report.quick_look" in page[banner : page.index("</div>", banner)]
    markdown = (out / "summary.md").read_text(encoding="utf-8").splitlines()
    assert markdown[0] == "# quick look"
    assert markdown[2].startswith("> **A quick look, not a study (report.quick_look)")
    assert summary["quick_look"] is True


def test_what_the_grid_leaves_out_is_not_missing(quick_look):
    summary, out = quick_look
    assert not any("conditional" in line for line in summary["missing"])
    assert summary["probes"]["upos"].keys() == {"layer1", "scalar_mix"}
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "layer0+layer1" not in page[: page.index('id="main-result"')]


def test_a_bilm_worse_than_unigram_gets_one_sentence_instead_of_verdicts(quick_look):
    summary, out = quick_look
    sentence = (
        f"No verdicts: the trained biLM's validation perplexity ({VAL_PPL:,.1f}) is not better"
        f" than the unigram model's ({UNIGRAM_PPL:,.1f})"
    )
    assert summary["no_verdicts"].startswith(sentence)
    markdown = (out / "summary.md").read_text(encoding="utf-8")
    main_result = markdown[markdown.index("## Main result") : markdown.index("| task |")]
    assert main_result.count("\n- ") == 2  # the sentence, and pretraining's numbers
    assert f"- {sentence}" in main_result and "after 19.2k training tokens" in main_result
    page = (out / "index.html").read_text(encoding="utf-8")
    for text in (markdown, page):
        assert not any(verdict in text for verdict in VERDICTS)
        assert "favour" not in text and "ahead on" not in text


def test_no_table_cell_carries_a_verdict_or_a_star(tmp_path):
    """Every section at once: the default study's tree (every mode, seed and encoder, so every
    comparison is testable) from a biLM worse than the unigram model."""
    write_fake_artifacts(tmp_path, model=False)
    write_probe_runs(tmp_path / "artifacts" / "probes", encoders=("token_only",))
    write_bad_pretraining(tmp_path / "artifacts")
    data, config = gather_report(
        tmp_path, polysemy=False, **{"significance.bootstrap_samples": 200}
    )
    shown = sections.Sections.of(data)
    assert shown.findings[0] == data.no_verdicts and len(shown.findings) == 2
    assert shown.layer_findings == [] and shown.banner is None
    tables = {name: t for name, t in vars(shown).items() if isinstance(t, Table)}
    assert {"headline", "layers", "random", "token_layer", "results"} <= tables.keys()
    cells = [cell for t in tables.values() for row in t.rows for cell in row]
    assert not any(cell.text.endswith("*") or cell.not_significant for cell in cells)
    assert {cell.text for cell in cells if cell.badge} == {NO_VERDICT}
    assert any(gap.significant(data.significance.alpha) for gap in data.layer_gaps)
    write_report(data, config, tmp_path / "report")
    assert (tmp_path / "report" / "figures" / "layer_panel.png").is_file()


def test_only_what_the_configuration_asks_for_is_missing(tmp_path):
    write_probe_runs(tmp_path / "probes", encoders=("trained",))
    shutil.rmtree(tmp_path / "probes" / "wsd")
    shutil.rmtree(tmp_path / "probes" / "upos" / "layer0")
    conditional = tmp_path / "probes" / "upos" / "layer0+layer1" / "trained" / "seed1"
    shutil.copytree(tmp_path / "probes" / "upos" / "layer1" / "trained" / "seed1", conditional)
    run = json.loads((conditional / "metrics.json").read_text(encoding="utf-8"))
    write(conditional / "metrics.json", {**run, "features": "layer0+layer1"})
    bilm, random = tmp_path / "bilm", tmp_path / "random"

    def missing(expected: Expected) -> list[str]:
        inputs = collect(bilm, random, tmp_path / "probes", display=DISPLAY, expected=expected)
        return inputs.missing[2:]  # after the pretraining metrics, absent here

    asked = Expected(("upos", "ner"), ("layer1", "scalar_mix"), ("trained",), False)
    assert missing(asked) == []
    assert [line.split(":")[0] for line in missing(EXPECTED)] == [
        "conditional probes without the layer0 run of their seed (not shown)",
        "no probe runs on the random encoder",
        "no probe runs on the token_only encoder",
        f"no WSD results ({tmp_path / 'probes' / 'wsd'}/)",
        f"no structural-probe results ({tmp_path / 'probes' / 'structural'}/)",
        "no learning-curve runs (<task>/<features>/<encoder>/seed<k>/fraction_<f>/)",
    ]


@pytest.mark.parametrize(
    ("tokens", "text"),
    [
        (0, "0"),
        (950, "950"),
        (19_200, "19.2k"),
        (20_000, "20k"),
        (999_960, "1M"),
        (1_234_567, "1.2M"),
        (7_680_000, "7.7M"),
        (5.5e9, "5.5B"),
    ],
)
def test_token_counts_read_at_every_size(tokens, text):
    assert token_count(tokens) == text


def test_the_pretraining_figure_counts_tokens_with_the_same_formatter():
    steps = np.array([20.0, 40.0, 60.0])
    curve = {
        "step": steps,
        "tokens": 320 * steps,
        "train_loss": np.array([9.0, 8.5, 8.2]),
        **{
            c: np.array([np.nan, 1400.0, 1275.3]) for c in ("val_ppl", "val_ppl_fwd", "val_ppl_bwd")
        },
    }
    figure = figures.learning_curves(Pretraining(Path("m.json"), {}, curve))
    for axis in figure.axes:
        assert axis.get_xlabel() == "training tokens"
        assert axis.xaxis.get_major_formatter()(19_200, 0) == "19.2k"
