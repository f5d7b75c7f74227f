"""Probe stage on features extracted from slices of the real data by tiny biLMs: the files the
report reads, the DVC cell command, a Hydra multirun, and bad input that writes nothing."""

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from fixtures.workspace import ONE_INSTANCE_EACH, SENTENCES, make_workspace
from omegaconf import DictConfig, OmegaConf

from elmolab.core.config import apply_overrides, feature_modes, load_params, section
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import ExtractConfig, GridConfig, ProbeSettings, TaskKind
from elmolab.data.catalogue import data_catalog
from elmolab.data.wsd import LEXICOGRAPHER_FILES
from elmolab.io.results import FeatureMode, without_timings
from elmolab.probing.cell_data import load_cell
from elmolab.probing.jobs import job_arithmetic, plan_jobs, training_subset
from elmolab.probing.metrics import span_f1_of_counts
from elmolab.probing.modes import CellModes
from elmolab.report.collect import read_probe_runs
from elmolab.stages.probe import probe_cell

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
# Few epochs and seeds; the slices of the data are small, so some dev and test labels are not in
# train: they are kept (as a smoke preset would) rather than an error.
FAST = ["probe.max_epochs=3", "probe.tree.max_epochs=2", "grid.seeds=[1,2]", "probe.unseen=keep"]
ENCODERS = ("trained", "random", "token_only")
RUN_KEYS = {
    "task",
    "features",
    "encoder",
    "seed",
    "metric",
    "dev",
    "test",
    "best_epoch",
    "epochs",
    "hit_epoch_cap",
    "mix_weights",
    "gamma",
    "wall_seconds",
    "precision",
    "n_train_tokens",
    "n_test_tokens",
    "per_sentence_test",
}


