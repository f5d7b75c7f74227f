"""The ``columns`` format: CoNLL-2003-style files in IO, IOB1, IOB2 and BIOES, read to the same
IOB2 tags, their scheme detected, span F1 counted as conlleval counts it, and every malformed
input reported with its file and line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import expect_error
from omegaconf import OmegaConf
from seqeval.metrics import f1_score
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import IOB1, IOB2, IOBES

from elmolab.core.config import section
from elmolab.core.schema import ColumnsConfig, DatasetConfig, TaskConfig
from elmolab.data.catalogue import dataset_digest, read_split
from elmolab.data.conll import (
    LOOSE_BEGINS,
    Separator,
    TagScheme,
    column_scheme,
    detect_scheme,
    read_columns,
    spans_to_tags,
)
from elmolab.data.labels import LabelVocabulary, task_labels
from elmolab.probing.metrics import span_f1, task_score

SCHEMES = list(TagScheme)  # IO, IOB1, IOB2, BIOES: the tag columns of the tables below
SEPARATORS = {Separator.WHITESPACE: " ", Separator.TAB: "\t"}
# The seqeval scheme that reads each of ours: IO is IOB1 that never needs a B-.
SEQEVAL = {TagScheme.IO: IOB1, TagScheme.IOB1: IOB1, TagScheme.IOB2: IOB2, TagScheme.BIOES: IOBES}

# Two documents ("DOC") of sentences (a blank row ends one), tagged by hand in each scheme.
DOCUMENTS = """
DOC
the        O       O       O       O
EU         I-ORG   I-ORG   B-ORG   S-ORG
German     I-MISC  I-MISC  B-MISC  S-MISC
beef       O       O       O       O
ban        O       O       O       O

Peter      I-PER   I-PER   B-PER   B-PER
Blackburn  I-PER   I-PER   I-PER   E-PER

