"""Supersense tagging: sense keys to WordNet's lexicographer files, the label of a word with keys
in several files, bad keys, and the task's labels from the WSD datasets' sense-tagged words."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import expect_error

from elmolab.core.schema import TaskConfig
from elmolab.data.catalogue import DatasetFormat, SplitSource
from elmolab.data.labels import task_labels
from elmolab.data.wsd import (
    LEXICOGRAPHER_FILES,
    SenseInstance,
    WsdSentence,
    instance_supersense,
    supersense,
)

# Sense keys made by hand, and the lexicographer file each names (WordNet 3.0's lexnames).
HAND_MADE = [
    ("good%3:00:01::", "adj.all"),  # 00
    ("atomic%3:01:00::", "adj.pert"),  # 01
    ("quickly%4:02:00::", "adv.all"),  # 02
    ("entity%1:03:00::", "noun.Tops"),  # 03
    ("dog%1:05:00::", "noun.animal"),  # 05
    ("person%1:03:00::", "noun.Tops"),
    ("teacher%1:18:00::", "noun.person"),  # 18
    ("monday%1:28:00::", "noun.time"),  # 28
    ("run%2:38:00::", "verb.motion"),  # 38
    ("rain%2:43:00::", "verb.weather"),  # 43
    ("peculiar%5:00:00:strange:00", "adj.all"),  # a satellite: ss_type 5, an adjective file
    ("used%5:44:00:secondhand:00", "adj.ppl"),  # 44, the last file
]


@pytest.mark.parametrize(("key", "expected"), HAND_MADE)
def test_supersense_of_hand_made_keys(key: str, expected: str) -> None:
    assert supersense(key) == expected


def test_the_table_is_wordnets_45_files() -> None:
    assert len(LEXICOGRAPHER_FILES) == len(set(LEXICOGRAPHER_FILES)) == 45
    assert LEXICOGRAPHER_FILES[:4] == ("adj.all", "adj.pert", "adv.all", "noun.Tops")
    assert LEXICOGRAPHER_FILES[28:30] == ("noun.time", "verb.body")
    assert LEXICOGRAPHER_FILES[43:] == ("verb.weather", "adj.ppl")
    parts = [name.partition(".")[0] for name in LEXICOGRAPHER_FILES]
    assert parts.count("noun") == 26 and parts.count("verb") == 15 and parts.count("adj") == 3


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("dog%1::00::", "has no lexicographer file number (lex_filenum)"),
        ("dog%1:5:00::", "has no lexicographer file number (lex_filenum)"),
        ("dog%1:45:00::", "names lexicographer file 45, but WordNet has 00-44"),
        ("dog%1:38:00::", "lexicographer file 38 (verb.motion) is not a NOUN file"),
        ("dog%1:05", "malformed sense key"),
    ],
)
def test_bad_keys(key: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        supersense(key)


def _instance(*keys: str, instance_id: str = "d000.s000.t000") -> SenseInstance:
    return SenseInstance(0, instance_id, "bank", "NOUN", keys)


@pytest.mark.parametrize(
    ("keys", "label", "files"),
    [
        (("bank%1:14:00::",), "noun.group", 1),
        (("bank%1:14:00::", "bank%1:14:01::"), "noun.group", 1),  # two keys, one file
        (("bank%1:17:01::", "bank%1:14:00::"), "noun.object", 2),  # a tie: the first key's
        (("bank%1:14:00::", "bank%1:17:01::"), "noun.group", 2),
        # the file most keys name, wherever the first key lies
        (("bank%1:17:01::", "bank%1:14:00::", "bank%1:14:01::"), "noun.group", 2),
    ],
)
def test_a_word_with_keys_in_several_files_gets_the_most_named(
    keys: tuple[str, ...], label: str, files: int
) -> None:
    assert instance_supersense(_instance(*keys)) == (label, files)


def _source(path: Path, role: str, *instances: SenseInstance) -> SplitSource:
    sentence = WsdSentence(("the", "bank"), "d000.s000", instances)
    return SplitSource("semcor30", role, DatasetFormat.SEMCOR, path, [sentence], None)


TASK = TaskConfig(
    name="supersense",
    kind="token",
    train="semcor30/train",
    dev="semcor30/train",
    test="semcor30/train",
    field="supersense",
    metric="accuracy",
    unseen="keep",
    control_seed=None,
    wordnet=None,
    family="semantic",
)


def test_the_task_labels_every_tagged_word_and_counts_the_ambiguous(tmp_path: Path) -> None:
    path = tmp_path / "semcor.tsv"
    tie = _instance("bank%1:17:01::", "bank%1:14:00::")
    sources = {
        "train": _source(path, "train", _instance("bank%1:14:00::"), tie),
        "dev": _source(path, "dev", _instance("bank%1:17:01::")),
        "test": _source(path, "test", _instance("bank%1:06:00::")),  # unseen: kept
    }
    labels = task_labels(TASK, sources)
    assert labels.vocabulary.labels == ["noun.group", "noun.object", "noun.artifact"]
    assert labels.labels == {"train": [[0, 1]], "dev": [[1]], "test": [[2]]}
    assert labels.counts == {
        "n_train_instances_in_several_supersenses": 1,
        "n_dev_instances_in_several_supersenses": 0,
        "n_test_instances_in_several_supersenses": 0,
    }


def test_a_bad_key_names_the_file_and_the_instance(tmp_path: Path) -> None:
    path = tmp_path / "semcor.tsv"
    bad = _instance("bank%1:99:00::", instance_id="d001.s002.t003")
    sources = {role: _source(path, role, bad) for role in ("train", "dev", "test")}
    problem = (
        "instance d001.s002.t003: sense key 'bank%1:99:00::' names lexicographer file 99, but"
        " WordNet has 00-44"
    )
    expect_error(lambda: task_labels(TASK, sources), path, None, problem)


def test_wsd_data_has_no_other_field(tmp_path: Path) -> None:
    path = tmp_path / "semcor.tsv"
    source = _source(path, "train", _instance("bank%1:14:00::"))
    sources = {"train": source, "dev": source, "test": source}
    task = TaskConfig(**{**TASK.__dict__, "field": "upos"})
    problem = "task.field: semcor sentences (semcor30) give a token task one field, 'supersense'"
    expect_error(lambda: task_labels(task, sources), None, None, problem)
