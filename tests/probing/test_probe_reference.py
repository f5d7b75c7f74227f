"""The reference probes (``elmolab.probing.probes``: one probe, one plain module, float32) against
the batched engine the probe stage runs: every head of a joint engine fit trains as :func:`fit`
trains that probe alone, epoch for epoch, up to float32 rounding, for every probe kind, feature
mode and the conditional heads; and the engine's logits are the reference modules' on the same
parameters."""

import dataclasses

import numpy as np
import pytest
import torch
from test_probes import LABELS, STOPPING_APART, _sentence_split
from test_probes import _split as token_split
from test_trees import FAST as TREE_FAST
from test_trees import _split as tree_split

from elmolab.core.schema import SPLIT_ROLES
from elmolab.data.labels import LabelVocabulary
from elmolab.io.results import FeatureMode
from elmolab.models.scalar_mix import ScalarMix
from elmolab.probing.engine import train_heads
from elmolab.probing.kinds import build, probe_kind
from elmolab.probing.kinds.structural import StructuralProbe
from elmolab.probing.probes import Head, LayerInput, fit
from elmolab.probing.trees import GoldTrees, tree_distances

MODES = ["layer0", "layer1", "mean", "scalar_mix", "concat"]


def _token_case(kind: str):
    if kind == "sentence":
        splits = [_sentence_split(n, seed)[0] for n, seed in ((200, 0), (50, 1), (50, 2))]
    else:
        pair = kind == "pair"
        splits = [token_split(n, seed, pair=pair)[0] for n, seed in ((40, 0), (10, 1), (10, 2))]
    vocabulary = LabelVocabulary([*LABELS, "root"] if kind == "pair" else LABELS)
    return dict(zip(SPLIT_ROLES, splits, strict=True)), vocabulary


def _heads(kind: str) -> list[Head]:
    heads = [Head(FeatureMode(mode), seed) for mode in MODES for seed in (1, 2)]
    if kind in ("token", "pair"):  # conditional probing: layer 0 beside a mix
        heads += [Head(FeatureMode.SCALAR_MIX, 1, True), Head(FeatureMode.LAYER2, 2, True)]
    return heads


def _assert_trains_as_the_engine(kind, heads, splits, settings, vocabulary=None, metric=None):
    together = train_heads(heads, splits, settings, kind=kind, metric=metric, vocabulary=vocabulary)
    assert len({result.epochs for result in together}) > 1  # heads stopped at different epochs
    schedule = probe_kind(kind).schedule(settings)
    for head, result in zip(heads, together, strict=True):
        probe, data = build(kind, head, splits, settings, vocabulary, metric)
        trace = fit(probe, data, schedule, head.seed)
        where = f"{kind} {head.features} seed {head.seed}"
        assert (trace.best_epoch, len(trace.history)) == (result.best_epoch, result.epochs), where
        assert trace.hit_epoch_cap == result.hit_epoch_cap, where
        for (train_loss, selected, dev_loss), record in zip(
            trace.history, result.history, strict=True
        ):
            assert train_loss == pytest.approx(record.train_loss, rel=1e-5), where
            assert dev_loss == pytest.approx(record.dev_loss, rel=1e-5), where
            assert selected == pytest.approx(record.dev_metric, rel=1e-5), where
        with torch.no_grad():
            dev, test = data.evaluate(probe, "dev"), data.evaluate(probe, "test")
        if isinstance(probe, StructuralProbe):
            gold = GoldTrees(
                [tree_distances(h) for h in splits["test"].sentence_heads()],
                splits["test"].sentence_punct(),
            )
            predicted = [d.numpy() for d in test.predicted]
            assert gold.uuas(predicted).score == pytest.approx(result.test, abs=1e-9), where
        else:
            assert (dev.score, test.score) == pytest.approx((result.dev, result.test)), where
        mix = probe.input.mix
        if mix is not None and mix.learned[0]:
            weights, gamma = mix.summary(0)
            assert weights == pytest.approx(result.mix_weights, rel=1e-5), where
            assert gamma == pytest.approx(result.gamma, rel=1e-5), where


@pytest.mark.parametrize(
    ("kind", "classifier", "layer_norm"),
    [
        ("token", "linear", False),
        ("token", "mlp", True),
        ("pair", "linear", False),
        ("pair", "mlp", True),
        ("sentence", "linear", False),
    ],
)
def test_token_probes_train_as_the_engine_trains_them(
    kind: str, classifier: str, layer_norm: bool
) -> None:
    """Token, pair and sentence probes, linear and MLP (with dropout), with and without layer
    norm, a learned root vector for pairs: the reference fit of each head alone is the engine's
    joint fit of that head (the same epochs, best epoch, losses, scores and mix)."""
    splits, vocabulary = _token_case(kind)
    settings = dataclasses.replace(
        STOPPING_APART,
        kind=classifier,
        dropout=0.2 if classifier == "mlp" else 0.0,
        layer_norm=layer_norm,
        weight_decay=0.001,
    )
    _assert_trains_as_the_engine(kind, _heads(kind), splits, settings, vocabulary, "accuracy")


@pytest.mark.parametrize("kind", ["arc", "structural"])
def test_tree_probes_train_as_the_engine_trains_them(kind: str) -> None:
    """The arc probe (bilinear, learned root) and the structural probe (selected on its dev loss,
    scored by UUAS at the end): the reference fit of each head alone is the engine's."""
    trees = [tree_split(n, seed) for n, seed in ((60, 0), (20, 1), (20, 2))]
    splits = dict(zip(SPLIT_ROLES, trees, strict=True))
    settings = dataclasses.replace(
        TREE_FAST,
        l2_lambda=0.01,
        tree=dataclasses.replace(TREE_FAST.tree, max_epochs=5, patience=1, lr_decay=0.5),
    )
    _assert_trains_as_the_engine(kind, _heads(kind), splits, settings)


def test_scalar_mix_is_gamma_times_softmax_weighted_layers() -> None:
    """ELMo's eq. 1 on the layers axis first; a fixed one-hot mix is its layer bit for bit."""
    layers = torch.randn(3, 4, 5)
    mix = ScalarMix(3, l2_lambda=0.5)
    with torch.no_grad():
        mix.w.copy_(torch.tensor([0.2, -1.0, 0.7]))
        mix.gamma.fill_(1.7)
    s = np.exp([0.2, -1.0, 0.7]) / np.exp([0.2, -1.0, 0.7]).sum()
    expected = 1.7 * sum(float(s[j]) * layers[j] for j in range(3))
    torch.testing.assert_close(mix(layers)[0], expected)
    assert mix.penalty().item() == pytest.approx(0.5 * (0.04 + 1.0 + 0.49))
    one_hot = LayerInput(FeatureMode.LAYER2, 3, 5)
    assert torch.equal(one_hot(layers), layers[2])
    beside = LayerInput(FeatureMode.MEAN, 3, 5, baseline=True)
    assert beside.width == 10
    torch.testing.assert_close(beside(layers), torch.cat([layers[0], layers.mean(dim=0)], dim=-1))
    assert LayerInput(FeatureMode.CONCAT, 3, 5)(layers).shape == (4, 15)
