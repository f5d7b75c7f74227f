"""Probes on synthetic features: they learn, deterministically; datasets, labels, control task."""

import dataclasses
import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from elmolab.errors import ElmolabError
from elmolab.probing import (
    ControlTask,
    FeatureDataset,
    LabelVocabulary,
    ProbeConfig,
    train_probe,
)

LABELS = ["ADJ", "NOUN", "VERB"]
FAST = ProbeConfig(lr=0.05, batch_size=32, max_epochs=15, patience=4)


def _split(
    n_sentences: int, seed: int, *, pair: bool = False, dtype: torch.dtype = torch.float32
) -> tuple[FeatureDataset, list[list[str]]]:
    """Sentences of 8 tokens, dim 6; only layer 1 tells the class (linearly), layers 0/2 are noise.

    For ``pair`` each word's head is the next word (the last word's is the root), and the label is
    the head's class, or ``root``.
    """
    rng = np.random.default_rng(seed)
    classes = rng.integers(0, 3, size=(n_sentences, 8))
    features, tags, heads = [], [], []
    for sentence in classes:
        layers = rng.normal(size=(3, 8, 6)).astype(np.float32)  # (layers, tokens, dim)
        layers[1, np.arange(8), sentence] += 4.0
        features.append(torch.from_numpy(layers).to(dtype))
        if pair:
            heads.append([*range(2, 9), 0])
            tags.append([LABELS[c] for c in sentence[1:]] + ["root"])
        else:
            tags.append([LABELS[c] for c in sentence])
    vocabulary = LabelVocabulary([*LABELS, "root"] if pair else LABELS)
    dataset = FeatureDataset.from_sentences(
        features, vocabulary.encode(tags), heads if pair else None
    )
    return dataset, tags


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors: more threads only add synchronisation, which stalls on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def splits() -> tuple[FeatureDataset, FeatureDataset, FeatureDataset]:
    return _split(40, 0)[0], _split(10, 1)[0], _split(10, 2)[0]


@pytest.mark.parametrize("mode", ["layer1", "scalar_mix", "concat"])
def test_linear_probe_learns_a_separable_task(
    splits: tuple[FeatureDataset, ...], mode: str
) -> None:
    result = train_probe(
        *splits, LabelVocabulary(LABELS), mode=mode, metric="accuracy", seed=0, config=FAST
    )
    assert result.test >= 0.95
    assert result.dev == max(epoch.dev_metric for epoch in result.history)
    assert result.history[result.best_epoch - 1].dev_metric == result.dev
    assert result.epochs == FAST.max_epochs or result.epochs - result.best_epoch == 4
    assert [len(tags) for tags in result.test_predictions] == [8] * 10
    assert json.loads(json.dumps(dataclasses.asdict(result)))["features"] == mode
    correct, total = result.per_sentence_test["correct"], result.per_sentence_test["total"]
    assert total == [8] * 10 and sum(correct) / sum(total) == pytest.approx(result.test)
    if mode == "scalar_mix":
        assert result.mix_weights is not None and sum(result.mix_weights) == pytest.approx(1)
        assert result.mix_weights[1] == max(result.mix_weights)
        assert result.gamma is not None
    if mode == "concat":
        assert result.mix_weights is None and result.gamma is None


def test_noise_layer_stays_near_chance(splits: tuple[FeatureDataset, ...]) -> None:
    result = train_probe(
        *splits, LabelVocabulary(LABELS), mode="layer0", metric="accuracy", seed=0, config=FAST
    )
    assert result.test < 0.7
    assert result.mix_weights == [1.0, 0.0, 0.0] and result.gamma == 1.0


def test_mlp_probe_learns_with_layer_norm(splits: tuple[FeatureDataset, ...]) -> None:
    config = dataclasses.replace(FAST, probe="mlp", hidden_dim=16, layer_norm=True)
    result = train_probe(
        *splits,
        LabelVocabulary(LABELS),
        mode="scalar_mix",
        metric="accuracy",
        seed=0,
        config=config,
    )
    assert result.test >= 0.95


def test_same_seed_same_run(splits: tuple[FeatureDataset, ...]) -> None:
    config = dataclasses.replace(FAST, probe="mlp", hidden_dim=8, max_epochs=3)
    runs = [
        train_probe(
            *splits,
            LabelVocabulary(LABELS),
            mode="scalar_mix",
            metric="accuracy",
            seed=7,
            config=config,
        )
        for _ in range(2)
    ]
    first, second = (dataclasses.replace(run, wall_seconds=0.0) for run in runs)
    assert first == second


