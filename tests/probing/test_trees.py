"""Tree probes: tree distances, spanning trees, UUAS and DSpr against independent computations,
and the deparc and structural probes learning from synthetic features, deterministically."""

import dataclasses
import json
from collections import deque

import numpy as np
import pytest
import torch
from conftest import default_probe_settings
from scipy.stats import spearmanr

from elmolab.core.errors import ElmolabError
from elmolab.io.results import FeatureMode
from elmolab.probing.datasets import TreeDataset
from elmolab.probing.engine import train_heads
from elmolab.probing.heads import ProbeResult
from elmolab.probing.kinds.structural import StructuralGold
from elmolab.probing.probes import Head
from elmolab.probing.trees import (
    GoldTrees,
    minimum_spanning_trees,
    padded_batches,
    plan_batches,
    tree_distances,
)


def spanning_tree(distances: np.ndarray, keep: np.ndarray | None = None) -> list[tuple[int, int]]:
    """The minimum spanning tree of one graph (over its ``keep`` words)."""
    if keep is None:
        keep = np.ones(len(distances), dtype=bool)
    return minimum_spanning_trees(distances[None], keep[None])[0]


def uuas(predicted, gold, punct):
    return GoldTrees(gold, punct).uuas(predicted)


def distance_spearman(predicted, gold):
    return GoldTrees(gold, [np.zeros(len(d), dtype=bool) for d in gold]).spearman(predicted)


_DEFAULT = default_probe_settings()
FAST = dataclasses.replace(
    _DEFAULT,
    precision="32-true",  # the reference arithmetic on every CPU; bf16-mixed is tested by name
    mix_lr=0.05,  # few steps an epoch here: the mix needs larger ones than on real data
    tree=dataclasses.replace(
        _DEFAULT.tree, lr=1e-2, batch_tokens=128, max_epochs=30, patience=3, rank=16
    ),
)


def _train(splits, kind: str, modes: list[str], seeds=(0,), settings=FAST) -> list[ProbeResult]:
    heads = [Head(FeatureMode(mode), seed) for mode in modes for seed in seeds]
    named = dict(zip(("train", "dev", "test"), splits, strict=True))
    return train_heads(heads, named, settings, kind=kind)


def _tree(settings, **changes):
    return dataclasses.replace(settings, tree=dataclasses.replace(settings.tree, **changes))


KEY_DIM, MAX_WORDS, DIM = 8, 9, 32
DISTRACTOR = 0.3


def _random_heads(rng: np.random.Generator, n: int) -> list[int]:
    """A random tree: words join, in a random order, under a word that joined before them."""
    order = rng.permutation(n)
    heads = [0] * n
    for k in range(1, n):
        heads[order[k]] = int(order[rng.integers(0, k)]) + 1
    return heads


def _bfs_distances(heads: list[int]) -> np.ndarray:
    """Tree distances by breadth-first search from every word: the reference computation."""
    n = len(heads)
    neighbours: list[list[int]] = [[] for _ in range(n + 1)]  # node 0 is the root
    for word, head in enumerate(heads, start=1):
        neighbours[word].append(head)
        neighbours[head].append(word)
    distances = np.zeros((n, n), dtype=np.int64)
    for start in range(1, n + 1):
        seen, queue = {start: 0}, deque([start])
        while queue:
            node = queue.popleft()
            for other in neighbours[node]:
                if other not in seen:
                    seen[other] = seen[node] + 1
                    queue.append(other)
        distances[start - 1] = [seen[word] for word in range(1, n + 1)]
    return distances


