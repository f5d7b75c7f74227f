"""The task-model stage: the BiLSTM-CRF tagger learns (real Lightning), the stage runs end to end
on tiny extracted features (real HDF5) with its error reductions computed right, and a feature
file that does not match the labels fails with one line."""

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmolab.core.config import section
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import SPLIT_ROLES, ExtractConfig, GridConfig, TaskConfig, TaskModelConfig
from elmolab.data.catalogue import data_catalog
from elmolab.data.labels import LabelVocabulary
from elmolab.elmo import batch_to_ids
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.probing.metrics import span_f1_of_counts
from elmolab.report.significance import adjust, compare
from elmolab.taskmodel.data import PadBatch, TaggingSplit, WordVocabulary
from elmolab.taskmodel.model import BiLstmCrfTagger, FineTunedLayers, TaggerShape
from elmolab.taskmodel.runs import (
    TaskData,
    fine_tuned_encoder,
    input_splits,
    load_task_data,
    run_scores,
    run_taskmodel,
    summarize,
    summary_inputs,
    tagging_task,
    train_one,
)
from tests.conftest import expect_error
from tests.fixtures.report.fake_artifacts import task_model_runs
from tests.fixtures.workspace import FIXTURE_OPTIONS, make_workspace

TAGS = ["B-X", "I-X", "O"]
TOY = TaskConfig(
    name="toy", kind="token", train="toy/train", dev="toy/dev", test="toy/test", field="tags",
    metric="span_f1", unseen="raise", control_seed=None, wordnet=None, family="semantic",
)  # fmt: skip


def _synthetic(sentences: int, seed: int, signal_in_layers: bool) -> TaggingSplit:
    """IOB2 tags of random spans; each token's tag one-hot times 4 (plus unit noise) in 8
    dimensions of either the context-free vector or layer 2 of three layers (the others noise)."""
    rng = np.random.default_rng(seed)
    tags, lengths = [], []
    for _ in range(sentences):
        n = int(rng.integers(3, 12))
        sentence, inside = [], False
        for _ in range(n):
            draw = rng.random()
            tag = "O" if draw < 0.5 else "B-X" if draw < 0.75 or not inside else "I-X"
            inside = tag != "O"
            sentence.append(TAGS.index(tag))
        tags += sentence
        lengths.append(n)
    ids = torch.tensor(tags)
    signal = torch.nn.functional.one_hot(ids, 8).float() * 4  # (tokens, 8)
    noise = torch.from_numpy(rng.normal(size=(4, len(tags), 8))).float()  # (4, tokens, 8)
    layers = noise[1:].clone()
    token = noise[0]
    if signal_in_layers:
        layers[2] += signal
    else:
        token = token + signal
    return TaggingSplit(
        token, layers, torch.zeros(len(tags), dtype=torch.int64), ids, tuple(lengths)
    )


def _config(**changes) -> TaskModelConfig:
    values = dict(
        task="toy", unseen=None, features_dir="", token_encoder="trained", mix_encoders=[],
        seeds=[1], control_seeds=[1], max_epochs=10, patience=10, batch_size=16,
        eval_batch_size=64, lr=0.01, mix_lr=0.05, l2_lambda=0.0, word_dim=0, min_word_count=1,
        hidden_dim=16, lstm_layers=1, dropout=0.0, gradient_clip=5.0, standardize=False,
        num_threads=1, workers=1, finetune_encoders=[], finetune_lr=3e-4, bootstrap_samples=500,
        bootstrap_seed=0,
    )  # fmt: skip
    values.update(changes)
    return TaskModelConfig(**values)


def test_the_tagger_learns_a_tagging_task_through_the_elmo_mix() -> None:
    data = TaskData(TOY, {}, LabelVocabulary(TAGS), {}, WordVocabulary([], 1), {}, {})
    config = _config()
    sizes = {"train": (300, 1), "dev": (60, 2), "test": (60, 3)}
    with_mix = {role: _synthetic(n, seed, True) for role, (n, seed) in sizes.items()}
    result, predicted = train_one(config, data, with_mix, seed=1, label="elmo_toy/seed1")
    assert result["test_f1"] > 95.0, result
    assert len(predicted) == 60 and [len(p) for p in predicted] == list(
        with_mix["test"].sentence_lengths
    )
    weights = result["mix_weights"]
    assert weights is not None and weights[2] == max(weights)  # the mix found the signal's layer
    # The same tags without the layers: the context-free vector is noise, so no span is learned.
    baseline = {
        role: TaggingSplit(s.token, None, s.words, s.tags, s.sentence_lengths)
        for role, s in with_mix.items()
    }
    result, _ = train_one(config, data, baseline, seed=1, label="baseline/seed1")
    assert result["test_f1"] < 60.0 and result["mix_weights"] is None


