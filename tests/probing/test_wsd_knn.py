"""WSD 1-NN on a tiny hand-made example: centroids, the nearest sense, back-off, scores."""

import pytest
import torch

from elmolab.core.errors import ElmolabError
from elmolab.io.results import FeatureMode
from elmolab.probing.wsd import (
    first_sense_keys,
    fit_sense_centroids,
    per_sentence_counts,
    predict_senses,
    score_senses,
    wsd_vectors,
)

BANK = ("bank", "NOUN")
CANDIDATES = {
    BANK: ["bank%1:14:00::", "bank%1:17:01::", "bank%1:04:00::"],
    ("run", "VERB"): ["run%2:38:00::", "run%2:38:04::"],
}
FIRST_SENSE = {BANK: "bank%1:14:00::", ("run", "VERB"): "run%2:38:00::"}


def test_centroids_average_each_key_and_count_multi_key_occurrences_for_all() -> None:
    vectors = torch.tensor([[2.0, 0.0], [0.0, 2.0], [4.0, 2.0], [0.0, 3.0]])
    keys = [["a"], ["a", "b"], ["a"], ["b"]]
    centroids = fit_sense_centroids(vectors, keys)
    # a: mean of (2, 0), (0, 2), (4, 2) = (2, 4/3); b: mean of (0, 2), (0, 3) = (0, 2.5)
    a = torch.tensor([2.0, 4 / 3])
    torch.testing.assert_close(centroids.directions[centroids.rows["a"]], a / a.norm())
    torch.testing.assert_close(centroids.directions[centroids.rows["b"]], torch.tensor([0.0, 1.0]))
    assert centroids.counts.tolist() == [3, 2]


def test_nearest_is_by_cosine_among_candidates_with_centroids_else_first_sense() -> None:
    financial, river, _ = CANDIDATES[BANK]
    # a small financial centroid along x, a large river one at (10, 3); building has no centroid
    centroids = fit_sense_centroids(
        torch.tensor([[1.0, 0.0], [10.0, 3.0], [5.0, 5.0]]),
        [[financial], [river], ["other%1:00:00::"]],
    )
    instances = torch.tensor([[9.0, 0.0], [1.0, 0.4], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    lemma_pos = [BANK, BANK, BANK, ("run", "VERB"), ("sing", "VERB")]
    predictions = predict_senses(centroids, instances, lemma_pos, CANDIDATES, FIRST_SENSE)
    assert [(p.key, p.source) for p in predictions] == [
        (financial, "nearest"),  # cosine 1 vs 0.96, though (10, 3) is nearer in Euclid
        (river, "nearest"),
        (river, "nearest"),  # "other" is nearer but not a candidate of bank
        ("run%2:38:00::", "first_sense"),  # no candidate of run has a centroid
        (None, "unanswered"),  # sing is not in the inventory
    ]


def test_scores_follow_raganato() -> None:
    gold = [{"a", "b"}, {"c"}, {"d"}, {"e"}]
    scores = score_senses(["b", "x", None, "e"], gold)  # any gold key counts
    assert (scores.correct, scores.answered, scores.total) == (2, 3, 4)
    assert scores.precision == pytest.approx(2 / 3)
    assert scores.recall == pytest.approx(1 / 2)
    assert scores.f1 == pytest.approx(2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2))
    assert score_senses([None], [{"a"}]).f1 == 0.0


def test_1nn_with_back_off_answers_everything() -> None:
    financial, river, _ = CANDIDATES[BANK]
    train_layers = torch.zeros(3, 4, 2)  # (layers, occurrences, dim): only layer 1 knows
    train_layers[1] = torch.tensor([[1.0, 0.1], [0.9, 0.0], [0.1, 1.0], [0.0, 0.8]])
    eval_layers = torch.zeros(3, 3, 2)
    eval_layers[1] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    keys = [[financial], [financial], [river], [river]]
    centroids = fit_sense_centroids(wsd_vectors(train_layers, FeatureMode.LAYER1), keys)
    predictions = predict_senses(
        centroids,
        wsd_vectors(eval_layers, FeatureMode.LAYER1),
        [BANK, BANK, ("run", "VERB")],
        CANDIDATES,
        FIRST_SENSE,
    )
    assert [p.key for p in predictions] == [financial, river, "run%2:38:00::"]
    assert [p.source for p in predictions].count("first_sense") == 1
    scores = score_senses([p.key for p in predictions], [{financial}, {river}, {"run%2:38:04::"}])
    assert scores.precision == scores.recall == scores.f1 == pytest.approx(2 / 3)


def test_learned_mix_does_not_apply() -> None:
    with pytest.raises(ElmolabError, match="scalar_mix does not apply"):
        wsd_vectors(torch.zeros(3, 1, 2), FeatureMode.SCALAR_MIX)


def test_first_sense_baseline_scores_wordnets_sense_1_on_the_same_instances() -> None:
    financial, river, _ = CANDIDATES[BANK]
    lemma_pos = [BANK, BANK, ("run", "VERB"), ("sing", "VERB")]
    gold = [{financial}, {river}, {"run%2:38:00::", "run%2:38:04::"}, {"sing%2:36:00::"}]
    keys = first_sense_keys(lemma_pos, FIRST_SENSE)
    assert keys == [financial, financial, "run%2:38:00::", None]  # sing: not in WordNet
    scores = score_senses(keys, gold)
    # 2 correct (bank 1, run: any gold key counts) of 3 answered, 4 instances
    assert (scores.correct, scores.answered, scores.total) == (2, 3, 4)
    assert scores.f1 == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))


def test_per_sentence_counts_split_the_instances_by_sentence() -> None:
    predicted = ["a", "x", None, "d", "e"]
    gold = [{"a"}, {"b"}, {"c"}, {"d"}, {"e", "f"}]
    correct, total = per_sentence_counts(predicted, gold, [2, 0, 1, 2])
    assert (correct, total) == ([1, 0, 0, 2], [2, 0, 1, 2])
    assert sum(correct) / sum(total) == score_senses(predicted, gold).recall
    with pytest.raises(ValueError, match="5 predictions"):
        per_sentence_counts(predicted, gold, [2, 2])