DOC
Bank       I-ORG   I-ORG   B-ORG   B-ORG
of         I-ORG   I-ORG   I-ORG   I-ORG
England    I-ORG   I-ORG   I-ORG   E-ORG
in         O       O       O       O
London     I-LOC   I-LOC   B-LOC   S-LOC
"""
# Two adjacent PER spans, the only place IOB1 needs a B-. IO cannot write them apart, so the IO
# files leave this sentence out.
ADJACENT = """
told       -       O       O       O
Mary       -       I-PER   B-PER   S-PER
John       -       B-PER   B-PER   B-PER
Smith      -       I-PER   I-PER   E-PER
"""
# The spans of the four sentences, [start, end) and type.
SPANS = [
    [(1, 2, "ORG"), (2, 3, "MISC")],
    [(0, 2, "PER")],
    [(0, 3, "ORG"), (4, 5, "LOC")],
    [(1, 2, "PER"), (2, 4, "PER")],
]
DOCSTART_FIELDS = ["-DOCSTART-", "-X-", "-X-", "O"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def documents(scheme: TagScheme, adjacent: bool = True) -> list[list[list[tuple[str, str]]]]:
    """The documents of the tables in ``scheme``: sentences of (token, tag)."""
    table = DOCUMENTS + (ADJACENT if adjacent and scheme is not TagScheme.IO else "")
    column = 1 + SCHEMES.index(scheme)
    docs: list[list[list[tuple[str, str]]]] = []
    for row in table.splitlines():
        fields = row.split()
        if fields == ["DOC"]:
            docs.append([[]])
        elif fields:
            docs[-1][-1].append((fields[0], fields[column]))
        elif docs and docs[-1][-1]:
            docs[-1].append([])
    return [[sentence for sentence in doc if sentence] for doc in docs]


def tags_of(scheme: TagScheme, adjacent: bool = True) -> list[list[str]]:
    return [[tag for _, tag in s] for doc in documents(scheme, adjacent) for s in doc]


def column_file(
    tmp_path: Path, scheme: TagScheme, separator: Separator, adjacent: bool = True
) -> Path:
    """The tables in ``scheme`` as a CoNLL-2003 file (``token POS chunk NER``): a ``-DOCSTART-``
    line and a blank line open each document, a blank line ends each sentence."""
    sep = SEPARATORS[separator]
    lines = []
    for doc in documents(scheme, adjacent):
        lines += [sep.join(DOCSTART_FIELDS), ""]
        for sentence in doc:
            lines += [sep.join([token, "NNP", "I-NP", tag]) for token, tag in sentence] + [""]
    return write(tmp_path, f"{scheme}-{separator}.txt", "\n".join(lines))


@pytest.mark.parametrize("separator", list(Separator))
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_reads_to_the_same_iob2_tags(
    tmp_path: Path, scheme: TagScheme, separator: Separator
) -> None:
    path = column_file(tmp_path, scheme, separator)
    read = read_columns(path, scheme, separator=separator)
    expected = documents(TagScheme.IOB2, adjacent=scheme is not TagScheme.IO)
    flat = [sentence for doc in expected for sentence in doc]
    # no sentence for the -DOCSTART- lines or the blank lines after them
    assert [s.tokens for s in read] == [tuple(token for token, _ in s) for s in flat]
    assert [s.tags for s in read] == [tuple(tag for _, tag in s) for s in flat]


@pytest.mark.parametrize("separator", list(Separator))
@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_scheme_is_detected(tmp_path: Path, scheme: TagScheme, separator: Separator) -> None:
    path = column_file(tmp_path, scheme, separator)
    assert column_scheme(path, separator=separator) is scheme


def test_iob1_without_adjacent_spans_is_io_and_reads_the_same(tmp_path: Path) -> None:
    path = column_file(tmp_path, TagScheme.IOB1, Separator.WHITESPACE, adjacent=False)
    assert column_scheme(path) is TagScheme.IO
    assert read_columns(path, TagScheme.IO) == read_columns(path, TagScheme.IOB1)


@pytest.mark.parametrize(
    ("tags", "scheme"),
    [
        ([["B-PER", "E-PER", "O"]], TagScheme.BIOES),
        ([["S-PER"], ["B-LOC", "I-LOC"]], TagScheme.BIOES),  # E-/S- anywhere decides
        ([["O", "B-PER", "I-PER"]], TagScheme.IOB2),
        ([["B-PER"]], TagScheme.IOB2),  # a B- that opens the sentence opens a span
        ([["I-LOC", "B-PER"]], TagScheme.IOB2),  # after another type: it opens a span
        # as many spans opened by I- as by B-: IOB2, whose check then rejects the I- after O
        ([["O", "I-PER"], ["B-LOC"]], TagScheme.IOB2),
        # most spans opened by I-: IOB1 (CoNLL-2003's B-MISC after O), however the B- is used
        ([["O", "I-PER"], ["I-LOC", "O", "B-MISC"]], TagScheme.IOB1),
        ([["I-ORG", "I-ORG", "B-PER"], ["I-LOC"]], TagScheme.IOB1),  # B- after another type
        # most spans opened by B-: IOB2 with a stray I- (its check reports that line)
        ([["B-PER", "O", "B-LOC"], ["O", "I-ORG"]], TagScheme.IOB2),
        ([["I-PER", "B-PER", "O"]], TagScheme.IOB1),  # B- only between two PER spans
        ([["O", "I-PER", "I-PER", "I-LOC"]], TagScheme.IO),
        ([["O", "O"]], TagScheme.IO),  # no spans at all
        ([["X-PER", "B-"]], TagScheme.IO),  # malformed tags count for nothing; the check rejects
    ],
)
def test_detect_scheme_rules(tags: list[list[str]], scheme: TagScheme) -> None:
    assert detect_scheme(tags) is scheme


@pytest.mark.parametrize("scheme", SCHEMES)
def test_spans_to_tags_writes_each_scheme(scheme: TagScheme) -> None:
    spans = SPANS[:3] if scheme is TagScheme.IO else SPANS
    written = [
        spans_to_tags(s, len(tags), scheme) for s, tags in zip(spans, tags_of(scheme), strict=True)
    ]
    assert written == tags_of(scheme)


def test_io_writes_adjacent_spans_of_one_type_as_one() -> None:
    assert spans_to_tags(SPANS[3], 4, TagScheme.IO) == ["O", "I-PER", "I-PER", "I-PER"]


# Hand-made gold and predicted tags in each scheme (one string per sentence). The predictions
# get a type wrong (EU), a boundary wrong (Peter Blackburn), a type wrong (London) and the rest
# right: 4 of 7 spans; IO cannot write EU and German apart, so it gets 1 of 5 (4 predicted).
PREDICTIONS = {
    TagScheme.IO: (
        ["O I-ORG I-MISC O O", "I-PER I-PER", "I-ORG I-ORG I-ORG O I-LOC"],
        ["O I-MISC I-MISC O O", "I-PER O", "I-ORG I-ORG I-ORG O I-ORG"],
        2 * (1 / 4) * (1 / 5) / (1 / 4 + 1 / 5),
    ),
    TagScheme.IOB1: (
        ["O I-ORG I-MISC O O", "I-PER I-PER", "I-ORG I-ORG I-ORG O I-LOC", "O I-PER B-PER I-PER"],
        ["O I-MISC B-MISC O O", "I-PER O", "I-ORG I-ORG I-ORG O I-ORG", "O I-PER B-PER I-PER"],
        4 / 7,
    ),
    TagScheme.IOB2: (
        ["O B-ORG B-MISC O O", "B-PER I-PER", "B-ORG I-ORG I-ORG O B-LOC", "O B-PER B-PER I-PER"],
        ["O B-MISC B-MISC O O", "B-PER O", "B-ORG I-ORG I-ORG O B-ORG", "O B-PER B-PER I-PER"],
        4 / 7,
    ),
    TagScheme.BIOES: (
        ["O S-ORG S-MISC O O", "B-PER E-PER", "B-ORG I-ORG E-ORG O S-LOC", "O S-PER B-PER E-PER"],
        ["O S-MISC S-MISC O O", "S-PER O", "B-ORG I-ORG E-ORG O S-ORG", "O S-PER B-PER E-PER"],
        4 / 7,
    ),
}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_span_f1_equals_seqeval_on_the_data_scheme(tmp_path: Path, scheme: TagScheme) -> None:
    """On well-formed tags, conlleval's count (span_f1 of the IOB2 labels) and seqeval's strict
    reading of the data's own scheme find the same chunks."""
    gold_text, predicted_text, expected = PREDICTIONS[scheme]
    gold, predicted = [s.split() for s in gold_text], [s.split() for s in predicted_text]
    # a file of "token gold predicted" lines, read once per label column: both sides in IOB2
    lines = [
        f"w{i} {g} {p}" if g else ""
        for gs, ps in zip(gold, predicted, strict=True)
        for i, (g, p) in enumerate([*zip(gs, ps, strict=True), ("", "")])
    ]
    path = write(tmp_path, "predicted.txt", "\n".join(lines))
    gold_iob2 = [s.tags for s in read_columns(path, scheme, label_column=1)]
    predicted_iob2 = [s.tags for s in read_columns(path, scheme, label_column=2)]
    seqeval = f1_score(gold, predicted, mode="strict", scheme=SEQEVAL[scheme])
    assert span_f1(gold_iob2, predicted_iob2) == pytest.approx(seqeval)
    assert seqeval == pytest.approx(expected)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_inside_tag_that_continues_no_span_opens_one_in_every_scheme(
    scheme: TagScheme,
) -> None:
    # A probe may predict I-PER after O: conlleval opens a chunk there, whatever the data's
    # scheme, and the predictions written in that scheme hold that chunk.
    labels = ["B-LOC", "B-PER", "I-PER", "O"]  # ids 0, 1, 2, 3
    gold = torch.tensor([3, 1, 2, 3, 0])  # O B-PER I-PER O B-LOC
    predicted = torch.tensor([3, 2, 2, 3, 0])  # O I-PER I-PER O B-LOC
    vocabulary = LabelVocabulary(labels, scheme=scheme)
    assert task_score("span_f1", predicted, gold, [5], vocabulary) == 1.0
    [written] = vocabulary.decode_in_data_scheme(predicted, [5])
    if scheme is TagScheme.IOB2:  # IOB2 predictions are written as predicted: the same chunks
        assert written == ["O", "I-PER", "I-PER", "O", "B-LOC"]
    else:
        assert written == spans_to_tags([(1, 3, "PER"), (4, 5, "LOC")], 5, scheme)