def test_a_run_drops_lightnings_litlogger_tip_and_keeps_its_other_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = TaskData(TOY, {}, LabelVocabulary(TAGS), {}, WordVocabulary([], 1), {}, {})
    splits = {role: _synthetic(40, seed, False) for seed, role in enumerate(SPLIT_ROLES)}
    lightning = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    lightning.addHandler(caplog.handler)  # Lightning's loggers may not propagate to the root
    try:
        with caplog.at_level(logging.INFO, logger=lightning.name):
            train_one(_config(max_epochs=1), data, splits, seed=1, label="elmo_toy/seed1")
    finally:
        lightning.removeHandler(caplog.handler)
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("GPU available") for m in messages), messages
    assert not any("litlogger" in m for m in messages), messages


def test_a_run_stops_by_patience_long_before_its_epoch_cap() -> None:
    """Early stopping on dev F1: a task learned in a few epochs stops ``patience`` epochs after
    its best, scored at that best epoch, and is not counted as hitting the cap."""
    data = TaskData(TOY, {}, LabelVocabulary(TAGS), {}, WordVocabulary([], 1), {}, {})
    splits = {role: _synthetic(120, seed, False) for seed, role in enumerate(SPLIT_ROLES)}
    config = _config(max_epochs=60, patience=2, lr=0.05)
    result, _ = train_one(config, data, splits, seed=1, label="baseline/seed1")
    assert result["epochs"] < 60 and not result["hit_epoch_cap"], result["history"]
    assert result["epochs"] == result["best_epoch"] + 2 == len(result["history"])
    assert result["dev_f1"] == max(e["dev_f1"] for e in result["history"])
    capped, _ = train_one(_config(max_epochs=2), data, splits, seed=1, label="baseline/seed1")
    assert capped["epochs"] == 2 and capped["hit_epoch_cap"]


def test_the_summary_tests_each_input_against_the_baseline_holm_adjusted() -> None:
    """A synthetic study with a known effect: +5 F1 points for elmo_trained, none for
    elmo_random (5 seeds each, 3,000 test sentences)."""
    runs = task_model_runs(
        {"baseline": [80.0] * 5, "elmo_trained": [85.0] * 5, "elmo_random": [80.0] * 5}
    )
    pooled = {name: [name] for name in ("baseline", "elmo_trained", "elmo_random")}
    summary = summarize(runs, pooled, max_epochs=20, samples=1000)
    f1 = {name: row["test_f1"] for name, row in summary["inputs"].items()}
    base = np.mean(f1["baseline"])
    trained, random = summary["vs_baseline"]["elmo_trained"], summary["vs_baseline"]["elmo_random"]
    assert trained["effect"] == pytest.approx(np.mean(f1["elmo_trained"]) - base)
    assert trained["low"] < 5.0 < trained["high"] and trained["low"] > 3.0
    assert trained["p_adjusted"] < 0.001 and trained["detectable"] < 2.0
    assert trained["relative"] == pytest.approx(trained["effect"] / (100 - base))
    assert random["low"] < 0.0 < random["high"] and random["p_value"] > 0.05
    assert [trained["p_adjusted"], random["p_adjusted"]] == pytest.approx(
        adjust([trained["p_value"], random["p_value"]], "holm")
    )
    assert "two-level bootstrap (1000 resamples of each side's units (5 and 5)" in trained["method"]
    assert summary["family"] == {
        "name": "task model: input vs baseline",
        "tests": 2,
        "correction": "holm",
    }
    row = summary["inputs"]["elmo_trained"]
    assert row["seeds"] == [1, 2, 3, 4, 5] and row["units"] == 5 and "instances" not in row
    assert row["std"] == pytest.approx(np.std(f1["elmo_trained"], ddof=1))
    epochs = [r["epochs"] for r in runs if r["input"] == "elmo_trained"]
    assert row["epochs"] == {"min": min(epochs), "mean": np.mean(epochs), "max": max(epochs)}
    assert (summary["runs"], summary["hit_epoch_cap"], summary["max_epochs"]) == (15, 0, 20)