def _split(n_sentences: int, seed: int, *, noise: float = 0.1) -> TreeDataset:
    """Random trees of 5..9 words, dim 32; only layer 1 tells the tree (linearly), 0/2 are noise.

    Layers 0 and 2 are Gaussian noise of standard deviation ``DISTRACTOR``. Layer 1 mixes,
    through one fixed random orthonormal projection, a random key per word, the key of its head
    (a fixed root key for the root word) and its tree position: the sum of one unit vector per
    word on its path from the root, so that squared distances between positions are tree
    distances; plus noise of standard deviation ``noise``. The last word of each sentence is
    punctuation.
    """
    mixing = np.random.default_rng(1234)
    rotation = np.linalg.qr(mixing.normal(size=(DIM, DIM)))[0]  # (dim, dim) orthogonal
    projection = rotation[: 2 * KEY_DIM + MAX_WORDS]  # (2 * key + MAX_WORDS, dim) orthonormal rows
    root_key = mixing.normal(size=KEY_DIM)
    rng = np.random.default_rng(seed)
    features, heads, punct = [], [], []
    for _ in range(n_sentences):
        n = int(rng.integers(5, MAX_WORDS + 1))
        sentence_heads = _random_heads(rng, n)
        parent = np.array(sentence_heads) - 1  # (n,)
        keys = rng.normal(size=(n, KEY_DIM))  # (n, key)
        head_keys = np.where(parent[:, None] < 0, root_key, keys[parent])  # (n, key)
        positions = np.zeros((n, MAX_WORDS))  # (n, MAX_WORDS)
        for word in range(n):
            step = word
            while step >= 0:
                positions[word, step] = 1.0
                step = parent[step]
        layers = DISTRACTOR * rng.normal(size=(3, n, DIM))  # (layers, n, dim)
        signal = np.concatenate([keys, head_keys, positions], axis=1) @ projection  # (n, dim)
        layers[1] = signal + noise / DISTRACTOR * layers[1]
        features.append(torch.from_numpy(layers).float())
        heads.append(sentence_heads)
        punct.append([False] * (n - 1) + [True])
    return TreeDataset.from_sentences(features, heads, punct)


@pytest.fixture(scope="module")
def splits() -> tuple[TreeDataset, TreeDataset, TreeDataset]:
    return _split(200, 0), _split(40, 1), _split(40, 2)


# --- Trees and metrics --------------------------------------------------------------------------


def test_tree_distances_of_a_known_tree() -> None:
    # Word 2 is the root; 1 and 3 hang from it, 4 from 3.
    assert tree_distances([2, 0, 2, 3]).tolist() == [
        [0, 1, 2, 3],
        [1, 0, 1, 2],
        [2, 1, 0, 1],
        [3, 2, 1, 0],
    ]
    assert tree_distances([0, 0]).tolist() == [[0, 2], [2, 0]]  # two root words meet at the root
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 40, 160):
        heads = _random_heads(rng, n)
        assert np.array_equal(tree_distances(heads), _bfs_distances(heads))
    with pytest.raises(ValueError, match="do not form a tree"):
        tree_distances([2, 1, 0])


def test_spanning_tree_of_gold_distances_is_the_gold_tree() -> None:
    rng = np.random.default_rng(1)
    for n in (2, 5, 30, 100):
        heads = _random_heads(rng, n)
        arcs = {tuple(sorted((word, head - 1))) for word, head in enumerate(heads) if head > 0}
        gold = tree_distances(heads)
        assert set(spanning_tree(gold.astype(float))) == arcs
        # Predicted distances that keep the gold order (here squared and shifted) score 1.
        report = uuas([gold.astype(np.float32) ** 2 + 0.5], [gold], [np.zeros(n, dtype=bool)])
        assert report.score == 1.0 and report.correct == report.total == [n - 1]


def test_spanning_tree_breaks_ties_by_lowest_index() -> None:
    equal = np.ones((4, 4)) - np.eye(4)
    assert spanning_tree(equal) == [(0, 1), (0, 2), (0, 3)]
    assert spanning_tree(np.zeros((1, 1))) == []
    with pytest.raises(ValueError, match="must be finite"):
        spanning_tree(np.full((2, 2), np.inf))


def _prim(distances: np.ndarray) -> list[tuple[int, int]]:
    """A plain one-graph Prim, the reference: grows from word 0, ties to the lowest index."""
    n = len(distances)
    symmetric = np.triu(distances, 1) + np.triu(distances, 1).T
    in_tree, edges = {0}, []
    while len(in_tree) < n:
        best = None
        for j in range(n):  # the lowest-indexed nearest outside word ...
            if j in in_tree:
                continue
            near = min(symmetric[i, j] for i in in_tree)
            if best is None or near < best[0]:
                best = (near, j)
        near, j = best
        i = min(i for i in in_tree if symmetric[i, j] == near)  # ... to its lowest tree word
        edges.append((min(i, j), max(i, j)))
        in_tree.add(j)
    return edges