@pytest.fixture(scope="module")
def params(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A params.yaml (as DVC composes it) pointing at mini data and its extracted features."""
    root = tmp_path_factory.mktemp("probe")
    # sentiment2 (SST-2) is not a cell of the default grid: added as a user adds a task
    cfg = make_workspace(data_dir, root, *FAST, "+tasks@grid.tasks.sentiment2=sentiment2")
    path = root / "params.yaml"
    OmegaConf.save(cfg, path)
    return path


def _cell(params: Path, task: str, modes: list[str]) -> tuple[DictConfig, dict]:
    """The config of a DVC cell (one task), and the arguments of ``probe_cell`` for ``modes``."""
    cfg = load_params(params)
    apply_overrides(cfg, [f"task={task}"], params)
    probes = Path(cfg.paths.artifacts) / "probes"
    return cfg, {
        "task": section(cfg, "grid", GridConfig).task(cfg.task),
        "modes": modes,
        "catalog": data_catalog(section(cfg, "extract", ExtractConfig)),
        "settings": section(cfg, "probe", ProbeSettings),
        "seeds": list(cfg.grid.seeds),
        "cell_dir": probes / task,
    }


def test_each_kind_of_task_writes_the_runs_the_report_reads(params: Path) -> None:
    cells = [
        ("upos", ["scalar_mix"]),
        ("deplabel", ["layer1"]),
        ("deparc", ["layer1"]),
        ("structural", ["scalar_mix"]),
        ("upos_control", ["concat"]),
        ("ner", ["layer0"]),
        ("wsd", ["layer2", "scalar_mix"]),
    ]
    for task, modes in cells:
        _, arguments = _cell(params, task, modes)
        if task in ("upos", "upos_control"):
            arguments["task"].mdl = True  # experiment=information's setting
        probe_cell(**arguments)
    probes = Path(load_params(params).paths.artifacts) / "probes"
    runs = read_probe_runs(probes)
    # seeded cells x encoders x seeds; upos's conditional probe (layer0+scalar_mix, its task
    # has `conditional`) on every encoder and seed; wsd: 3 + 3 n/a
    assert len(runs) == 6 * 3 * 2 + 3 * 2 + 3 + 3

    upos = json.loads((probes / "upos/scalar_mix/random/seed2/metrics.json").read_text())

    # Information measures (`mdl` set on upos and upos_control here, both with `conditional`):
    # the conditional probe and the cross-entropy in bits of every full run; an online code per
    # mode, encoder and seed, whose blocks cover the training set once.
    conditioned = json.loads(
        (probes / "upos/layer0+scalar_mix/trained/seed1/metrics.json").read_text()
    )
    assert conditioned["features"] == "layer0+scalar_mix" and 0 < conditioned["test"] <= 1
    for run in ("upos/layer0+scalar_mix/trained/seed1", "upos/scalar_mix/random/seed2"):
        record = json.loads((probes / run / "metrics.json").read_text())
        assert record["dev_bits"] > 0 and record["test_bits"] > 0, run
        assert sum(record["per_sentence_test_bits"]) == pytest.approx(
            record["test_bits"] * record["n_test_tokens"], rel=1e-3
        )
    assert not list((probes / "upos_control").glob("layer0+*"))  # concat: nothing to condition
    assert "test_bits" not in json.loads(
        (probes / "ner/layer0/trained/seed1/metrics.json").read_text()
    )
    codes = sorted(probes.glob("*/*/*/seed*/online_code.json"))
    assert [c.relative_to(probes).parts[:3] for c in codes[::2]] == [
        ("upos", "scalar_mix", e) for e in ("random", "token_only", "trained")
    ] + [("upos_control", "concat", e) for e in ("random", "token_only", "trained")]
    code = json.loads((probes / "upos/scalar_mix/trained/seed1/online_code.json").read_text())
    assert code["fractions"][-1] == 1.0 and len(code["block_bits"]) == len(code["fractions"])
    assert sum(code["block_tokens"]) == upos["n_train_tokens"]
    assert code["uniform_bits"] == pytest.approx(
        upos["n_train_tokens"] * math.log2(code["labels"]), abs=0.01
    )
    assert code["block_bits"][0] == pytest.approx(
        code["block_tokens"][0] * math.log2(code["labels"]), abs=0.01
    )
    assert code["online_bits"] == pytest.approx(sum(code["block_bits"]), abs=0.1)
    assert code["compression"] == pytest.approx(
        code["uniform_bits"] / code["online_bits"], rel=1e-4
    )

    # The token-layer control's layer 0 is the trained biLM's: its runs are the trained ones.
    for run_dir in ("seed1", "seed2/fraction_0.1"):
        trained, control = (
            json.loads((probes / f"ner/layer0/{e}/{run_dir}/metrics.json").read_text())
            for e in ("trained", "token_only")
        )
        assert control == {**trained, "encoder": "token_only", "same_features_as": "trained"}
    random = json.loads((probes / "ner/layer0/random/seed1/metrics.json").read_text())
    assert "same_features_as" not in random
    # Span F1's chunk counts per test sentence give back each run's test F1, the same float
    # (and 2 tp / (pred + gold), the same number): any resample of sentences can be scored.
    spans_runs = sorted(probes.glob("ner/layer0/*/seed*/**/metrics.json"))
    assert len(spans_runs) >= 3 * 2  # encoders x seeds, and their learning-curve runs
    for path in spans_runs:
        record = json.loads(path.read_text())
        spans = record["per_sentence_test_spans"]
        sentences = (path.parent / "test_predictions.txt").read_text().splitlines()
        assert [len(spans[k]) for k in ("tp", "pred", "gold")] == [len(sentences)] * 3, path
        tp, pred, gold = (sum(spans[k]) for k in ("tp", "pred", "gold"))
        assert span_f1_of_counts(tp, pred, gold) == record["test"], path
        assert 2 * tp / (pred + gold) == pytest.approx(record["test"], rel=1e-12), path
    assert "per_sentence_test_spans" not in upos

    assert upos.keys() >= RUN_KEYS
    assert (upos["task"], upos["features"], upos["encoder"], upos["seed"]) == (
        "upos",
        "scalar_mix",
        "random",
        2,
    )
    assert upos["metric"] == "accuracy" and 0 < upos["test"] <= 1
    assert len(upos["mix_weights"]) == 3 and sum(upos["mix_weights"]) == pytest.approx(1)
    assert sum(upos["per_sentence_test"]["total"]) == upos["n_test_tokens"]
    predictions = (probes / "upos/scalar_mix/random/seed2/test_predictions.txt").read_text()
    assert len(predictions.splitlines()) == len(upos["per_sentence_test"]["total"])
    assert (upos["train_fraction"], upos["n_train_sentences"]) == (1.0, SENTENCES)

    # Learning curves of token tasks: nested subsets of the training sentences, every encoder
    # and seed, and the same sentences for all of them.
    for fraction in (0.01, 0.1):
        point = probes / f"upos/scalar_mix/token_only/seed1/fraction_{fraction}"
        subset = json.loads((point / "metrics.json").read_text())
        assert subset["train_fraction"] == fraction and subset["seed"] == 1
        assert subset["n_train_sentences"] == math.ceil(fraction * SENTENCES)
        assert subset["n_test_tokens"] == upos["n_test_tokens"] and 0 <= subset["test"] <= 1
        assert subset["epochs"] >= 1 and (point / "test_predictions.txt").is_file()
    assert (probes / "upos_control/concat/random/seed2/fraction_0.1/metrics.json").is_file()
    assert not list((probes / "deplabel").glob("*/*/*/fraction_*"))  # token tasks only

    deparc = json.loads((probes / "deparc/layer1/token_only/seed2/metrics.json").read_text())
    assert (deparc["metric"], deparc["mix_weights"]) == ("uas", [0.0, 1.0, 0.0])
    assert 0 < deparc["test"] <= 1 and deparc["n_test_tokens"] == upos["n_test_tokens"]
    assert sum(deparc["per_sentence_test"]["total"]) == deparc["n_test_tokens"]
    structural = json.loads(
        (probes / "structural/scalar_mix/trained/seed1/metrics.json").read_text()
    )
    assert structural["metric"] == "uuas" and 0 <= structural["test"] <= 1
    assert -1 <= structural["test_dspr"] <= 1 and -1 <= structural["dev_dspr"] <= 1
    assert len(structural["mix_weights"]) == 3
    # each test sentence's recovered and counted gold edges: their sums give back test, the same
    # float, so a resample of sentences is scored as the run is
    edges = structural["per_sentence_test"]
    assert len(edges["correct"]) == len(edges["total"]) and sum(edges["total"]) > 0
    assert sum(edges["correct"]) / sum(edges["total"]) == structural["test"]

    deplabel = json.loads((probes / "deplabel/layer1/trained/seed1/metrics.json").read_text())
    assert deplabel["mix_weights"] == [0.0, 1.0, 0.0] and deplabel["n_train_tokens"] > 1000
    control = json.loads((probes / "upos_control/concat/trained/seed1/metrics.json").read_text())
    assert control["mix_weights"] is None and control["metric"] == "accuracy"

    wsd = json.loads((probes / "wsd/layer2/trained/metrics.json").read_text())
    assert (wsd["seed"], wsd["metric"]) == (None, "f1") and 0 < wsd["test"] <= 1
    assert wsd["n_test_instances"] == len(
        (probes / "wsd/layer2/trained/test_predictions.txt").read_text().splitlines()
    )
    counts = wsd["per_sentence_test"]  # recall's counts, for the report's paired bootstrap
    assert sum(counts["total"]) == wsd["n_test_instances"]
    assert sum(counts["correct"]) / sum(counts["total"]) == pytest.approx(wsd["recall"])
    # the first-sense baseline reads no features: the same in every encoder's and mode's file
    random = json.loads((probes / "wsd/layer2/random/metrics.json").read_text())
    assert 0 < wsd["test_first_sense"] <= 1 and 0 < wsd["dev_first_sense"] <= 1
    assert (random["dev_first_sense"], random["test_first_sense"]) == (
        wsd["dev_first_sense"],
        wsd["test_first_sense"],
    )
    not_applicable = json.loads((probes / "wsd/scalar_mix/random/metrics.json").read_text())
    assert not_applicable["applicable"] is False and not_applicable["seed"] is None


def test_supersense_probes_the_wsd_features_of_the_tagged_words(params: Path) -> None:
    """The supersense cell reads the features the WSD datasets' extraction wrote (one vector per
    sense-tagged word), scores accuracy over those words, and records the words whose gold keys
    lie in several lexicographer files."""
    _, arguments = _cell(params, "supersense", ["layer1"])
    probe_cell(**arguments)
    record = json.loads(
        (arguments["cell_dir"] / "layer1" / "trained" / "seed1" / "metrics.json").read_text()
    )
    assert record["metric"] == "accuracy" and 0 <= record["test"] <= 1
    source = arguments["catalog"].read("raganato_eval", "ALL")
    assert record["n_test_tokens"] == sum(len(s.instances) for s in source.wsd_sentences())
    several = [f"n_{role}_instances_in_several_supersenses" for role in ("train", "dev", "test")]
    assert all(record[key] >= 0 for key in several)
    predictions = arguments["cell_dir"] / "layer1" / "trained" / "seed1" / "test_predictions.txt"
    lines = predictions.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(source.sentences)
    assert {tag for line in lines for tag in line.split()} <= set(LEXICOGRAPHER_FILES)


def test_the_dvc_cell_command_runs_each_encoders_modes_and_every_seed(params: Path) -> None:
    """The trained biLM runs every mode of the grid; a control's instance (random, token_only)
    ``probe.control_features`` (scalar_mix) and, chunk being conditional, layer 0 and layer 0
    beside the mix; its learning curves the mix alone. token_only's layer 0 is copied from the
    trained biLM's (the same token layer)."""
    command = [sys.executable, "pipelines/probe.py", "--params", str(params)]
    modes = ["layer0", "mean", "scalar_mix"]
    proc = subprocess.run(
        [*command, "task=chunk", f"grid.features=[{','.join(modes)}]"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "precision" not in proc.stderr  # the same on every cell: in metrics.json, not the log
    cell = Path(load_params(params).paths.artifacts) / "probes" / "chunk"
    runs = {
        "trained": [*modes, "layer0+scalar_mix"],
        "random": ["layer0", "scalar_mix", "layer0+scalar_mix"],
        "token_only": ["layer0", "scalar_mix", "layer0+scalar_mix"],
    }
    found = sorted(str(p.relative_to(cell)) for p in cell.glob("*/*/*/metrics.json"))
    assert found == sorted(
        f"{m}/{e}/seed{k}/metrics.json" for e, ms in runs.items() for m in ms for k in (1, 2)
    )
    curves = {(p.parts[-5], p.parts[-4]) for p in cell.glob("*/*/*/fraction_*/metrics.json")}
    assert curves == {("layer0", "trained"), ("mean", "trained"), ("scalar_mix", "trained")} | {
        ("scalar_mix", e) for e in ("random", "token_only")
    }
    copied = json.loads((cell / "layer0" / "token_only" / "seed1" / "metrics.json").read_text())
    assert copied["same_features_as"] == "trained"
    metrics = json.loads((cell / "mean" / "trained" / "seed1" / "metrics.json").read_text())
    assert metrics["metric"] == "span_f1" and metrics["per_sentence_test"] is None
    assert 0 <= metrics["test_untyped_f1"] <= 1 and metrics["hit_epoch_cap"] in (True, False)
    # chunk measures information: its bits per sentence come with the sentences' tokens
    tokens = metrics["per_sentence_test_tokens"]
    assert len(tokens) == len(metrics["per_sentence_test_bits"])
    assert sum(tokens) == metrics["n_test_tokens"]


def test_a_dvc_cell_names_a_task_of_the_grid(params: Path) -> None:
    """A task lives in ``grid.tasks`` only: a cell names one of them, and anything else is an
    error listing them."""
    command = [sys.executable, "pipelines/probe.py", "--params", str(params), "task=nope"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: task 'nope' is not one of grid.tasks (upos, "), last


@pytest.mark.parametrize("launcher", ["basic", "local_pair"])
def test_a_hydra_multirun_writes_one_result_per_job(
    params: Path, tmp_path: Path, launcher: str
) -> None:
    cfg = load_params(params)
    proc = subprocess.run(
        [
            sys.executable,
            "pipelines/probe.py",
            "-m",
            f"hydra/launcher={launcher}",  # local_pair: joblib, two jobs at a time
            "probe.workers=1",
            "task=ner",
            "probe.unseen=keep",
            "features=layer2,scalar_mix",
            "seed=3",
            *ONE_INSTANCE_EACH,
            f"paths.data={cfg.paths.data}",
            f"paths.artifacts={cfg.paths.artifacts}",
            "probe.max_epochs=2",
            "probe.train_fractions=[]",  # no learning curves
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("*/probes/**/metrics.json"))
    assert found == [
        f"{job}/probes/ner/{features}/{encoder}/seed3/metrics.json"
        for job, features, encoders in ((0, "layer2", ["trained"]), (1, "scalar_mix", ENCODERS))
        for encoder in sorted(encoders)
    ]  # a control's instance runs the mix alone


def test_sentence_cells_pool_each_sentence_and_record_the_majority_baseline(
    params: Path, tmp_path: Path
) -> None:
    """SST-5 and SST-2 (label_map) cells on the mini SST: one item per (kept) sentence, every
    encoder and seed, the majority baseline of the labels each cell keeps, runs the report reads."""
    counts = {}
    for task in ("sentiment", "sentiment2"):
        _, arguments = _cell(params, task, ["layer1", "scalar_mix"])
        arguments["cell_dir"] = tmp_path / "probes" / task
        runs = probe_cell(**arguments)
        assert len(runs) == 2 * 3 * 2  # modes x encoders x seeds
        source = arguments["catalog"].read("sst", "test")
        counts[task] = Counter(s.sentiment for s in source.sentences)
        for run in runs:
            folder = arguments["cell_dir"] / run["features"] / run["encoder"] / f"seed{run['seed']}"
            stored = json.loads((folder / "metrics.json").read_text())
            assert stored == run and run["metric"] == "accuracy"
            total = run["per_sentence_test"]["total"]
            assert total == [1] * run["n_test_tokens"]
            assert sum(run["per_sentence_test"]["correct"]) / len(total) == pytest.approx(
                run["test"]
            )
            predictions = (folder / "test_predictions.txt").read_text().splitlines()
            assert len(predictions) == len(total)
        test = counts[task]
        if task == "sentiment":
            expected = test
        else:  # SST-2: no neutral sentence, 0-1 and 3-4 merged
            expected = {"negative": test["0"] + test["1"], "positive": test["3"] + test["4"]}
        assert run["n_test_tokens"] == sum(expected.values())
        label = run["majority_label"]
        assert run["test_majority_baseline"] == pytest.approx(
            expected[label] / sum(expected.values())
        )
        train = Counter(s.sentiment for s in arguments["catalog"].read("sst", "train").sentences)
        if task == "sentiment":
            assert label == max(sorted(train), key=train.__getitem__)
    assert len(read_probe_runs(tmp_path / "probes")) == 2 * 2 * 3 * 2


def test_a_sentence_label_missing_from_the_label_map_names_the_file_and_line(
    params: Path, tmp_path: Path
) -> None:
    _, arguments = _cell(params, "sentiment2", ["layer1"])
    del arguments["task"].label_map["3"]
    path = arguments["catalog"].datasets["sst"].splits["train"]
    line = 1 + next(
        i
        for i, s in enumerate(arguments["catalog"].read("sst", "train").sentences)
        if s.sentiment == "3"
    )
    arguments["cell_dir"] = tmp_path / "cell"
    with pytest.raises(
        ElmolabError, match=rf"{path}:{line}: label '3' is not a key of task.label_map"
    ):
        probe_cell(**arguments)
    assert not arguments["cell_dir"].exists()


def test_a_dev_label_never_seen_in_train_names_the_file_and_line(
    params: Path, tmp_path: Path
) -> None:
    _, arguments = _cell(params, "upos", ["layer1"])
    arguments["settings"].unseen = None  # the task's own setting: raise
    dev = Path(arguments["catalog"].datasets["ud_english_ewt"].splits["dev"])
    lines = dev.read_text(encoding="utf-8").splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines, 1) if line[:1].isdigit() and "\tNOUN\t" in line)
    lines[number - 1] = lines[number - 1].replace("\tNOUN\t", "\tNOVEL\t")
    relabelled = tmp_path / "dev.conllu"
    relabelled.write_text("".join(lines), encoding="utf-8")
    arguments["catalog"].datasets["ud_english_ewt"].splits["dev"] = str(relabelled)
    arguments["cell_dir"] = tmp_path / "cell"
    with pytest.raises(ElmolabError, match=rf"{relabelled}:{number}: label 'NOVEL' never occurs"):
        probe_cell(**arguments)
    assert not arguments["cell_dir"].exists()


def test_a_sense_key_missing_from_wordnet_names_the_file_and_line(
    params: Path, tmp_path: Path
) -> None:
    _, arguments = _cell(params, "wsd", ["layer1"])
    wordnet = Path(arguments["task"].wordnet)
    semcor = arguments["catalog"].datasets["semcor30"].splits["train"]
    index = wordnet.read_text(encoding="utf-8").splitlines(keepends=True)
    smaller = tmp_path / "index.sense"
    smaller.write_text("".join(line for line in index if not line.startswith("say%2:32:00::")))
    arguments["task"].wordnet = str(smaller)
    arguments["cell_dir"] = tmp_path / "cell"
    with pytest.raises(ElmolabError, match=rf"{semcor}:\d+: sense key 'say%2:32:00::' is not in"):
        probe_cell(**arguments)
    assert not arguments["cell_dir"].exists()


def test_features_of_other_data_fail_the_cell_and_write_nothing(
    params: Path, tmp_path: Path
) -> None:
    _, arguments = _cell(params, "xpos", ["layer0"])
    features = tmp_path / "features"
    shutil.copytree(arguments["settings"].features_dir, features)
    sidecar = features / "random" / "ud_english_ewt" / "dev.tokens.txt"
    lines = sidecar.read_text(encoding="utf-8").splitlines()
    sidecar.write_text("\n".join([*lines[:4], lines[4] + " extra", *lines[5:]]) + "\n")
    arguments["settings"].features_dir = str(features)
    arguments["cell_dir"] = tmp_path / "cell"
    with pytest.raises(ElmolabError, match=rf"{sidecar}:5: \d+ tokens, but sentence 5 of"):
        probe_cell(**arguments)  # read before any run: the other encoders' features are fine
    assert not arguments["cell_dir"].exists()


def test_encoders_in_worker_processes_give_the_same_results_as_in_one(
    params: Path, tmp_path: Path
) -> None:
    outcomes = {}
    for workers in (1, 2):
        _, arguments = _cell(params, "chunk", ["scalar_mix"])
        arguments["task"].mdl = True  # experiment=information's setting
        arguments["settings"].workers = workers
        arguments["cell_dir"] = tmp_path / f"workers{workers}"
        runs = probe_cell(**arguments)
        codes = sorted(arguments["cell_dir"].glob("*/*/*/online_code.json"))
        # the results without timings and peak memory, which differ between processes
        outcomes[workers] = without_timings(
            [*runs, *(json.loads(code.read_text()) for code in codes)]
        )
    # chunk has `conditional` and `mdl`: the conditional probe's runs follow, then the online
    # codes (one per encoder and seed)
    assert [
        (r["features"], r["encoder"], r["seed"], r.get("train_fraction")) for r in outcomes[2]
    ] == [
        ("scalar_mix", encoder, seed, fraction)
        for encoder in ENCODERS
        for seed in (1, 2)
        for fraction in (1.0, 0.1, 0.01)
    ] + [("layer0+scalar_mix", encoder, seed, 1.0) for encoder in ENCODERS for seed in (1, 2)] + [
        ("scalar_mix", encoder, seed, None) for encoder in sorted(ENCODERS) for seed in (1, 2)
    ]
    assert outcomes[1] == outcomes[2]


def test_the_slurm_launcher_submits_one_task_per_gpu_of_every_node() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "pipelines/pretrain.py",
            "hydra/launcher=slurm_gpu",
            "trainer=gpu_slurm",
            "trainer.devices=4",
            "trainer.num_nodes=3",
            "--cfg=all",
            "--resolve",
            "--package=hydra.launcher",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    launcher = yaml.safe_load(proc.stdout)
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert (launcher["nodes"], launcher["tasks_per_node"], launcher["gpus_per_node"]) == (3, 4, 4)


def test_learning_curve_subsets_are_fixed_nested_and_in_corpus_order(params: Path) -> None:
    settings = section(load_params(params), "probe", ProbeSettings)
    small, large = (training_subset(12544, f, settings) for f in (0.01, 0.1))
    assert (len(small), len(large)) == (126, 1255)
    assert set(small) <= set(large) and small == sorted(small) and large == sorted(large)
    assert training_subset(12544, 0.01, settings) == small  # no hidden state
    settings.subset_seed += 1
    assert training_subset(12544, 0.01, settings) != small
    with pytest.raises(ElmolabError, match=r"train_fractions: 1.5 is not in \(0, 1\]"):
        training_subset(100, 1.5, settings)


@pytest.mark.parametrize("task", ["upos", "deparc"])
def test_cells_read_features_standardized_by_their_train_split_unless_turned_off(
    params: Path, task: str
) -> None:
    """... in their stored type (float16), but a tree task's in the type its probes read (each
    job would convert them on its own)."""
    _, cell = _cell(params, task, [])
    settings = dataclasses.replace(cell["settings"], encoders=["random"], precision="32-true")
    assert settings.standardize  # the default
    spec = dataclasses.replace(cell["task"], unseen=settings.unseen)  # as resolve_cell does
    standardized = load_cell(spec, settings, cell["catalog"]).splits
    raw = load_cell(spec, dataclasses.replace(settings, standardize=False), cell["catalog"]).splits
    train = raw["random"]["train"].features.float()
    mean, std = train.mean(1, keepdim=True), train.std(1, keepdim=True)
    assert float(std.min()) > 0
    stored = torch.float32 if task == "deparc" else torch.float16
    for role in ("train", "dev", "test"):
        features = standardized["random"][role].features
        assert features.dtype == raw["random"][role].features.dtype == stored
        expected = (raw["random"][role].features.float() - mean) / std
        torch.testing.assert_close(features.float(), expected, atol=5e-3, rtol=5e-3)
    bf16 = dataclasses.replace(settings, precision="bf16-mixed")
    read = load_cell(spec, bf16, cell["catalog"]).splits
    for role in ("train", "dev", "test"):
        features = read["random"][role].features
        assert features.dtype == (torch.bfloat16 if task == "deparc" else torch.float16)
        torch.testing.assert_close(
            features, standardized["random"][role].features.to(features.dtype), atol=0, rtol=0
        )


@pytest.mark.parametrize("kind", [TaskKind.PAIR, TaskKind.ARC, TaskKind.STRUCTURAL])
def test_pair_and_tree_cells_split_fits_by_seed_and_concatenation_largest_first(
    kind: TaskKind,
) -> None:
    """Every head of the grid is planned once (the twin's layer 0 not at all), each job holds
    one encoder and seed and either the concatenation alone or the other modes, and the jobs come
    by arithmetic, the largest first (workers take them in that order)."""
    from conftest import default_probe_settings

    modes = ["layer0", "layer1", "layer2", "mean", "scalar_mix", "concat"]
    settings = default_probe_settings()
    twins = {"token_only": "trained"}
    cell_modes = CellModes.resolve(modes, settings.encoders)
    jobs = plan_jobs(
        kind, cell_modes, [1, 2, 3], settings, twins, num_layers=3, train_sentences=100
    )
    planned = [(job.encoder, head.seed, head.features) for job in jobs for head in job.heads]
    expected = [
        (encoder, seed, mode)
        for encoder in settings.encoders
        for seed in (1, 2, 3)
        for mode in modes
        if not (encoder == "token_only" and mode == "layer0")
    ]
    assert sorted(planned) == sorted(expected)
    assert len(jobs) == 2 * len(settings.encoders) * 3
    for job in jobs:
        assert len({head.seed for head in job.heads}) == 1
        concat = {head.mode is FeatureMode.CONCAT for head in job.heads}
        assert (concat == {True} and len(job.heads) == 1) or concat == {False}
    costs = [job_arithmetic(kind, job, 3) for job in jobs]
    assert costs == sorted(costs, reverse=True)
    # the arc probe's concatenation (a bilinear map 3 layers wide: 9 units) outweighs the other
    # five modes together; a pair or structural probe's (3 units) does not
    assert (jobs[0].heads[0].mode is FeatureMode.CONCAT) == (kind is TaskKind.ARC)


def test_feature_modes_read_the_grids_files_and_name_a_missing_one(tmp_path: Path) -> None:
    assert feature_modes(CONF, ["layer2", "scalar_mix", "concat"]) == [
        "layer2",
        "scalar_mix",
        "concat",
    ]
    (tmp_path / "features").mkdir()
    (tmp_path / "features" / "top.yaml").write_text("mode: layer2\n")
    assert feature_modes(tmp_path, ["top"]) == ["layer2"]
    with pytest.raises(ElmolabError, match=r"grid.features: no .*layer9.yaml \(choices: top\)"):
        feature_modes(tmp_path, ["top", "layer9"])
