"""Information measures on synthetic features whose labels are a known function of one layer:
the online code (MDL) and conditional probing (information beyond layer 0)."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import default_probe_settings

from elmolab.core.schema import TaskKind
from elmolab.io.results import FeatureMode
from elmolab.probing import FeatureDataset, Head, LabelVocabulary, train_heads
from elmolab.probing.engine import online_code_block
from elmolab.probing.jobs import online_code_blocks, plan_jobs
from elmolab.probing.modes import CellModes

LABELS = ["A", "B", "C", "D"]
VOCABULARY = LabelVocabulary(LABELS)
SETTINGS = dataclasses.replace(
    default_probe_settings(),
    lr=0.05,
    mix_lr=0.05,
    batch_size=64,
    max_epochs=12,
    patience=2,
    min_epoch_tokens=256,
    online_code_fractions=[0.05, 0.1, 0.2, 0.4, 1.0],
)
# Conditional probing: "no information beyond the baseline" holds to this many bits per token
# (the probes on [layer0; layer k] estimate the same cross-entropy with twice the parameters).
ZERO_BITS = 0.05


def _split(
    n_sentences: int, seed: int, informative: int, copy_to: int | None, signal: float
) -> FeatureDataset:
    """Sentences of 6 tokens, 3 layers of width 8: the label is which of 4 directions layer
    ``informative`` points to, ``signal`` against unit noise; the other layers are noise, or
    with ``copy_to`` that layer is a copy of the informative one."""
    rng = np.random.default_rng(seed)
    classes = rng.integers(0, len(LABELS), size=(n_sentences, 6))
    features = []
    for sentence in classes:
        layers = rng.normal(size=(3, 6, 8)).astype(np.float32)
        layers[informative, np.arange(6), sentence] += signal
        if copy_to is not None:
            layers[copy_to] = layers[informative]
        features.append(torch.from_numpy(layers))
    tags = [[LABELS[c] for c in sentence] for sentence in classes]
    return FeatureDataset.from_sentences(features, VOCABULARY.encode(tags))


def _splits(
    informative: int, copy_to: int | None = None, signal: float = 10.0
) -> dict[str, FeatureDataset]:
    return {
        role: _split(n, seed, informative, copy_to, signal)
        for role, n, seed in (("train", 200, 0), ("dev", 40, 1), ("test", 40, 2))
    }


def _online_code(splits: dict[str, FeatureDataset], modes: list[str]) -> dict[str, float]:
    """Each mode's online code length in bits (one seed), as the probe stage computes it."""
    train = splits["train"]
    blocks = online_code_blocks(len(train.sentence_lengths), SETTINGS)
    tokens = [sum(train.sentence_lengths[i] for i in block) for block in blocks]
    heads = [Head(FeatureMode(mode), 1) for mode in modes]
    totals = [tokens[0] * math.log2(len(LABELS))] * len(heads)
    for block in range(1, len(blocks)):
        before = sorted(i for b in blocks[:block] for i in b)
        fit_splits = {
            **splits,
            "train": train.subset(before),
            "block": train.subset(blocks[block]),
        }
        bits = online_code_block(
            heads, fit_splits, SETTINGS, metric="accuracy", vocabulary=VOCABULARY
        )
        totals = [total + b for total, b in zip(totals, bits, strict=True)]
    return dict(zip(modes, totals, strict=True))


def test_online_code_blocks_are_nested_disjoint_and_cover_the_training_set() -> None:
    blocks = online_code_blocks(200, SETTINGS)
    assert [len(block) for block in blocks] == [10, 10, 20, 40, 120]
    flat = [i for block in blocks for i in block]
    assert sorted(flat) == list(range(200))  # every sentence in exactly one block
    # The first k blocks are the learning-curve subset of the k-th share (the same permutation).
    from elmolab.probing.jobs import training_subset

    assert sorted(blocks[0] + blocks[1]) == training_subset(200, 0.1, SETTINGS)


def test_informative_features_have_a_shorter_online_code_than_noise() -> None:
    splits = _splits(informative=1)
    codes = _online_code(splits, ["layer0", "layer1", "layer2"])
    uniform = sum(splits["train"].sentence_lengths) * math.log2(len(LABELS))
    # Noise cannot be compressed (a probe on it codes no better than uniform, give or take
    # overfitting); the informative layer compresses several times.
    assert codes["layer1"] < 0.5 * uniform
    assert codes["layer1"] < 0.5 * min(codes["layer0"], codes["layer2"])
    assert min(codes["layer0"], codes["layer2"]) > 0.9 * uniform