def ner_task(train: str, dev: str, test: str) -> TaskConfig:
    return TaskConfig(
        name="ner",
        kind="token",
        train=train,
        dev=dev,
        test=test,
        field="tags",
        metric="span_f1",
        unseen="raise",
        control_seed=None,
        wordnet=None,
        family="semantic",
    )


def test_a_columns_dataset_through_the_catalog(tmp_path: Path) -> None:
    train = column_file(tmp_path, TagScheme.IOB1, Separator.TAB)
    (tmp_path / "dev").mkdir()
    # dev without the adjacent spans has no B-: alone it would be IO, but auto takes train's IOB1
    dev = column_file(tmp_path / "dev", TagScheme.IOB1, Separator.TAB, adjacent=False)
    node = OmegaConf.create(
        {
            "conll03": {
                "format": "columns",
                "root": str(tmp_path),
                "splits": {"train": str(train), "dev": str(dev)},
                "columns": {"separator": "tab", "label_column": 3},
            }
        }
    )
    config = section(node, "conll03", DatasetConfig)
    assert config.columns == ColumnsConfig(label_column=3, separator="tab")
    sources = {
        role: read_split("conll03", config, split)
        for role, split in [("train", "train"), ("dev", "dev"), ("test", "dev")]
    }
    assert {source.scheme for source in sources.values()} == {TagScheme.IOB1}
    assert [list(s.tags) for s in sources["dev"].sentences] == tags_of(TagScheme.IOB2, False)
    # line 1 is -DOCSTART-, 2 blank, 3-7 the first sentence, 8 blank, 9-10 the second, 11 blank,
    # 12 -DOCSTART-, 13 blank, 14-18 the third
    assert sources["dev"].token_lines == [[3, 4, 5, 6, 7], [9, 10], [14, 15, 16, 17, 18]]
    labels = task_labels(ner_task("conll03/train", "conll03/dev", "conll03/test"), sources)
    assert labels.vocabulary.scheme is TagScheme.IOB1
    assert labels.vocabulary.labels == sorted({t for s in tags_of(TagScheme.IOB2) for t in s})