def test_spanning_trees_side_by_side_equal_one_graph_prim() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 7, 12):
        k = 9
        # Small integers: many ties, which the order of Prim's choices must break alike.
        distances = rng.integers(0, 4, size=(k, n, n)).astype(np.float32)
        keep = rng.random((k, n)) < 0.7
        found = minimum_spanning_trees(distances, keep)
        for graph in range(k):
            kept = np.flatnonzero(keep[graph])
            sub = distances[graph][np.ix_(kept, kept)]
            expected = [(int(kept[i]), int(kept[j])) for i, j in _prim(sub)] if len(kept) else []
            assert found[graph] == expected
    # Left-out words may hold anything, kept pairs must be finite.
    distances = np.full((1, 3, 3), np.nan)
    distances[0, 0, 2] = 1.0
    assert minimum_spanning_trees(distances, np.array([[True, False, True]])) == [[(0, 2)]]
    with pytest.raises(ValueError, match="finite"):
        minimum_spanning_trees(distances, np.ones((1, 3), dtype=bool))


def test_gold_trees_score_each_sentence_as_alone() -> None:
    rng = np.random.default_rng(4)
    gold = [tree_distances(_random_heads(rng, n)) for n in (5, 7, 5, 9, 2, 7)]
    punct = [rng.random(len(d)) < 0.2 for d in gold]
    predicted = [d + rng.normal(scale=1.5, size=d.shape) for d in gold]
    report = GoldTrees(gold, punct).uuas(predicted)
    for s in range(len(gold)):
        alone = uuas([predicted[s]], [gold[s]], [punct[s]])
        assert (report.correct[s], report.total[s]) == (alone.correct[0], alone.total[0])
        assert report.predicted_edges[s] == alone.predicted_edges[0]
    with pytest.raises(ValueError, match="sentence 1: predicted distances"):
        GoldTrees(gold, punct).uuas([predicted[0], predicted[0], *predicted[2:]])


def test_uuas_of_a_hand_made_case_is_micro_averaged() -> None:
    chain = tree_distances([0, 1, 2, 3])  # 1 - 2 - 3 - 4
    star = np.array([[0, 1, 1, 1], [1, 0, 2, 2], [1, 2, 0, 2], [1, 2, 2, 0]], dtype=np.float32)
    no_punct = np.zeros(4, dtype=bool)
    report = uuas([star, chain.astype(np.float32)], [chain, chain], [no_punct, no_punct])
    assert report.predicted_edges[0] == [(0, 1), (0, 2), (0, 3)]  # only (0, 1) is gold
    assert (report.correct, report.total) == ([1, 3], [3, 3])
    # micro: (1 + 3) / (3 + 3), not the mean of 1/3 and 1; the per-sentence sums give it exactly
    assert report.score == 4 / 6 == sum(report.correct) / sum(report.total)


def test_uuas_leaves_out_punctuation() -> None:
    gold = tree_distances([2, 0, 2, 2])  # 1, 3 and 4 hang from 2; 4 is punctuation
    punct = np.array([False, False, False, True])
    predicted = gold.astype(np.float32)
    predicted[3, :3] = predicted[:3, 3] = [5.0, 5.0, 0.1]  # would attach 4 to 3
    report = uuas([predicted], [gold], [punct])
    assert report.predicted_edges == [[(0, 1), (1, 2)]] and report.score == 1.0
    assert (report.correct, report.total) == ([2], [2])  # 4's edge neither counted nor recovered
    # Punctuation inside the tree: the gold edge between the words it joins is their MST edge.
    chain = tree_distances([2, 3, 0])  # 1 - 2 - 3 with 2 punctuation
    assert spanning_tree(chain, np.array([True, False, True])) == [(0, 2)]
    # Fewer than 2 non-punctuation words: no edges, nothing counted.
    single = uuas([np.zeros((2, 2))], [tree_distances([0, 1])], [np.array([False, True])])
    assert (single.correct, single.total) == ([0], [0]) and np.isnan(single.score)
    only_punct = uuas([np.zeros((1, 1))], [tree_distances([0])], [np.array([True])])
    assert (only_punct.correct, only_punct.total) == ([0], [0])  # e.g. a sentence "..."