def test_pair_probe_reads_the_head_from_half_precision_features() -> None:
    (train, _), (dev, _), (test, _) = (
        _split(n, seed, pair=True, dtype=torch.float16) for n, seed in ((60, 0), (10, 1), (10, 2))
    )
    assert train.heads is not None and train.heads[:8].tolist() == [*range(1, 8), -1]
    vocabulary = LabelVocabulary([*LABELS, "root"])
    result = train_probe(
        train, dev, test, vocabulary, mode="layer1", metric="accuracy", seed=0, config=FAST
    )
    assert result.test >= 0.95


def test_span_metric_selects_on_span_f1(splits: tuple[FeatureDataset, ...]) -> None:
    vocabulary = LabelVocabulary(["B-ADJ", "B-NOUN", "B-VERB"])  # the same ids, as chunks
    result = train_probe(*splits, vocabulary, mode="layer1", metric="span_f1", seed=0, config=FAST)
    assert result.metric == "span_f1" and result.test >= 0.95
    assert result.test_predictions[0][0].startswith("B-")


def test_feature_dataset_concatenates_sentences_and_checks_counts() -> None:
    first, second = torch.zeros(3, 2, 4), torch.ones(3, 3, 4)
    dataset = FeatureDataset.from_sentences(
        [first, second.numpy()], [[0, 1], [2, 2, 0]], [[2, 0], [0, 1, 1]]
    )
    assert dataset.features.shape == (3, 5, 4)
    assert torch.equal(dataset.features[:, 2:], second)
    assert dataset.labels.tolist() == [0, 1, 2, 2, 0]
    assert dataset.sentence_lengths == (2, 3)
    assert dataset.heads is not None and dataset.heads.tolist() == [1, -1, -1, 2, 2]
    with pytest.raises(ElmolabError, match=r"^x.hdf5: sentence 1: 3 feature vectors but 2 labels"):
        FeatureDataset.from_sentences([first, second], [[0, 1], [2, 2]], path="x.hdf5")
    with pytest.raises(ElmolabError, match=r"sentence 0: head 3 outside 0\.\.2"):
        FeatureDataset.from_sentences([first], [[0, 1]], [[3, 0]])
    with pytest.raises(ElmolabError, match=r"sentence 1: features of shape \(2, 3, 4\)"):
        FeatureDataset.from_sentences([first, torch.ones(2, 3, 4)], [[0, 1], [0, 0, 0]])


def test_label_unseen_in_train_raises_with_file_and_line() -> None:
    vocabulary = LabelVocabulary.from_sentences([["NOUN", "VERB"], ["NOUN"]])
    assert vocabulary.labels == ["NOUN", "VERB"]
    with pytest.raises(ElmolabError, match=r"^test.conllu:14: label 'INTJ' never occurs"):
        vocabulary.encode([["NOUN"], ["VERB", "INTJ"]], path="test.conllu", lines=[[11], [13, 14]])
    with pytest.raises(ElmolabError, match=r"label 'X' \(sentence 0, token 1\) never occurs"):
        vocabulary.encode([["NOUN", "X"]])


def test_kept_unseen_label_can_never_be_predicted() -> None:
    vocabulary = LabelVocabulary(["NOUN", "VERB"], unseen="keep")
    assert vocabulary.encode([["VERB", "INTJ", "NOUN", "INTJ"]]) == [[1, 2, 0, 2]]
    assert (vocabulary.num_train_labels, len(vocabulary)) == (2, 3)
    assert vocabulary.decode([2]) == ["INTJ"]


def test_control_task_is_per_type_consistent_and_seeded() -> None:
    train_tags = [["NOUN"] * 6 + ["VERB"] * 3 + ["ADJ"]]
    control = ControlTask.from_sentences(train_tags, seed=3)
    words = [f"w{i}" for i in range(2000)]
    relabelled = control.relabel([words, list(reversed(words))])
    assert relabelled[0] == list(reversed(relabelled[1]))  # one tag per type, in any order
    assert relabelled == ControlTask.from_sentences(train_tags, seed=3).relabel(
        [words, words[::-1]]
    )
    assert relabelled[0] != ControlTask.from_sentences(train_tags, seed=4).relabel([words])[0]
    share = {tag: relabelled[0].count(tag) / len(words) for tag in control.tags}
    assert share == pytest.approx({"ADJ": 0.1, "NOUN": 0.6, "VERB": 0.3}, abs=0.04)