def test_docstart_lines_end_sentences_without_blank_lines(tmp_path: Path) -> None:
    text = "-DOCSTART- O\nEU B-ORG\n-DOCSTART- O\n\n\n-DOCSTART- O\nrejects O\nit O\n"
    path = write(tmp_path, "train.txt", text)
    source = read_split(
        "ner", DatasetConfig("columns", {"train": str(path)}, str(path.parent)), "train"
    )
    assert [s.tokens for s in source.sentences] == [("EU",), ("rejects", "it")]
    assert source.token_lines == [[2], [7, 8]]


def test_tab_separated_tokens_keep_their_spaces(tmp_path: Path) -> None:
    path = write(tmp_path, "tab.txt", "New York\tB-LOC\nis\tO\n")
    [sentence] = read_columns(path, TagScheme.IOB2, separator=Separator.TAB)
    assert sentence.tokens == ("New York", "is") and sentence.tags == ("B-LOC", "O")


GOOD = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"  # lines 1-5


@pytest.mark.parametrize(
    ("text", "options", "line", "problem"),
    [
        pytest.param(
            GOOD + "German JJ B-MISC\n",
            {},
            6,
            "expected 4 whitespace-separated columns as on line 3, got 3",
            id="ragged-fewer",
        ),
        pytest.param(
            GOOD + "German JJ B-NP B-MISC x\n",
            {},
            6,
            "expected 4 whitespace-separated columns as on line 3, got 5",
            id="ragged-more",
        ),
        pytest.param(
            GOOD,
            {"label_column": 4},
            3,
            "label_column 4 is past the end of the line (4 whitespace-separated columns)",
            id="label-column-past-the-end",
        ),
        pytest.param(
            GOOD,
            {"token_column": -5},
            3,
            "token_column -5 is past the end of the line (4 whitespace-separated columns)",
            id="token-column-past-the-end",
        ),
        pytest.param(
            GOOD,
            {"separator": Separator.TAB},
            3,
            "token_column 0 and label_column -1 are the same column of 1",
            id="too-few-columns-for-both",
        ),
        pytest.param(
            "EU\tB-ORG\n\tO\n",
            {"separator": Separator.TAB},
            2,
            "empty token",
            id="empty-token",
        ),
        pytest.param(
            GOOD + "German JJ B-NP I-MISC\n",
            {},
            6,
            "tag 'I-MISC' follows 'O': IOB2 opens every span with B-MISC",
            id="IOB2-inside-after-O",
        ),
        pytest.param(
            GOOD + "German JJ B-NP S-MISC\n",
            {},
            6,
            "tag 'S-MISC' is not IOB2 (expected O, B-TYPE or I-TYPE)",
            id="IOB2-given-BIOES-data",
        ),
        pytest.param(
            GOOD,
            {"scheme": TagScheme.BIOES},
            4,
            "tag 'O' follows 'B-ORG': BIOES ends every span with E-ORG (S-ORG for one token)",
            id="BIOES-given-IOB2-data",
        ),
        pytest.param(
            "EU NNP B-NP B-ORG\n",
            {"scheme": TagScheme.BIOES},
            1,
            "the sentence ends after 'B-ORG': BIOES ends every span with E-ORG",
            id="BIOES-open-at-the-end",
        ),
        pytest.param(
            "EU NNP B-NP O\nUnion NNP I-NP E-ORG\n",
            {"scheme": TagScheme.BIOES},
            2,
            "tag 'E-ORG' follows 'O': BIOES opens every span with B-ORG or S-ORG",
            id="BIOES-end-after-O",
        ),
        pytest.param(
            GOOD,
            {"scheme": TagScheme.IO},
            3,
            "tag 'B-ORG' is not IO (expected O or I-TYPE)",
            id="IO-given-IOB2-data",
        ),
        pytest.param(GOOD + "German JJ B-NP B-\n", {}, 6, "tag 'B-' is not IOB2", id="no-type"),
        pytest.param(
            "EU NNP B-NP S-ORG\nGerman JJ B-NP X-MISC\n",
            {"scheme": TagScheme.BIOES},
            2,
            "tag 'X-MISC' is not BIOES (expected O, B-TYPE, I-TYPE, E-TYPE or S-TYPE)",
            id="unknown-prefix",
        ),
        pytest.param(
            GOOD + "German JJ B-NP MISC\n", {}, 6, "tag 'MISC' is not IOB2", id="no-prefix"
        ),
    ],
)
def test_bad_input(tmp_path: Path, text: str, options: dict, line: int, problem: str) -> None:
    path = write(tmp_path, "train.txt", text)
    options = {"scheme": TagScheme.IOB2, **options}
    expect_error(lambda: read_columns(path, **options), path, line, problem)