def test_distance_spearman_macro_averages_lengths_5_to_50() -> None:
    rng = np.random.default_rng(2)
    gold = [tree_distances(_random_heads(rng, n)) for n in (5, 5, 6, 4, 51)]
    perfect = [distances.astype(np.float32) * 2 for distances in gold]
    assert distance_spearman(perfect, gold) == pytest.approx(1.0)
    # The length-4 and length-51 sentences do not count, however bad their predictions.
    worse = [*perfect[:3], -perfect[3], -perfect[4]]
    assert distance_spearman(worse, gold) == pytest.approx(1.0)
    assert np.isnan(distance_spearman(perfect[3:4], gold[3:4]))
    # Against scipy: words averaged within a length, then lengths averaged.
    noisy = [d + rng.normal(scale=2.0, size=d.shape) for d in gold[:3]]
    rho = [
        np.mean([spearmanr(p, g).statistic for p, g in zip(pred, true, strict=True)])
        for pred, true in zip(noisy, gold[:3], strict=True)
    ]
    expected = np.mean([(rho[0] + rho[1]) / 2, rho[2]])
    assert distance_spearman(noisy, gold[:3]) == pytest.approx(expected)


# --- Datasets and batches -----------------------------------------------------------------------


def test_tree_dataset_concatenates_sentences_and_checks_input() -> None:
    first, second = np.zeros((3, 2, 4), dtype=np.float32), torch.ones(3, 3, 4)
    dataset = TreeDataset.from_sentences(
        [first, second], [[2, 0], [0, 1, 1]], [[False, True], [False, False, True]]
    )
    assert dataset.features.shape == (3, 5, 4) and dataset.sentence_lengths == (2, 3)
    assert dataset.heads.tolist() == [2, 0, 0, 1, 1]
    assert dataset.punct.tolist() == [False, True, False, False, True]
    with pytest.raises(ElmolabError, match=r"^x.hdf5: sentence 1: head 4 of word 2 outside 0\.\.3"):
        TreeDataset.from_sentences(
            [first, second], [[2, 0], [0, 4, 1]], [[False] * 2, [False] * 3], path="x.hdf5"
        )
    with pytest.raises(ElmolabError, match=r"^x.hdf5: 2 sentences of features but 1 of heads"):
        TreeDataset.from_sentences([first, second], [[2, 0]], [[False] * 2], path="x.hdf5")
    with pytest.raises(ElmolabError, match=r"^x.hdf5: sentence 0: 2 feature vectors but 3 heads"):
        TreeDataset.from_sentences([first], [[2, 0, 0]], [[False] * 2], path="x.hdf5")
    with pytest.raises(
        ElmolabError, match=r"^x.hdf5: sentence 0: .* \(word 1 never reaches the root\)"
    ):
        TreeDataset.from_sentences([first], [[2, 1]], [[False] * 2], path="x.hdf5")
    with pytest.raises(ElmolabError, match=r"sentence 1: features of shape \(2, 3, 4\)"):
        TreeDataset.from_sentences(
            [first, torch.ones(2, 3, 4)], [[2, 0], [0, 1, 1]], [[False] * 2, [False] * 3]
        )


def test_batches_hold_whole_sentences_of_similar_length() -> None:
    lengths = [3, 9, 1, 4, 4, 12, 2]
    plan = plan_batches(lengths, batch_tokens=12)
    sentences = torch.cat([batch.sentences for batch in plan]).tolist()
    assert sorted(sentences) == list(range(len(lengths)))
    assert [lengths[s] for s in sentences] == sorted(lengths)  # sorted by length
    assert all(batch.mask.numel() <= 12 for batch in plan)
    offsets = np.cumsum([0, *lengths])
    layers = torch.arange(3 * 35 * 2, dtype=torch.float16).reshape(3, 35, 2)
    mixed = layers[1].float()  # (tokens, dim)
    seen = []
    for number, padded in padded_batches(layers, plan, torch.Generator().manual_seed(0)):
        batch = plan[number]
        assert padded.dtype == torch.float32 and padded.shape[:3] == (3, *batch.mask.shape)
        for slot, sentence in enumerate(batch.sentences.tolist()):
            n = lengths[sentence]
            assert batch.mask[slot].sum() == n
            rows = layers[:, offsets[sentence] : offsets[sentence] + n].float()
            assert torch.equal(padded[:, slot, :n], rows)
        seen.append(number)
    assert sorted(seen) == list(range(len(plan))) and seen != sorted(seen)
    numbers = [number for number, padded in padded_batches(mixed, plan)]
    assert numbers == list(range(len(plan)))


