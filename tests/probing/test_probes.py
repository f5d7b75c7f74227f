"""The probe engine on synthetic features: probes learn, deterministically, and training heads
together equals training each alone; datasets, labels, control task."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import default_probe_settings
from seqeval.metrics.sequence_labeling import get_entities
from torch.nn import functional as F

from elmolab.core.errors import ElmolabError
from elmolab.data.conll import TagScheme, spans_to_tags
from elmolab.io.results import FeatureMode
from elmolab.probing import (
    ControlTask,
    FeatureDataset,
    Head,
    LabelVocabulary,
    ProbeResult,
    train_heads,
)
from elmolab.probing.datasets import mean_pool, pool_sentences, standardize_layers
from elmolab.probing.kinds import probe_kind
from elmolab.probing.kinds.pair import PairProbes
from elmolab.probing.kinds.token import TokenProbes
from elmolab.probing.metrics import span_f1
from elmolab.probing.probes import made_progress

LABELS = ["ADJ", "NOUN", "VERB"]
FAST = dataclasses.replace(
    default_probe_settings(),
    lr=0.05,
    pair_lr=0.05,
    mix_lr=0.05,
    lr_decay=1.0,
    batch_size=32,
    max_epochs=15,
    patience=4,
    min_epoch_tokens=0,
    precision="32-true",  # the reference arithmetic on every CPU; bf16-mixed is tested by name
)


# Few epochs, a quick stop and a decaying rate: heads of one fit stop at different epochs.
STOPPING_APART = dataclasses.replace(
    FAST, hidden_dim=8, max_epochs=6, patience=1, lr_decay=0.5, l2_lambda=0.01
)


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


def _sentence_split(n_sentences: int, seed: int) -> tuple[FeatureDataset, list[np.ndarray]]:
    """Sentences of 1 to 9 tokens, dim 6, one label each: only layer 1 tells it (every token of
    the sentence leans towards its class, so the mean does), layers 0/2 are noise. Every fifth
    sentence has no label (a label the task drops). Returns the pooled split and the per-sentence
    features it pools."""
    rng = np.random.default_rng(seed)
    features, labels = [], []
    for i in range(n_sentences):
        label = int(rng.integers(0, 3))
        layers = rng.normal(size=(3, int(rng.integers(1, 10)), 6)).astype(np.float32)
        layers[1, :, label] += 1.5
        features.append(layers)
        labels.append([] if i % 5 == 4 else [label])
    return pool_sentences(features, labels), features


@pytest.fixture(scope="module")
def splits() -> tuple[FeatureDataset, FeatureDataset, FeatureDataset]:
    return _split(40, 0)[0], _split(10, 1)[0], _split(10, 2)[0]


def _train(
    splits: tuple[FeatureDataset, ...],
    modes: list[str],
    seeds: tuple[int, ...] = (0,),
    vocabulary: LabelVocabulary | None = None,
    metric: str = "accuracy",
    settings=FAST,
    kind: str | None = None,
) -> list[ProbeResult]:
    heads = [Head(FeatureMode(mode), seed) for mode in modes for seed in seeds]
    pair = splits[0].heads is not None
    return train_heads(
        heads,
        dict(zip(("train", "dev", "test"), splits, strict=True)),
        settings,
        kind=kind or ("pair" if pair else "token"),
        metric=metric,
        vocabulary=vocabulary or LabelVocabulary(LABELS),
    )


def test_linear_probes_learn_a_separable_task(splits: tuple[FeatureDataset, ...]) -> None:
    results = _train(splits, ["layer1", "scalar_mix", "concat"])
    for mode, result in zip(["layer1", "scalar_mix", "concat"], results, strict=True):
        assert result.features == mode and result.test >= 0.95
        assert result.dev == max(epoch.dev_metric for epoch in result.history)
        assert result.history[result.best_epoch - 1].dev_metric == result.dev
        # Stopped early (patience 4 epochs after the last progress), or still going at the cap.
        assert result.hit_epoch_cap == (result.epochs == FAST.max_epochs)
        assert result.hit_epoch_cap or result.epochs - result.best_epoch <= 4
        assert [len(tags) for tags in result.test_predictions] == [8] * 10
        assert json.loads(json.dumps(dataclasses.asdict(result)))["features"] == mode
        correct, total = result.per_sentence_test["correct"], result.per_sentence_test["total"]
        assert total == [8] * 10 and sum(correct) / sum(total) == pytest.approx(result.test)
    mix = results[1]
    assert mix.mix_weights is not None and sum(mix.mix_weights) == pytest.approx(1)
    assert mix.mix_weights[1] == max(mix.mix_weights) and mix.gamma is not None
    assert results[2].mix_weights is None and results[2].gamma is None


def _scaled(split: FeatureDataset, offset: float, scale: float) -> FeatureDataset:
    """``split`` with every feature ``offset + scale * x``, in float16 (as feature files store)."""
    return dataclasses.replace(split, features=(offset + scale * split.features).half())


def test_standardize_layers_uses_the_train_statistics_for_every_split(
    splits: tuple[FeatureDataset, ...],
) -> None:
    roles = zip(("train", "dev", "test"), splits, strict=True)
    raw = {role: _scaled(split, 0.2, 0.05) for role, split in roles}
    raw["train"].features[2, :, 5] = 0.25  # a dimension that does not vary in train
    raw["train"].features[1, :, 4] = 0.25  # one that varies in a single token, by float16's step
    raw["train"].features[1, 0, 4] = 0.2502
    before = {role: s.features.clone() for role, s in raw.items()}
    standardize_layers(raw)
    train = before["train"].float()
    mean, std = train.mean(1, keepdim=True), train.std(1, keepdim=True)
    # Divided by a thousandth of its layer's median deviation at least: by its own 1.4e-5, dev's
    # values would come out as large as 1.2e4, and values a little further off past float16's.
    assert float(std[1, 0, 4]) < 1e-3 * float(std[1, 0].median())
    std[1, 0, 4] = 1e-3 * std[1, 0].median()
    std[2, 0, 5] = 1.0  # only centred
    for role, split in raw.items():
        assert split.features.dtype == torch.float16 and bool(split.features.isfinite().all())
        expected = (before[role].float() - mean) / std
        torch.testing.assert_close(split.features.float(), expected, atol=2e-3, rtol=2e-3)
    standardized = raw["train"].features.float()
    torch.testing.assert_close(standardized.mean(1), torch.zeros(3, 6), atol=1e-3, rtol=0)
    assert torch.all(standardized[2, :, 5] == 0)
    torch.testing.assert_close(standardized[0].std(0), torch.ones(6), atol=1e-3, rtol=0)

    # Two roles of one array (a task that scores on the data it trains on) are standardized once.
    shared = _scaled(splits[0], 0.2, 0.05)
    once = shared.features.float()
    standardize_layers({"train": shared, "dev": shared, "test": _scaled(splits[2], 0.2, 0.05)})
    expected = (once - once.mean(1, keepdim=True)) / once.std(1, keepdim=True)
    torch.testing.assert_close(shared.features.float(), expected, atol=2e-3, rtol=2e-3)


@dataclasses.dataclass
class _Raw:
    """A split as standardize_layers reads it: its features alone."""

    features: torch.Tensor


def test_standardize_layers_only_centres_dimensions_constant_over_a_long_train_split() -> None:
    """Over 12,345 train tokens a float32 mean of equal values need not equal them: a constant
    dimension must still end exactly 0 in train, and dev's be centred on the constant, unscaled
    (not the rounding error divided by a deviation made of rounding errors)."""
    generator = torch.Generator().manual_seed(0)
    train = (0.2 + 0.05 * torch.randn(3, 12345, 64, generator=generator)).half()
    constants = torch.randn(3, 1, 32, generator=generator).half()
    train[:, :, :32] = constants
    dev = (0.2 + 0.05 * torch.randn(3, 50, 64, generator=generator)).half()
    before = dev.clone()
    splits = {"train": _Raw(train), "dev": _Raw(dev)}
    standardize_layers(splits)
    assert torch.all(train[:, :, :32] == 0)
    expected = (before[:, :, :32].float() - constants.float()).half()
    assert torch.equal(dev[:, :, :32], expected)
    varying = train[:, :, 32:].float()
    torch.testing.assert_close(varying.std(1), torch.ones(3, 32), atol=2e-3, rtol=0)


def test_standardized_features_let_a_probe_reach_weights_that_narrow_features_need(
    splits: tuple[FeatureDataset, ...],
) -> None:
    """Layer 1 varying by 0.02 around 0.5: at the same learning rate and number of epochs the
    probe of the raw layer stays far below the probe of the standardized one, which learns the
    task as on well-scaled features."""
    settings = dataclasses.replace(FAST, lr=0.01, max_epochs=4, patience=4)
    narrow = tuple(_scaled(s, 0.5, 0.02) for s in splits)
    (raw,) = _train(narrow, ["layer1"], settings=settings)
    standardize_layers(dict(zip(("train", "dev", "test"), narrow, strict=True)))
    (standardized,) = _train(narrow, ["layer1"], settings=settings)
    assert standardized.test >= 0.95 and raw.test < 0.6


def test_noise_layer_stays_near_chance(splits: tuple[FeatureDataset, ...]) -> None:
    (result,) = _train(splits, ["layer0"])
    assert result.test < 0.7
    assert result.mix_weights == [1.0, 0.0, 0.0] and result.gamma == 1.0


def test_mlp_probe_learns_with_layer_norm(splits: tuple[FeatureDataset, ...]) -> None:
    settings = dataclasses.replace(FAST, kind="mlp", hidden_dim=16, layer_norm=True)
    (result,) = _train(splits, ["scalar_mix"], settings=settings)
    assert result.test >= 0.95


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("task", ["token", "pair", "sentence"])
def test_heads_trained_together_equal_each_trained_alone(
    kind: str, task: str, precision: str
) -> None:
    """The engine's batching is invisible: every head of a joint fit (each mode and seed) ends
    where a fit of that head alone ends, epoch for epoch, up to rounding, in either precision.
    The settings make the heads stop at different epochs, so stopped heads must not disturb the
    others.

    "Up to rounding" is the precision's: float32 sums in another order (1e-5). In bf16-mixed,
    a CPU with AMX (oneDNN's AMX kernels) rounds a batched product differently by how many
    heads it holds, so a head's losses drift apart by a few bf16 rounding steps over its epochs
    (4e-4 of the loss seen on an Intel Xeon with amx_bf16; none with AMX switched off by
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, nor on an AMD EPYC with avx512_bf16): one unit of
    bf16 rounding, 2**-8, bounds them. The epochs, scores and predictions must still be the
    same. A sentence task's heads (on its pooled sentences) too."""
    pair = task == "pair"
    if task == "sentence":
        splits = tuple(_sentence_split(n, seed)[0] for n, seed in ((200, 0), (50, 1), (50, 2)))
    else:
        splits = tuple(_split(n, seed, pair=pair)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    vocabulary = LabelVocabulary([*LABELS, "root"] if pair else LABELS)
    settings = dataclasses.replace(STOPPING_APART, kind=kind, precision=precision)
    modes = ["layer0", "layer1", "layer2", "mean", "scalar_mix", "concat"]
    together = _train(splits, modes, (1, 2), vocabulary, settings=settings, kind=task)
    assert len({result.epochs for result in together}) > 1  # heads stopped at different epochs
    rounding = 1e-5 if precision == "32-true" else 2**-8
    for result in together:
        (alone,) = _train(
            splits, [result.features], (result.seed,), vocabulary, settings=settings, kind=task
        )
        assert (result.features, result.seed) == (alone.features, alone.seed)
        assert (result.best_epoch, result.epochs) == (alone.best_epoch, alone.epochs)
        assert result.dev == pytest.approx(alone.dev, abs=1e-9)
        assert result.test == pytest.approx(alone.test, abs=1e-9)
        assert result.test_predictions == alone.test_predictions
        for mine, theirs in zip(result.history, alone.history, strict=True):
            assert mine.train_loss == pytest.approx(theirs.train_loss, rel=rounding)
            assert mine.dev_loss == pytest.approx(theirs.dev_loss, rel=rounding)
        if result.mix_weights is not None:
            assert result.mix_weights == pytest.approx(alone.mix_weights, rel=rounding)


def _mixed_token_probes(
    heads: list[Head], splits: tuple[FeatureDataset, ...], settings
) -> TokenProbes:
    """Token probes of ``heads`` on (train, dev, test) ``splits``, their learned mixes moved away
    from the uniform start (random logits and scales)."""
    named = dict(zip(("train", "dev", "test"), splits, strict=True))
    probes = TokenProbes(heads, named, LabelVocabulary(LABELS), "accuracy", settings)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for part in probes.parts:
            if part.mix is not None:
                part.mix.w.normal_(generator=generator)
                part.mix.gamma.uniform_(0.5, 2.0, generator=generator)
    return probes


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_folded_token_heads_equal_mixing_then_classifying(kind: str, layer_norm: bool) -> None:
    """Token probes fold each head's first map onto the layers side by side, so that the heads
    reading one minibatch share one product: their logits are those of the reference computation,
    each head's input mixed (``HeadProbes.inputs``) and then classified, for every kind of input
    (a layer, the mean, a learned mix, a concatenation, layer 0 beside a mix)."""
    train, dev, test = (_split(n, seed)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    settings = dataclasses.replace(FAST, kind=kind, hidden_dim=8, layer_norm=layer_norm)
    modes = ["layer0", "layer1", "layer2", "mean", "scalar_mix", "concat"]
    heads = [Head(FeatureMode(mode), seed) for mode in modes for seed in (1, 2)]
    heads += [Head(FeatureMode(mode), 1, baseline=True) for mode in ("layer2", "scalar_mix")]
    probes = _mixed_token_probes(heads, (train, dev, test), settings)
    probes.eval()
    batches = [torch.arange(0, 24), torch.arange(200, 224)]  # a minibatch per seed
    active = torch.ones(len(heads), dtype=torch.bool)
    active[3] = False  # a stopped head
    folded = probes._part_logits("train", batches, probes.seed_group, active)
    assert sorted(int(n) for *_, numbers, _ in folded for n in numbers) == [
        h for h in range(len(heads)) if h != 3
    ]
    x = train.features[:, torch.cat(batches)].view(3, 2, 24, -1)  # (layers, G, N, dim)
    for part, local, numbers, logits in folded:
        groups = probes.seed_group[numbers]
        reference = part.probe(probes.inputs(part, x, groups, local), local)
        torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)


def test_pooling_a_padded_batch_equals_pooling_each_sentence_alone() -> None:
    """``mean_pool`` ignores whatever fills the padding (NaN here); ``pool_sentences`` pools in
    padded batches (300 sentences: two of them) and leaves out the sentences without a label."""
    split, features = _sentence_split(300, 3)
    alone = [torch.from_numpy(f).mean(dim=1) for f in features]  # (layers, dim) each
    tokens = [torch.from_numpy(f).transpose(0, 1) for f in features[:7]]  # (n_i, layers, dim)
    padded = torch.nn.utils.rnn.pad_sequence(tokens, batch_first=True, padding_value=np.nan)
    lengths = torch.tensor([len(t) for t in tokens])
    assert len(set(lengths.tolist())) > 1 and padded.isnan().any()
    torch.testing.assert_close(mean_pool(padded, lengths), torch.stack(alone[:7]))
    kept = [i for i in range(300) if i % 5 != 4]
    assert split.sentence_lengths == (1,) * len(kept) and split.features.dtype == torch.float32
    torch.testing.assert_close(split.features, torch.stack([alone[i] for i in kept], dim=1))


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_pooled_sentence_heads_equal_mixing_then_pooling(kind: str) -> None:
    """A sentence head reads its layers pooled, then mixed; the reference mixes each token's
    layers (``HeadProbes.inputs``, the learned mixes away from their start), pools each sentence's
    mixed tokens and classifies: the same logits, for every mode (a concatenation pools block by
    block)."""
    (train, features), dev, test = (
        _sentence_split(60, 0),
        _sentence_split(10, 1),
        _sentence_split(10, 2),
    )
    settings = dataclasses.replace(FAST, kind=kind, hidden_dim=8)
    modes = ["layer0", "layer1", "layer2", "mean", "scalar_mix", "concat"]
    heads = [Head(FeatureMode(mode), seed) for mode in modes for seed in (1, 2)]
    probes = _mixed_token_probes(heads, (train, dev[0], test[0]), settings)
    probes.eval()
    items = torch.arange(len(train.labels))
    active = torch.ones(len(heads), dtype=torch.bool)
    pooled_first = probes._part_logits("train", [items, items], probes.seed_group, active)
    kept = [torch.from_numpy(f) for i, f in enumerate(features) if i % 5 != 4]
    tokens = torch.cat(kept, dim=1)  # (layers, T, dim)
    sentence = torch.repeat_interleave(torch.tensor([f.shape[1] for f in kept]))  # (T,)
    lengths = torch.bincount(sentence).float()  # (S,)
    x = tokens[:, None].expand(-1, 2, -1, -1)  # (layers, G, T, dim)
    for part, local, numbers, logits in pooled_first:
        blocks = probes.inputs(part, x, probes.seed_group[numbers], local)  # (h, T, d) each
        pooled = [
            torch.zeros(b.shape[0], len(kept), b.shape[2]).index_add_(1, sentence, b)
            / lengths[:, None]
            for b in blocks
        ]
        reference = part.probe(pooled, local)  # (h, S, labels)
        torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)


def test_a_sentence_probe_learns_from_pooled_layers() -> None:
    splits = tuple(_sentence_split(n, seed)[0] for n, seed in ((300, 0), (60, 1), (60, 2)))
    results = _train(splits, ["layer0", "layer1", "scalar_mix"], kind="sentence")
    layer0, layer1, mix = (r.test for r in results)
    assert layer1 >= 0.9 and mix >= 0.9 and layer0 < 0.6
    assert results[1].per_sentence_test["total"] == [1] * len(splits[2].labels)
    assert [len(p) for p in results[1].test_predictions] == [1] * len(splits[2].labels)


@pytest.mark.parametrize("root", ["learned", "zeros"])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_pair_table_heads_equal_mixing_then_classifying(kind: str, root: str) -> None:
    """Pair heads read ``[dep; head; dep * head]`` of each layer mix from a table made once per
    split (a head's first map split by the blocks of its input, the root's terms added on the rows
    headed by the root, a learned mix mixing the table's layers): their logits and gradients are
    those of the reference computation, each head's input mixed from the features and joined on
    the step (``PairProbes._pair_logits``), for every kind of input (a layer, the mean, a learned
    mix, a concatenation, layer 0 beside a fixed or a learned mix)."""
    train, dev, test = (_split(n, seed, pair=True)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    settings = dataclasses.replace(FAST, kind=kind, hidden_dim=8, root=root)
    modes = ["layer0", "layer1", "layer2", "mean", "scalar_mix", "concat"]
    heads = [Head(FeatureMode(mode), seed) for mode in modes for seed in (1, 2)]
    heads += [Head(FeatureMode(m), s, baseline=True) for m, s in (("layer2", 1), ("mean", 2))]
    heads += [Head(FeatureMode.SCALAR_MIX, seed, baseline=True) for seed in (1, 2)]
    splits = {"train": train, "dev": dev, "test": test}
    vocabulary = LabelVocabulary([*LABELS, "root"])
    probes = PairProbes(heads, splits, vocabulary, "accuracy", settings)
    assert len(probes.table_blocks) == len(probes.parts) == 5
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # learned mixes and root vectors away from their start
        for part in probes.parts:
            assert part.root is not None
            if part.root.vector.requires_grad:
                part.root.vector.normal_(generator=generator)
            if part.mix is not None:
                part.mix.w.normal_(generator=generator)
                part.mix.gamma.uniform_(0.5, 2.0, generator=generator)
    probes.eval()  # no dropout: both computations see the same network
    batches = [torch.arange(0, 24), torch.arange(101, 125)]  # a minibatch per seed, root rows in
    active = torch.ones(len(heads), dtype=torch.bool)
    active[4] = False  # a stopped head
    layers, is_root = probes._pair_rows(train, batches)
    assert is_root.sum() >= 4
    weights = torch.randn(len(heads), 24, len(LABELS) + 1, generator=generator)
    gradients = []
    for computation in ("table", "reference"):
        probes.zero_grad()
        total, numbered = torch.zeros(()), []
        for part, local, numbers, logits in probes._part_logits(
            "train", batches, probes.seed_group, active
        ):
            if computation == "reference":
                groups = probes.seed_group[numbers]
                reference = probes._pair_logits(part, layers, is_root, groups, local)
                torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)
                logits = reference
            total = total + (logits * weights[numbers]).sum()
            numbered += numbers.tolist()
        assert sorted(numbered) == [h for h in range(len(heads)) if h != 4]
        total.backward()
        gradients.append(
            {n: p.grad.clone() for n, p in probes.named_parameters() if p.grad is not None}
        )
    assert gradients[0].keys() == gradients[1].keys()
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradient, gradients[1][name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("pair", [False, True])
def test_bf16_mixed_probes_learn_as_float32_ones_do(pair: bool) -> None:
    """bf16-mixed (``probe.precision``, chosen by ``auto`` on CPUs with native bf16): the
    features and matrix products in bf16, so the losses differ from float32's in their low
    digits, and the probes learn the task as well."""
    splits = tuple(_split(n, seed, pair=pair)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    vocabulary = LabelVocabulary([*LABELS, "root"] if pair else LABELS)
    modes = ["layer1", "scalar_mix", "concat"]
    exact = _train(splits, modes, vocabulary=vocabulary)
    bf16 = _train(
        splits,
        modes,
        vocabulary=vocabulary,
        settings=dataclasses.replace(FAST, precision="bf16-mixed"),
    )
    for ours, theirs in zip(bf16, exact, strict=True):
        assert ours.test >= 0.9 and ours.test == pytest.approx(theirs.test, abs=0.03)
        assert ours.history[0].train_loss == pytest.approx(theirs.history[0].train_loss, rel=0.02)
    assert [r.history[0].train_loss for r in bf16] != [r.history[0].train_loss for r in exact]


def test_probe_precision_auto_follows_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from elmolab.core import hardware
    from elmolab.probing.settings import probe_precision

    auto = dataclasses.replace(FAST, precision="auto")
    monkeypatch.setattr(hardware, "_cpuinfo_fields", lambda: {"model name": "X", "flags": "avx2"})
    assert probe_precision(auto).precision == "32-true"
    flags = {"model name": "X", "flags": "avx2 avx512f avx512_bf16"}
    monkeypatch.setattr(hardware, "_cpuinfo_fields", lambda: flags)
    choice = probe_precision(auto)
    assert choice.precision == "bf16-mixed" and "avx512_bf16" in choice.reason
    assert probe_precision(FAST).reason == "set in the config (probe.precision)"
    with pytest.raises(ElmolabError, match=r"probe.precision must be one of auto, 32-true, bf16"):
        dataclasses.replace(FAST, precision="16-mixed").check()


def test_same_seed_same_run_other_seed_other_run(splits: tuple[FeatureDataset, ...]) -> None:
    settings = dataclasses.replace(FAST, kind="mlp", hidden_dim=8, max_epochs=3)
    first, second = (
        dataclasses.replace(
            _train(splits, ["scalar_mix"], (7,), settings=settings)[0], wall_seconds=0.0
        )
        for _ in range(2)
    )
    assert first == second
    (other,) = _train(splits, ["scalar_mix"], (8,), settings=settings)
    assert dataclasses.replace(other, wall_seconds=0.0, seed=7) != first


def test_pair_probe_reads_the_head_from_half_precision_features() -> None:
    (train, _), (dev, _), (test, _) = (
        _split(n, seed, pair=True, dtype=torch.float16) for n, seed in ((60, 0), (10, 1), (10, 2))
    )
    assert train.heads is not None and train.heads[:8].tolist() == [*range(1, 8), -1]
    vocabulary = LabelVocabulary([*LABELS, "root"])
    (result,) = _train((train, dev, test), ["layer1"], vocabulary=vocabulary)
    assert result.test >= 0.95


def test_linear_token_step_loss_equals_the_cross_entropy_of_the_heads_logits() -> None:
    """Linear token heads take their step loss straight from each minibatch's product
    (``TokenProbes._linear_step_loss``): each head's loss and every parameter's gradient are the
    reference computation's, the cross-entropy of the head's logits (``_part_logits``) plus its
    mix penalty, with stopped heads left out; their evaluation equals the part-by-part one."""
    train, dev, test = (_split(n, seed)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    settings = dataclasses.replace(FAST, l2_lambda=0.1)
    modes = ["layer0", "layer1", "mean", "scalar_mix", "concat"]
    heads = [Head(FeatureMode(mode), seed) for mode in modes for seed in (1, 2)]
    heads += [Head(FeatureMode("scalar_mix"), 2, baseline=True)]
    probes = _mixed_token_probes(heads, (train, dev, test), settings)
    step = [torch.arange(0, 24), torch.arange(100, 124)]  # a minibatch per seed
    active = torch.ones(len(heads), dtype=torch.bool)
    active[2] = False  # a stopped head
    total, losses, counts = probes._linear_step_loss(step, active)
    expected = torch.zeros(len(heads), dtype=torch.float64)
    reference = torch.zeros(())
    for part, local, numbers, logits in probes._part_logits(
        "train", step, probes.seed_group, active
    ):
        gold = torch.stack([train.labels[batch] for batch in step])[probes.seed_group[numbers]]
        head_losses = F.cross_entropy(logits.transpose(1, 2), gold, reduction="none").mean(dim=1)
        head_losses = head_losses + probes.penalty(part, local)
        expected[numbers] = head_losses.detach().double()
        reference = reference + head_losses.sum()
    torch.testing.assert_close(losses, expected, rtol=1e-6, atol=1e-7)
    assert losses[2] == 0 and counts.tolist() == [24.0] * len(heads)
    parameters = [p for p in probes.parameters() if p.requires_grad]
    mine = torch.autograd.grad(total, parameters, allow_unused=True)
    theirs = torch.autograd.grad(reference, parameters, allow_unused=True)
    for a, b in zip(mine, theirs, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # Evaluation takes every linear head from one product too: the same as part by part.
    probes.eval()
    with torch.no_grad():
        fused = probes.evaluate("dev", active, item_losses=True)
        probes.linear = False  # the path of MLP heads and layer_norm
        by_part = probes.evaluate("dev", active, item_losses=True)
    torch.testing.assert_close(fused.scores, by_part.scores, equal_nan=True)
    torch.testing.assert_close(fused.losses, by_part.losses)
    torch.testing.assert_close(fused.item_losses, by_part.item_losses)
    assert all(torch.equal(a, b) for a, b in zip(fused.predicted, by_part.predicted, strict=True))


def test_pair_probes_train_at_pair_lr_and_token_probes_at_lr() -> None:
    """``probe.pair_lr`` is the pair probes' learning rate and ``probe.lr`` the token probes':
    each kind's fit is the same whatever the other kind's rate, and changes with its own."""
    pair_splits = tuple(_split(n, seed, pair=True)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    token_splits = tuple(_split(n, seed)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    pair_vocabulary = LabelVocabulary([*LABELS, "root"])
    settings = dataclasses.replace(FAST, max_epochs=3, patience=3)

    def histories(splits, vocabulary, lr: float, pair_lr: float) -> list:
        varied = dataclasses.replace(settings, lr=lr, pair_lr=pair_lr)
        results = _train(splits, ["layer1"], vocabulary=vocabulary, settings=varied)
        return [(epoch.train_loss, epoch.dev_loss) for epoch in results[0].history]

    pair = histories(pair_splits, pair_vocabulary, 0.05, 0.01)
    assert histories(pair_splits, pair_vocabulary, 0.3, 0.01) == pair
    assert histories(pair_splits, pair_vocabulary, 0.05, 0.05) != pair
    token = histories(token_splits, None, 0.05, 0.01)
    assert histories(token_splits, None, 0.05, 0.3) == token
    assert histories(token_splits, None, 0.01, 0.01) != token
    rates = dataclasses.replace(settings, lr=0.02, pair_lr=0.07)
    assert probe_kind("pair").schedule(rates).lr == 0.07
    assert probe_kind("token").schedule(rates).lr == 0.02
    with pytest.raises(ValueError, match="unknown probe kind"):
        probe_kind("wsd")


def test_span_metric_selects_on_span_f1_and_reports_untyped_f1(
    splits: tuple[FeatureDataset, ...],
) -> None:
    vocabulary = LabelVocabulary(["B-ADJ", "B-NOUN", "B-VERB"])  # the same ids, as chunks
    (result,) = _train(splits, ["layer1"], vocabulary=vocabulary, metric="span_f1")
    assert result.metric == "span_f1" and result.test >= 0.95
    assert result.test_predictions[0][0].startswith("B-")
    # Every token is a one-token chunk: untyped, every chunk's boundaries are right.
    assert result.extra["test_untyped_f1"] == 1.0 and result.extra["dev_untyped_f1"] == 1.0


def test_span_f1_of_iob1_data_is_conlleval_on_the_written_predictions_whatever_the_scheme(
    splits: tuple[FeatureDataset, ...],
) -> None:
    """The engine scores span F1 on label ids for data read in a tag scheme too (CoNLL-2003's
    IOB1; it used to score decoded strings, seconds per head and epoch): every head's test score
    is conlleval's count (seqeval's default mode) on the predictions it writes in the data's
    scheme, and the scheme changes no score, epoch or prediction's chunks."""
    labels = ["B-MISC", "I-MISC", "O"]  # the ids of LABELS, as IOB2 tags (stray I- included)
    gold = [LabelVocabulary(labels).decode(s.tolist()) for s in _sentence_labels(splits[2])]
    modes = ["layer0", "layer1", "mean"]  # layer 0 is noise: imperfect predictions
    by_scheme = {
        scheme: _train(
            splits, modes, vocabulary=LabelVocabulary(labels, scheme=scheme), metric="span_f1"
        )
        for scheme in (TagScheme.IOB1, None)
    }
    for iob1, plain in zip(by_scheme[TagScheme.IOB1], by_scheme[None], strict=True):
        written_gold = [spans_to_tags(_spans(s), len(s), TagScheme.IOB1) for s in gold]
        assert iob1.test == pytest.approx(span_f1(written_gold, iob1.test_predictions), abs=1e-12)
        assert (iob1.dev, iob1.test, iob1.best_epoch) == (plain.dev, plain.test, plain.best_epoch)
        assert iob1.extra == plain.extra
        assert [_spans(s) for s in iob1.test_predictions] == [
            _spans(s) for s in plain.test_predictions
        ]
    assert min(r.test for r in by_scheme[None]) < 0.9  # the noise layer's chunks are not all right


def _sentence_labels(split: FeatureDataset) -> list[torch.Tensor]:
    return list(split.labels.split(split.sentence_lengths))


def _spans(tags: list[str]) -> list[tuple[int, int, str]]:
    """conlleval's chunks of one sentence's tags, [start, end) and type."""
    return [(start, end + 1, kind) for kind, start, end in get_entities(list(tags))]


def test_a_tied_dev_score_selects_on_the_dev_loss() -> None:
    """A dev span F1 that stays 0 (no chunk in dev) must not keep epoch 1: the dev loss decides."""
    splits = tuple(_split(n, seed)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    vocabulary = LabelVocabulary(["O", "I-NOUN", "I-VERB"])  # I- after O: conlleval chunks
    rng = np.random.default_rng(5)
    layers = rng.normal(size=(3, 80, 6)).astype(np.float32)
    outside = vocabulary.encode([["O"]])[0][0]  # the labels are sorted: 2
    layers[1, :, outside] += 4.0  # every dev token of the class of "O": no chunk, span F1 0
    labels = torch.full((80,), outside, dtype=torch.long)
    no_chunks = FeatureDataset(torch.from_numpy(layers), labels, (8,) * 10)
    settings = dataclasses.replace(FAST, lr=0.01, max_epochs=6, patience=6)
    (result,) = _train(
        (splits[0], no_chunks, splits[2]),
        ["layer1"],
        vocabulary=vocabulary,
        metric="span_f1",
        settings=settings,
    )
    assert {epoch.dev_metric for epoch in result.history} == {0.0}
    losses = [epoch.dev_loss for epoch in result.history]
    assert result.best_epoch == 1 + losses.index(min(losses)) and result.best_epoch > 1


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


def test_a_head_stops_at_its_max_stalls_th_epoch_without_progress() -> None:
    """``max_stalls`` stops a head at its n-th epoch without progress in all, in a row or not, and
    cuts the run short without changing it: the history is the unlimited run's, up to there."""
    splits = tuple(_split(n, seed)[0] for n, seed in ((40, 0), (10, 1), (10, 2)))
    free_settings = dataclasses.replace(
        FAST, lr=0.3, max_epochs=12, patience=12, max_stalls=12, min_delta=0.015
    )
    (free,) = _train(splits, ["layer1"], settings=free_settings)
    assert free.epochs == 12
    stalls, mark = [], None
    for epoch in free.history:
        score, loss = epoch.dev_metric, epoch.dev_loss
        if mark is None or made_progress(score, loss, mark, free_settings.min_delta, False):
            mark = (score, loss)
        else:
            stalls.append(epoch.epoch)
    assert len(stalls) >= 3 and stalls[2] - stalls[0] > 2  # not all in a row
    (cut,) = _train(splits, ["layer1"], settings=dataclasses.replace(free_settings, max_stalls=3))
    assert cut.epochs == stalls[2] and not cut.hit_epoch_cap
    assert cut.history == free.history[: stalls[2]]
    kept = max(cut.history, key=lambda epoch: (epoch.dev_metric, -epoch.dev_loss))
    assert cut.best_epoch == kept.epoch
