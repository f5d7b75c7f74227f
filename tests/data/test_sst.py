"""The SST reader (``elmolab.data.sst``) on a hand-made tree and on the real files, and its
``sst`` format in the dataset catalog."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import expect_error

from elmolab.core.schema import DatasetConfig
from elmolab.data.catalogue import read_split
from elmolab.data.sst import SentimentSentence, read_sst, unescape_ptb

PROBING = Path(__file__).resolve().parents[2] / "data" / "probing"
# A hand-made tree: nested labels, -LRB-/-RRB-, an escaped slash and star, PTB quotes.
TREE = (
    "(3 (2 (2 -LRB-) (2 (2 writer\\/director) (2 -RRB-)))"
    " (4 (3 (2 ``) (4 great)) (2 (2 \\*) (2 ''))))"
)
WORDS = ["(", "writer/director", ")", "``", "great", "*", "''"]


def write(folder: Path, content: str, name: str = "train.txt") -> Path:
    path = folder / name
    path.write_text(content, encoding="utf-8")
    return path


def test_hand_made_tree(tmp_path: Path) -> None:
    path = write(tmp_path, f"{TREE}\n\n(1 (0 Awful) (2 .))\n")
    assert read_sst(path) == [
        SentimentSentence(tokens=tuple(WORDS), sentiment="3"),
        SentimentSentence(tokens=("Awful", "."), sentiment="1"),
    ]


def test_a_word_with_a_no_break_space_is_read_as_its_parts(tmp_path: Path) -> None:
    path = write(tmp_path, "(2 (2 (2 8\u00a01\\/2) (2 is)) (2 old))\n")
    assert read_sst(path)[0].tokens == ("8", "1/2", "is", "old")


@pytest.mark.parametrize(
    ("word", "text"),
    [("-LRB-", "("), ("-RRB-", ")"), ("\\/", "/"), ("1\\/2", "1/2"), ("\\*\\*", "**"), ("a", "a")],
)
def test_unescape_ptb(word: str, text: str) -> None:
    assert unescape_ptb(word) == text


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("(3 (2 good) (2 film)", "unbalanced brackets: 1 node(s) not closed"),
        ("(3 (2 good) (2 film)))", "unbalanced brackets: ')' closes no node"),
        ("(5 (2 good) (2 film))", "label '5' is not one of 0-4"),
        ("(3 (2 good) (-1 film))", "label '-1' is not one of 0-4"),
        ("(3 (x good) (2 film))", "label 'x' is not one of 0-4"),
        ("(3 (2 good) ( film))", "label 'film' is not one of 0-4"),
        ("(3 (2 good) (2))", "an empty node"),
        ("(3 (2 good film) (2 .))", "more than one word"),
        ("(3 good (2 film))", "a node holds both a word and subtrees"),
        ("(3 (2 good) (2 film)) (2 .)", "text after the tree's closing bracket"),
        ("good (3 (2 film))", "'good' outside the tree's brackets"),
        ("(", "a node without a label"),
    ],
)
def test_bad_tree(tmp_path: Path, line: str, problem: str) -> None:
    path = write(tmp_path, f"{TREE}\n{line}\n")
    expect_error(lambda: read_sst(path), path, 2, problem)


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, "\n \n")
    expect_error(lambda: read_sst(path), path, None, "no sentences")


def sst_dataset(root: Path) -> DatasetConfig:
    splits = {s: str(root / f"{s}.txt") for s in ("train", "dev", "test")}
    return DatasetConfig(format="sst", splits=splits, root=str(root))


def test_the_catalog_reads_sst_with_every_token_on_its_line(tmp_path: Path) -> None:
    write(tmp_path, f"\n{TREE}\n(1 (0 Awful) (2 .))\n")
    source = read_split("sst", sst_dataset(tmp_path), "train")
    assert source.units() == [WORDS, ["Awful", "."]]
    assert source.token_lines == [[2] * 7, [3, 3]]
    assert [s.sentiment for s in source.sentences] == ["3", "1"]


@pytest.mark.parametrize(
    ("split", "sentences", "tokens", "labels"),
    [
        # 163,563 leaves: three hold a word with a no-break space (8 1/2), read as two tokens
        ("train", 8544, 163_566, [1092, 2218, 1624, 2322, 1288]),
        ("dev", 1101, 21_274, [139, 289, 229, 279, 165]),
        ("test", 2210, 42_405, [279, 633, 389, 510, 399]),
    ],
)
def test_real_files(split: str, sentences: int, tokens: int, labels: list[int]) -> None:
    root = PROBING / "sst"
    if not root.is_dir():
        pytest.skip(f"{root} is absent: `make install` pulls data/ (dvc pull)")
    source = read_split("sst", sst_dataset(root), split)
    assert len(source.sentences) == sentences
    assert sum(map(len, source.units())) == tokens
    counts = Counter(s.sentiment for s in source.sentences)
    assert [counts[label] for label in "01234"] == labels
    assert not any("-LRB-" in u or "\\/" in u for units in source.units() for u in units)