# --- Probes -------------------------------------------------------------------------------------


def test_arc_probe_finds_heads(splits: tuple[TreeDataset, ...]) -> None:
    train, dev, test = (
        dataclasses.replace(split, features=split.features.half()) for split in splits
    )
    (result,) = _train((train, dev, test), "arc", ["layer1"])
    assert result.metric == "uas" and result.test > 0.85  # chance is about 1 / 7
    assert result.dev == max(epoch.dev_metric for epoch in result.history)
    assert result.history[result.best_epoch - 1].dev_metric == result.dev
    assert [len(heads) for heads in result.test_predictions] == list(test.sentence_lengths)
    predicted = [int(head) for heads in result.test_predictions for head in heads]
    assert np.mean(np.array(predicted) == test.heads.numpy()) == pytest.approx(result.test)
    correct, total = result.per_sentence_test["correct"], result.per_sentence_test["total"]
    assert total == list(test.sentence_lengths)
    assert sum(correct) / sum(total) == pytest.approx(result.test)
    assert json.loads(json.dumps(dataclasses.asdict(result)))["metric"] == "uas"
    (noise,) = _train(splits, "arc", ["layer0"])
    assert noise.test < 0.5 and noise.mix_weights == [1.0, 0.0, 0.0]
    zeros = dataclasses.replace(FAST, root="zeros")  # root scores fixed at 0: still learnable
    assert _train(splits, "arc", ["layer1"], settings=zeros)[0].test > 0.85


def test_structural_probe_recovers_trees(splits: tuple[TreeDataset, ...]) -> None:
    (result,) = _train(splits, "structural", ["layer1"])
    test = splits[2]
    assert result.metric == "uuas" and result.test > 0.8 and result.dev > 0.8
    assert result.extra["test_dspr"] > 0.8 and result.extra["dev_dspr"] > 0.8
    # History records the dev loss, which selects the epoch: lower is better.
    assert result.history[result.best_epoch - 1].dev_metric == min(
        epoch.dev_metric for epoch in result.history
    )
    correct, total = result.per_sentence_test["correct"], result.per_sentence_test["total"]
    assert total == [n - 2 for n in test.sentence_lengths]  # the last word is punctuation
    assert sum(correct) / sum(total) == result.test
    first = result.test_predictions[0]
    assert len(first) == total[0] and all(
        int(e.split("-")[0]) < int(e.split("-")[1]) for e in first
    )
    assert json.loads(json.dumps(dataclasses.asdict(result)))["extra"].keys() == {
        "dev_dspr",
        "test_dspr",
    }


def test_structural_gold_made_once_gives_the_same_results(
    splits: tuple[TreeDataset, ...],
) -> None:
    """The gold side a cell makes once for every job (distances, the dev and test trees' edges
    and ranks) scores as the one each fit would make, and is refused for other sentences."""
    roles = dict(zip(("train", "dev", "test"), splits, strict=True))
    gold = StructuralGold.of(roles)
    assert all(
        "edges" in vars(scorer) and "ranks" in vars(scorer) for scorer in gold.scorers.values()
    )
    heads = [Head(FeatureMode.LAYER1, 0)]
    shared = train_heads(heads, roles, FAST, kind="structural", shared=gold)
    own = train_heads(heads, roles, FAST, kind="structural")
    untimed = [dataclasses.replace(result, wall_seconds=0.0) for result in (*shared, *own)]
    assert untimed[0] == untimed[1]
    other = {**roles, "dev": roles["train"]}  # other sentences in the dev role
    with pytest.raises(ValueError, match="gold distances of dev are not of its sentences"):
        train_heads(heads, other, FAST, kind="structural", shared=gold)