def test_a_control_is_one_input_its_runs_grouped_by_instance() -> None:
    """Three instances of the random control, two seeds each, pool into elmo_random: six runs
    whose bootstrap draws instances first, as significance.compare does with their groups."""
    instances = ["elmo_random", "elmo_random_2", "elmo_random_3"]
    targets = {"baseline": [80.0] * 5, "elmo_trained": [82.0] * 5}
    targets.update((name, [80.0 + i, 80.0 + i]) for i, name in enumerate(instances))
    runs = task_model_runs(targets)
    controls = {"random": {"random": 1, "random_2": 2, "random_3": 3}}
    pooled = summary_inputs(["baseline", "elmo_trained", *instances], controls)
    assert pooled == {
        "baseline": ["baseline"],
        "elmo_trained": ["elmo_trained"],
        "elmo_random": instances,
    }
    summary = summarize(runs, pooled, max_epochs=20, samples=500)
    row = summary["inputs"]["elmo_random"]
    assert (row["instances"], row["seeds"], row["units"]) == (instances, [1, 2], 6)
    grouped = [r for name in instances for r in runs if r["input"] == name]
    assert row["test_f1"] == [r["test_f1"] for r in grouped]
    scores = run_scores(grouped)
    assert scores.groups == tuple(r["input"] for r in grouped)
    expected = compare(
        run_scores([r for r in runs if r["input"] == "baseline"]),
        scores,
        paired=False,
        samples=500,
        seed=0,
    )
    versus = summary["vs_baseline"]["elmo_random"]
    assert (versus["low"], versus["p_value"]) == (100 * expected.low, expected.p_value)
    assert "groups first (5 and 3)" in versus["method"]
    assert summary["family"]["tests"] == 2


def test_controls_that_share_an_instance_or_a_name_are_rejected() -> None:
    inputs = ["baseline", "elmo_trained", "elmo_random", "elmo_random_2"]
    with pytest.raises(ElmolabError, match=r"controls\.again: 'random' is already an instance"):
        summary_inputs(inputs, {"random": {"random": 1}, "again": {"random": 2}})
    with pytest.raises(ElmolabError, match=r"controls\.trained: its pooled input elmo_trained"):
        summary_inputs(inputs, {"trained": {"random": 1, "random_2": 2}})
    assert summary_inputs(inputs, {}) == {name: [name] for name in inputs}
    one = summary_inputs(inputs[:3], {"token_layer": {"random": 1, "token_only": 2}})
    assert one == {name: [name] for name in inputs[:3]}  # one instance: nothing to pool