def _conditional(splits: dict[str, FeatureDataset], mode: str) -> tuple[float, float]:
    """Test bits per token of the probe on layer 0 and of the probe on [layer0; mode]."""
    heads = [Head(FeatureMode.LAYER0, 1), Head(FeatureMode(mode), 1, baseline=True)]
    base, conditioned = train_heads(
        heads, splits, SETTINGS, kind="token", metric="accuracy", vocabulary=VOCABULARY, bits=True
    )
    assert (base.features, conditioned.features) == ("layer0", f"layer0+{mode}")
    return base.extra["test_bits"], conditioned.extra["test_bits"]


def test_conditional_probing_finds_nothing_beyond_a_baseline_that_holds_everything() -> None:
    # Layer 0 tells the label, not perfectly; layer 1 is a copy of it, layer 2 noise: neither
    # adds anything.
    splits = _splits(informative=0, copy_to=1, signal=2.0)
    for mode in ("layer1", "layer2"):
        base, conditioned = _conditional(splits, mode)
        assert 0.3 < base < 1.5  # the baseline is informative, not perfect (uniform: 2 bits)
        assert abs(base - conditioned) < ZERO_BITS, mode


def test_conditional_probing_finds_what_a_layer_adds_beyond_layer0() -> None:
    # Layer 0 is noise, layer 1 tells the label: about 2 bits per token beyond layer 0.
    splits = _splits(informative=1)
    base, conditioned = _conditional(splits, "layer1")
    assert base > 1.8 and base - conditioned > 1.0


def test_bits_are_each_test_sentences_cross_entropy() -> None:
    splits = _splits(informative=1)
    (result,) = train_heads(
        [Head(FeatureMode.LAYER1, 1)],
        splits,
        SETTINGS,
        kind="token",
        metric="accuracy",
        vocabulary=VOCABULARY,
        bits=True,
    )
    per_sentence = result.extra["per_sentence_test_bits"]
    tokens = sum(splits["test"].sentence_lengths)
    assert len(per_sentence) == 40
    assert sum(per_sentence) / tokens == pytest.approx(result.extra["test_bits"], abs=1e-3)
    # The selected epoch's dev loss (nats) is the dev cross-entropy in bits times ln 2.
    best = result.history[result.best_epoch - 1]
    assert result.extra["dev_bits"] * math.log(2) == pytest.approx(best.dev_loss, rel=1e-5)
    (plain,) = train_heads(
        [Head(FeatureMode.LAYER1, 1)],
        splits,
        SETTINGS,
        kind="token",
        metric="accuracy",
        vocabulary=VOCABULARY,
    )
    assert "test_bits" not in plain.extra and plain.test == result.test


def test_conditional_heads_reject_modes_without_a_second_input() -> None:
    for mode in (FeatureMode.LAYER0, FeatureMode.CONCAT):
        with pytest.raises(ValueError, match="adds nothing"):
            Head(mode, 1, baseline=True)


def test_plan_adds_conditional_heads_to_full_fits_and_a_job_per_code_block() -> None:
    settings = dataclasses.replace(SETTINGS, encoders=["trained", "token_only"])
    modes = CellModes.resolve(["layer0", "layer1", "scalar_mix"], settings.encoders)
    twins = {"token_only": "trained"}
    jobs = plan_jobs(
        TaskKind.TOKEN,
        modes,
        [1, 2],
        settings,
        twins,
        conditional=True,
        online_blocks=online_code_blocks(200, settings),
        num_layers=3,
        train_sentences=200,
    )
    full = [job for job in jobs if job.fraction == 1.0]
    assert [job.encoder for job in full] == ["trained", "token_only"]
    assert {head.features for head in full[0].heads} == {
        "layer0",
        "layer1",
        "scalar_mix",
        "layer0+layer1",
        "layer0+scalar_mix",
    }
    assert "layer0" not in {head.features for head in full[1].heads}  # the twin's: copied
    codes = [job for job in jobs if job.block is not None]
    assert sorted({job.block for job in codes}) == [1, 2, 3, 4]
    assert len(codes) == 8 and all(not head.baseline for job in codes for head in job.heads)
    assert [job.fraction for job in jobs] == sorted((job.fraction for job in jobs), reverse=True)
    plain = plan_jobs(
        TaskKind.TOKEN, modes, [1, 2], settings, twins, num_layers=3, train_sentences=200
    )
    assert all(job.block is None for job in plain)
    assert not any(head.baseline for job in plain for head in job.heads)