@pytest.mark.parametrize(
    ("kind", "layer_norm", "threshold"),
    # Normalized, the noise layers are as loud as layer 1 and the uniform start of the mix
    # drowns the tree positions: the structural probe then stalls, so it runs unnormalized.
    [("arc", True, 0.85), ("structural", False, 0.45)],
)
def test_scalar_mix_learns_to_weight_the_informative_layer(
    splits: tuple[TreeDataset, ...], kind: str, layer_norm: bool, threshold: float
) -> None:
    settings = dataclasses.replace(FAST, layer_norm=layer_norm, l2_lambda=1e-3)
    result, frozen = _train(splits, kind, ["scalar_mix", "mean"], settings=settings)
    assert result.mix_weights is not None and sum(result.mix_weights) == pytest.approx(1)
    assert result.mix_weights[1] == max(result.mix_weights) and result.gamma is not None
    assert result.test > threshold
    assert frozen.mix_weights == pytest.approx([1 / 3] * 3) and result.test > frozen.test


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("kind", ["arc", "structural"])
def test_heads_trained_together_equal_each_trained_alone(
    splits: tuple[TreeDataset, ...], kind: str, precision: str
) -> None:
    """Tree heads of a joint fit (each mode and seed, batches visited in each seed's order) end
    where each alone ends, epoch for epoch, up to rounding, in either precision."""
    small = tuple(dataclasses.replace(s, features=s.features[:, :, :16]) for s in splits)
    small = tuple(
        TreeDataset(s.features.contiguous(), s.sentence_lengths, s.heads, s.punct) for s in small
    )
    settings = _tree(FAST, max_epochs=4, patience=1, lr_decay=0.5)
    settings = dataclasses.replace(settings, layer_norm=True, l2_lambda=1e-3, precision=precision)
    modes = ["layer1", "mean", "scalar_mix", "concat"]
    together = _train(small, kind, modes, (1, 2), settings=settings)
    for result in together:
        (alone,) = _train(small, kind, [result.features], (result.seed,), settings=settings)
        assert (result.best_epoch, result.epochs) == (alone.best_epoch, alone.epochs)
        assert result.dev == pytest.approx(alone.dev, abs=1e-9)
        assert result.test == pytest.approx(alone.test, abs=1e-9)
        for mine, theirs in zip(result.history, alone.history, strict=True):
            assert mine.train_loss == pytest.approx(theirs.train_loss, rel=1e-5)
            assert mine.dev_loss == pytest.approx(theirs.dev_loss, rel=1e-5)


@pytest.mark.parametrize(("kind", "threshold"), [("arc", 0.85), ("structural", 0.75)])
def test_bf16_mixed_tree_probes_learn_as_float32_ones_do(
    splits: tuple[TreeDataset, ...], kind: str, threshold: float
) -> None:
    """bf16-mixed: the bilinear and projection products in bf16, scores and distances in float32;
    the losses differ from float32's in their low digits and the probes find the trees."""
    modes = ["layer1", "concat"]
    exact = _train(splits, kind, modes)
    bf16 = _train(splits, kind, modes, settings=dataclasses.replace(FAST, precision="bf16-mixed"))
    for ours, theirs in zip(bf16, exact, strict=True):
        assert ours.test > threshold and theirs.test > threshold
        assert ours.history[0].train_loss == pytest.approx(theirs.history[0].train_loss, rel=0.02)
    assert [r.history[0].train_loss for r in bf16] != [r.history[0].train_loss for r in exact]


@pytest.mark.parametrize("kind", ["arc", "structural"])
@pytest.mark.parametrize("mode", ["scalar_mix", "concat"])
def test_same_seed_same_run(splits: tuple[TreeDataset, ...], kind: str, mode: str) -> None:
    settings = _tree(FAST, max_epochs=2)
    first, second = (
        dataclasses.replace(_train(splits, kind, [mode], (3,), settings)[0], wall_seconds=0.0)
        for _ in range(2)
    )
    assert first == second
    (other,) = _train(splits, kind, [mode], (4,), settings)
    assert dataclasses.replace(other, wall_seconds=0.0, seed=3) != first


def test_settings_reject_bad_values() -> None:
    with pytest.raises(ElmolabError, match=r"probe.root must be 'learned' or 'zeros', got 'none'"):
        dataclasses.replace(FAST, root="none").check()
    with pytest.raises(ElmolabError, match=r"probe.tree.rank must be at least 1, got 0"):
        _tree(FAST, rank=0).check()


def test_splits_must_agree_on_layers_and_dim(splits: tuple[TreeDataset, ...]) -> None:
    train, dev, test = splits
    narrow = dataclasses.replace(dev, features=dev.features[:, :, :8])
    with pytest.raises(ValueError, match=r"dev features are \(3, tokens, 8\), train's"):
        _train((train, narrow, test), "arc", ["layer1"])