@pytest.fixture(scope="module")
def workspace(data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("taskmodel")
    overrides = [
        "extract.dataset=conll2003",
        "taskmodel.seeds=[1,2]",
        "taskmodel.max_epochs=2",
        "taskmodel.hidden_dim=8",
        "taskmodel.word_dim=4",
        "taskmodel.num_threads=1",
        "taskmodel.unseen=keep",
        "taskmodel.mix_encoders=[trained,random,token_only]",  # the instances the workspace has
    ]
    return root, make_workspace(data_dir, root, *overrides)


def _task(cfg, config: TaskModelConfig) -> TaskConfig:
    """The task model's task in the composed config ``cfg``."""
    return tagging_task(config, section(cfg, "grid", GridConfig).tasks)


def test_the_task_is_a_span_f1_token_task_of_the_grid_with_the_task_models_unseen(workspace):
    _, cfg = workspace
    tasks = section(cfg, "grid", GridConfig).tasks
    config = section(cfg, "taskmodel", TaskModelConfig)
    task = tagging_task(config, tasks)
    assert task == dataclasses.replace(tasks["ner"], unseen="keep")  # taskmodel.unseen=keep
    assert tagging_task(dataclasses.replace(config, unseen=None), tasks) == tasks["ner"]
    with pytest.raises(ElmolabError, match=r"taskmodel\.task: 'nope' is not a task of grid\.tasks"):
        tagging_task(dataclasses.replace(config, task="nope"), tasks)
    with pytest.raises(ElmolabError, match="'upos' is a token task scored by accuracy"):
        tagging_task(dataclasses.replace(config, task="upos"), tasks)


def test_the_stage_writes_every_run_and_the_summary(workspace) -> None:
    """Every run's record, its test predictions and per-sentence chunk counts (which sum back to
    its test F1 exactly), and the summary that tests each input against the baseline."""
    root, cfg = workspace
    config = section(cfg, "taskmodel", TaskModelConfig)
    out = root / "artifacts" / "taskmodel"
    run_taskmodel(
        config, _task(cfg, config), data_catalog(section(cfg, "extract", ExtractConfig)), out
    )
    summary = json.loads((out / "metrics.json").read_text())
    inputs = ["baseline", "elmo_trained", "elmo_random", "elmo_token_only"]
    assert list(summary["inputs"]) == inputs and list(summary["vs_baseline"]) == inputs[1:]
    test_sentences = len((root / "data/probing/conll2003/eng.testb").read_text().split("\n\n"))
    runs = {}
    for name in inputs:
        for seed in (1, 2):
            run = json.loads((out / name / f"seed{seed}" / "metrics.json").read_text())
            assert (run["input"], run["seed"], run["epochs"]) == (name, seed, 2)
            assert run["hit_epoch_cap"]  # taskmodel.max_epochs=2
            assert (run["task"], run["metric"]) == ("ner_conll2003", "span_f1")
            assert (run["mix_weights"] is None) == (name == "baseline")
            lines = (out / name / f"seed{seed}" / "test_predictions.txt").read_text().splitlines()
            assert 0 < len(lines) <= test_sentences
            spans = run["per_sentence_test_spans"]
            assert len(spans["tp"]) == len(spans["pred"]) == len(spans["gold"]) == len(lines)
            sums = (sum(spans["tp"]), sum(spans["pred"]), sum(spans["gold"]))
            assert 100 * span_f1_of_counts(*sums) == run["test_f1"]
            runs[name, seed] = run["test_f1"]
    for name in inputs[1:]:
        base, mine = [runs["baseline", s] for s in (1, 2)], [runs[name, s] for s in (1, 2)]
        versus = summary["vs_baseline"][name]
        assert summary["inputs"][name]["mean"] == pytest.approx(np.mean(mine))
        assert summary["inputs"][name]["std"] == pytest.approx(np.std(mine, ddof=1))
        assert versus["effect"] == pytest.approx(np.mean(mine) - np.mean(base))
        assert versus["relative"] == pytest.approx(versus["effect"] / (100 - np.mean(base)))
        assert versus["low"] <= versus["effect"] <= versus["high"]
        assert versus["p_value"] <= versus["p_adjusted"] <= 1
        assert "two-level bootstrap" in versus["method"]
    assert summary["family"]["tests"] == 3
    assert (summary["runs"], summary["hit_epoch_cap"], summary["max_epochs"]) == (8, 8, 2)
    table = (out / "table.md").read_text()
    assert all(f"| {name} |" in table for name in inputs)
    assert "8 of 8 runs hit the epoch cap (2 epochs)." in table


def test_a_controls_instances_train_with_the_control_seeds_and_pool(workspace, tmp_path) -> None:
    """With a controls section, its instances among the mix encoders train with
    ``control_seeds`` only and are one input of the summary, tested instance first."""
    _, cfg = workspace
    config = dataclasses.replace(section(cfg, "taskmodel", TaskModelConfig), control_seeds=[1])
    controls = {"noise": {"random": 1, "token_only": 2}}
    catalog = data_catalog(section(cfg, "extract", ExtractConfig))
    summary = run_taskmodel(config, _task(cfg, config), catalog, tmp_path / "out", None, controls)
    assert list(summary["inputs"]) == ["baseline", "elmo_trained", "elmo_noise"]
    row = summary["inputs"]["elmo_noise"]
    assert (row["instances"], row["seeds"], row["units"]) == (
        ["elmo_random", "elmo_token_only"],
        [1],
        2,
    )
    assert [p.name for p in (tmp_path / "out" / "elmo_random").iterdir()] == ["seed1"]
    assert "groups first (2 and 2)" in summary["vs_baseline"]["elmo_noise"]["method"]
    assert summary["runs"] == 6


def test_two_workers_write_what_one_process_writes_bit_for_bit(workspace, tmp_path) -> None:
    """The runs trained in two forked workers give every run's record, predictions and the
    summary exactly as one process training them in turn does (the times aside)."""
    _, cfg = workspace
    config = dataclasses.replace(
        section(cfg, "taskmodel", TaskModelConfig), mix_encoders=["trained", "random"]
    )
    catalog = data_catalog(section(cfg, "extract", ExtractConfig))
    timing = {"wall_seconds", "peak_rss_bytes", "peak_rss_children_bytes"}
    written = {}
    for workers in (1, 2):
        out = tmp_path / f"workers{workers}"
        one = dataclasses.replace(config, workers=workers)
        run_taskmodel(one, _task(cfg, one), catalog, out)
        files = sorted(p for p in out.rglob("*") if p.is_file())
        written[workers] = {
            p.relative_to(out): (
                {k: v for k, v in json.loads(p.read_text()).items() if k not in timing}
                if p.suffix == ".json"
                else p.read_text()
            )
            for p in files
        }
    assert len(written[1]) == 3 * 2 * 2 + 2  # 3 inputs x 2 seeds x 2 files, the summary's 2
    assert written[2] == written[1]


def test_features_that_do_not_match_the_labels_name_the_file(workspace, tmp_path: Path) -> None:
    root, cfg = workspace
    features = tmp_path / "features"
    shutil.copytree(root / "artifacts" / "features", features)
    bad = features / "random" / "conll2003" / "dev.hdf5"
    with h5py.File(bad, "r+") as file:
        line = file["0"][()]
        del file["0"]
        file["0"] = line[:, :-1]  # one token vector short
    config = section(cfg, "taskmodel", TaskModelConfig)
    config.features_dir = str(features)
    catalog = data_catalog(section(cfg, "extract", ExtractConfig))
    n = line.shape[1]
    expect_error(
        lambda: run_taskmodel(config, _task(cfg, config), catalog, tmp_path / "out"),
        bad,
        None,
        f"line index 0: {n - 1} token vectors, expected {n}",
    )
    assert not (tmp_path / "out").exists()


def test_a_fine_tuned_bilm_starts_at_the_frozen_features_and_trains(workspace) -> None:
    """finetune_trained: before its first step, the biLM inside the tagger gives the frozen
    input's cached layers (standardized alike); training changes its weights, and the stage
    reports it against the baseline and against its frozen twin."""
    root, cfg = workspace
    extract = section(cfg, "extract", ExtractConfig)
    config = dataclasses.replace(
        section(cfg, "taskmodel", TaskModelConfig),
        mix_encoders=["trained"],
        finetune_encoders=["trained"],
        seeds=[1, 2],
        max_epochs=1,
    )
    assert config.inputs == ["baseline", "elmo_trained", "finetune_trained"]
    data = load_task_data(config, _task(cfg, config), data_catalog(extract))
    tuned = input_splits(config, data, "finetune_trained")
    frozen = input_splits(config, data, "elmo_trained")
    encoder = fine_tuned_encoder(config, data, "finetune_trained", extract.encoders)()
    sentences = list(range(min(16, len(tuned["dev"]))))
    batch, cached = PadBatch(tuned["dev"])(sentences), PadBatch(frozen["dev"])(sentences)
    encoder.elmo.eval()
    with torch.no_grad():
        layers = encoder.layers(batch["chars"])  # (L, B, T, dim)
    mask = batch["mask"]
    assert layers.shape == cached["layers"].shape
    # the cache holds float16: equal within its rounding, on standardized values of size ~1
    torch.testing.assert_close(layers[:, mask], cached["layers"][:, mask], atol=0.02, rtol=0.01)

    encoder.elmo.train()
    before = {k: v.clone() for k, v in encoder.elmo.bilm.state_dict().items()}
    result, _ = train_one(config, data, tuned, 1, "finetune_trained/seed1", encoder)
    after = encoder.elmo.bilm.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the biLM trained
    assert result["mix_weights"] is not None and result["epochs"] == 1

    out = root / "artifacts" / "taskmodel_finetune"
    summary = run_taskmodel(config, data.task, data_catalog(extract), out, extract.encoders)
    assert list(summary["vs_baseline"]) == ["elmo_trained", "finetune_trained"]
    versus = summary["vs_frozen"]["finetune_trained"]
    tuned_f1, frozen_f1 = (summary["inputs"][name]["test_f1"] for name in config.inputs[2:0:-1])
    assert versus["effect"] == pytest.approx(np.mean(tuned_f1) - np.mean(frozen_f1))
    assert summary["frozen_family"]["name"] == "task model: fine-tuned vs frozen"
    assert "finetune_trained against elmo_trained" in (out / "table.md").read_text()


def test_fine_tuning_an_encoder_that_is_not_there_names_the_key(workspace) -> None:
    _, cfg = workspace
    extract = section(cfg, "extract", ExtractConfig)
    config = dataclasses.replace(
        section(cfg, "taskmodel", TaskModelConfig), finetune_encoders=["elsewhere"]
    )
    data = load_task_data(config, _task(cfg, config), data_catalog(extract))
    with pytest.raises(ElmolabError, match=r"taskmodel\.finetune_encoders: .elsewhere. is not one"):
        fine_tuned_encoder(config, data, "finetune_elsewhere", extract.encoders)


def _former_mix(w: torch.Tensor, gamma: torch.Tensor, layers: torch.Tensor) -> torch.Tensor:
    """The tagger's mix as it was computed before ``Elmo`` carried it: one head reading one
    minibatch, ``(gamma * softmax(w)) x`` as one matrix product over the layers."""
    s = gamma[:, None] * torch.softmax(w, dim=-1)  # (1, L)
    return (s @ layers.reshape(len(layers), -1)).view(layers.shape[1:])  # (B, T, dim)


@pytest.mark.parametrize("tuned", [False, True])
def test_the_elmo_input_is_the_former_computation_bit_for_bit(tuned: bool) -> None:
    """The tagger's ELMo input (``Elmo.mix`` of the cached layers, or of a fine-tuned copy of a
    biLM standardized by the train split's statistics) and its penalty are, bit for bit, what the
    tagger computed before ``Elmo`` held its mix, in train mode (``Elmo``'s dropout 0 is none)."""
    options = BiLMOptions.from_json(FIXTURE_OPTIONS)
    torch.manual_seed(0)
    bilm = BiLM(options)
    layers, dim = options.lstm.n_layers + 1, 2 * options.lstm.projection_dim
    split = _synthetic(6, 0, True)
    words = [f"w{i % 7}" for i in range(len(split.tags))]
    chars = batch_to_ids([words])[0].to(torch.int16)  # (tokens, 50)
    split = dataclasses.replace(split, layers=torch.randn(layers, len(split.tags), dim))
    split = dataclasses.replace(split, chars=chars)
    batch = PadBatch(split)(list(range(6)))
    mean, std = torch.randn(layers, dim), torch.rand(layers, dim) + 0.5
    encoder = FineTunedLayers.of(bilm, mean, std) if tuned else None
    shape = TaggerShape(3, 8, 1, 0, layers, dim, 8, 1, 0.0, 0.3)
    tagger = BiLstmCrfTagger(shape, encoder).train()
    assert tagger.elmo is not None
    mix = tagger.elmo.scalar_mix
    with torch.no_grad():
        mix.w.copy_(torch.tensor([[0.4, -0.3, 1.1]]))
        mix.gamma.fill_(1.6)
    cached = batch["layers"]
    if tuned:  # the former FineTunedLayers: a copy of the biLM without training dropout
        copy = BiLM(dataclasses.replace(options, dropout=0.0))
        copy.load_state_dict(bilm.state_dict())
        marked = copy(batch["chars"], keep_marks=True).layers[:, :, 1:-1].transpose(0, 1)
        cached = (marked - mean[:, None, None]) / std[:, None, None]
    expected = torch.cat([batch["token"], _former_mix(mix.w, mix.gamma, cached)], dim=-1)
    assert torch.equal(tagger.inputs(batch), expected)
    assert torch.equal(tagger.penalty(), 0.3 * (mix.w[0] ** 2).sum())