# IOB1 as conlleval reads it: each of these B- tags opens a span where I- would have; the
# sentences hold the spans conlleval counts, and read_columns counts the B- tags.
LOOSE_IOB1 = """-DOCSTART- -X- -X- O

the DT I-NP O
Atlanta NNP I-NP B-MISC
Games NNPS I-NP I-MISC
and CC O O

Bill NNP I-NP B-PER
Smith NNP I-NP I-PER
of IN I-PP I-ORG
Reuters NNP I-NP B-LOC
Mary NNP I-NP B-LOC
"""


def test_iob1_b_after_o_or_another_type_opens_a_span_and_is_counted(tmp_path: Path) -> None:
    path = write(tmp_path, "train.txt", LOOSE_IOB1)
    counts: Counter[str] = Counter()
    read = read_columns(path, TagScheme.IOB1, counts=counts)
    assert [s.tags for s in read] == [
        ("O", "B-MISC", "I-MISC", "O"),
        # B-PER first in its sentence, B-LOC after ORG: loose; B-LOC after LOC separates two spans
        ("B-PER", "I-PER", "B-ORG", "B-LOC", "B-LOC"),
    ]
    assert counts == {LOOSE_BEGINS: 3}
    # conlleval's spans (seqeval's default mode reads IOB1 B-/I- tags the same way)
    assert [get_entities(list(s.tags)) for s in read] == [
        get_entities(tags)
        for tags in (["O", "B-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "I-ORG", "B-LOC", "B-LOC"])
    ]
    # the other schemes count nothing
    iob2 = Counter[str]()
    read_columns(write(tmp_path, "iob2.txt", GOOD), TagScheme.IOB2, counts=iob2)
    assert iob2 == {}


def test_a_file_of_docstart_lines_has_no_sentences(tmp_path: Path) -> None:
    path = write(tmp_path, "train.txt", "-DOCSTART- -X- -X- O\n\n-DOCSTART- -X- -X- O\n")
    expect_error(lambda: read_columns(path, TagScheme.IOB2), path, None, "no sentences")


def test_auto_checks_every_split_against_the_train_scheme(tmp_path: Path) -> None:
    train = column_file(tmp_path, TagScheme.IOB2, Separator.WHITESPACE)
    (tmp_path / "test").mkdir()
    test = column_file(tmp_path / "test", TagScheme.BIOES, Separator.WHITESPACE)
    config = DatasetConfig("columns", {"train": str(train), "test": str(test)}, str(train.parent))
    assert read_split("conll03", config, "train").scheme is TagScheme.IOB2
    problem = "tag 'S-ORG' is not IOB2 (expected O, B-TYPE or I-TYPE)"
    expect_error(lambda: read_split("conll03", config, "test"), test, 4, problem)


@pytest.mark.parametrize(
    ("format_", "columns", "problem"),
    [
        (
            "conll2003",
            None,
            "extract.datasets.ner.format: 'conll2003' is not one of conllu, conll2000, wnut17,"
            " columns, semcor, raganato",
        ),
        (
            "columns",
            ColumnsConfig(separator="comma"),
            "extract.datasets.ner.columns.separator: 'comma' is not one of whitespace, tab",
        ),
        (
            "columns",
            ColumnsConfig(scheme="iob2"),
            "extract.datasets.ner.columns.scheme: 'iob2' is not one of auto, IO, IOB1, IOB2, BIOES",
        ),
        (
            "wnut17",
            ColumnsConfig(),
            "extract.datasets.ner.columns: only format columns takes column options, not wnut17",
        ),
    ],
)
def test_bad_dataset_config(
    tmp_path: Path, format_: str, columns: ColumnsConfig | None, problem: str
) -> None:
    train = column_file(tmp_path, TagScheme.IOB2, Separator.WHITESPACE)
    config = DatasetConfig(format_, {"train": str(train)}, str(train.parent), columns=columns)
    expect_error(lambda: read_split("ner", config, "train"), None, None, problem)


def test_unknown_column_option_is_rejected() -> None:
    node = OmegaConf.create({"ner": {"format": "columns", "splits": {}, "columns": {"sep": "tab"}}})
    expect_error(lambda: section(node, "ner", DatasetConfig, "conf"), Path("conf"), None, "sep")


def test_a_span_f1_task_may_mix_schemes_and_writes_in_the_test_scheme(tmp_path: Path) -> None:
    iob1 = column_file(tmp_path, TagScheme.IOB1, Separator.WHITESPACE)
    bioes = column_file(tmp_path, TagScheme.BIOES, Separator.WHITESPACE)
    sources = {
        "train": read_split(
            "a", DatasetConfig("columns", {"train": str(iob1)}, str(iob1.parent)), "train"
        ),
        "dev": read_split(
            "a", DatasetConfig("columns", {"train": str(iob1)}, str(iob1.parent)), "train"
        ),
        "test": read_split(
            "b", DatasetConfig("columns", {"test": str(bioes)}, str(bioes.parent)), "test"
        ),
    }
    labels = task_labels(ner_task("a/train", "a/train", "b/test"), sources)
    # both schemes read to the same IOB2 labels, so the same conlleval chunks
    assert labels.labels["train"] == labels.labels["test"]
    assert labels.vocabulary.scheme is TagScheme.BIOES


def test_a_dataset_digest_follows_its_files_and_settings_and_its_root_holds_them(
    tmp_path: Path,
) -> None:
    """The digest each feature file carries: a changed label (the tokens unchanged) or setting
    changes it; a split outside the dataset's root (DVC's dependency) is an error."""
    root = tmp_path / "ner"
    root.mkdir()
    train = write(root, "train.txt", "EU B-ORG\nrejects O\n")
    config = DatasetConfig("columns", {"train": str(train)}, str(root))
    first = dataset_digest("ner", config)
    assert dataset_digest("ner", config) == first
    train.write_text("EU B-LOC\nrejects O\n", encoding="utf-8")
    relabelled = dataset_digest("ner", config)
    assert relabelled != first
    config.columns = ColumnsConfig(label_column=1)
    assert dataset_digest("ner", config) != relabelled
    outside = write(tmp_path, "test.txt", "EU B-ORG\n")
    config.splits["test"] = str(outside)
    expect_error(
        lambda: dataset_digest("ner", config),
        None,
        None,
        f"extract.datasets.ner.splits.test: {outside} is not under the dataset's root {root}",
    )
    config.root = str(tmp_path / "missing")
    expect_error(
        lambda: dataset_digest("ner", config), tmp_path / "missing", None, "no such folder"
    )
