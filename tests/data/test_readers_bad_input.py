"""Malformed inputs: every reader raises ElmolabError naming the file, the line and the problem."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest
from conftest import expect_error

from elmolab.data.conll import read_conll2000, read_conllu, read_lines, read_wnut17
from elmolab.data.wsd import (
    WordNetSenseIndex,
    read_gold_keys,
    read_raganato,
    read_semcor,
    read_wordnet_sense_index,
)

CONLLU_GOOD = (
    "# sent_id = s1\n"
    "1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n"
    "2\tdog\tdog\tNOUN\tNN\t_\t3\tnsubj\t_\t_\n"
    "3\tbarks\tbark\tVERB\tVBZ\t_\t0\troot\t_\t_\n"
    "\n"
)
SEMCOR_HEADER = "# id\tword\tlemma\tpos\tsense_keys_wn30_valid\tsense_keys_raw\n"
RAGANATO_XML = """<?xml version="1.0" encoding="UTF-8" ?>
<corpus lang="en" source="test">
<text id="d000">
<sentence id="d000.s000">
<wf lemma="the" pos="DET">The</wf>
<instance id="d000.s000.t000" lemma="art" pos="NOUN">art</instance>
<wf lemma="be" pos="VERB">is</wf>
<instance id="d000.s000.t001" lemma="peculiar" pos="ADJ">peculiar</instance>
</sentence>
</text>
</corpus>
"""
RAGANATO_GOLD = (
    "d000.s000.t000 art%1:09:00::\n"
    "d000.s000.t001 peculiar%5:00:00:specific:00 peculiar%5:00:00:characteristic:00\n"
)
INDEX_SENSE = (
    "art%1:09:00:: 05638987 2 7\n"
    "peculiar%5:00:00:characteristic:00 00357790 4 0\n"
    "peculiar%5:00:00:specific:00 01104026 2 6\n"
)


def write(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(gzip.compress(content) if name.endswith(".gz") else content)
    return path


@pytest.fixture
def wordnet(tmp_path: Path) -> WordNetSenseIndex:
    return read_wordnet_sense_index(write(tmp_path, "index.sense", INDEX_SENSE))


def test_the_good_inputs_are_good(tmp_path: Path, wordnet: WordNetSenseIndex) -> None:
    """The fixtures the other tests break are themselves valid."""
    (sentence,) = read_conllu(write(tmp_path, "good.conllu", CONLLU_GOOD))
    assert (sentence.tokens, sentence.heads, sentence.sent_id) == (
        ("The", "dog", "barks"),
        (2, 3, 0),
        "s1",
    )
    xml = write(tmp_path, "x.data.xml", RAGANATO_XML)
    gold = write(tmp_path, "x.gold.key.txt", RAGANATO_GOLD)
    (wsd_sentence,) = read_raganato(xml, gold, wordnet)
    assert [i.position for i in wsd_sentence.instances] == [1, 3]
    assert wordnet.first_sense("peculiar", "ADJ") is None  # sense numbers 2 and 4 only


# CoNLL-U


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("2\tdog\tdog\tNOUN\tNN\t_\t3\tnsubj\t_", "expected 10 tab-separated columns, got 9"),
        ("2\tdog dog NOUN NN _ 3 nsubj _ _", "expected 10 tab-separated columns, got 2"),
        ("2\tdog\tdog\tNOUN\tNN\t_\tthree\tnsubj\t_\t_", "HEAD 'three' is not an integer"),
        ("2\tdog\tdog\tNOUN\tNN\t_\t4\tnsubj\t_\t_", "HEAD 4 outside 0..3"),
        ("2\tdog\tdog\tNOUN\tNN\t_\t-1\tnsubj\t_\t_", "HEAD -1 outside 0..3"),
        ("7\tdog\tdog\tNOUN\tNN\t_\t3\tnsubj\t_\t_", "expected word ID 2, got '7'"),
        ("# text = a comment among the words", "comment line inside a sentence"),
    ],
)
def test_conllu_bad_word_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    lines = CONLLU_GOOD.split("\n")
    lines[2] = bad_line
    text = CONLLU_GOOD + "\n".join(lines)  # a good sentence (lines 1-5), then the bad one
    path = write(tmp_path, "en_ewt-ud-train.conllu", text)
    expect_error(lambda: read_conllu(path), path, 8, problem)


def test_conllu_undecodable_bytes(tmp_path: Path) -> None:
    data = CONLLU_GOOD.encode() + b"1\tcaf\xe9\tcafe\tNOUN\tNN\t_\t0\troot\t_\t_\n"
    path = write(tmp_path, "latin1.conllu", data)
    expect_error(lambda: read_conllu(path), path, 6, "not valid UTF-8: byte 0xe9 at column 6")


@pytest.mark.parametrize("content", ["", "\n\n", "\t\n \n"])
def test_empty_files(tmp_path: Path, content: str) -> None:
    for name, read in [
        ("empty.conllu", read_conllu),
        ("empty.txt", read_conll2000),
        ("empty.conll", read_wnut17),
    ]:
        path = write(tmp_path, name, content)
        expect_error(lambda read=read, path=path: read(path), path, None, "no sentences")


def test_conllu_sentence_of_only_multiword_ranges(tmp_path: Path) -> None:
    path = write(
        tmp_path, "x.conllu", CONLLU_GOOD + "# sent_id = s2\n1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n"
    )
    expect_error(lambda: read_conllu(path), path, 7, "sentence has no words")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.conllu"
    expect_error(lambda: read_conllu(path), path, None, "cannot read: No such file or directory")


# CoNLL-2000 and WNUT-17 (IOB2)


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("pound NN", "expected 3 space-separated columns (word POS chunk), got 2"),
        ("pound NN I-NP extra", "expected 3 space-separated columns (word POS chunk), got 4"),
        ("pound NN NP", "tag 'NP' is not IOB2 (expected O, B-TYPE or I-TYPE)"),
        ("pound NN E-NP", "tag 'E-NP' is not IOB2"),
        ("pound NN B-", "tag 'B-' is not IOB2"),
        ("pound NN B-XP", "unknown type 'XP' in tag 'B-XP' (known: ADJP, ADVP,"),
        ("pound NN I-VP", "tag 'I-VP' follows 'B-NP': IOB2 opens every span with B-VP"),
    ],
)
def test_conll2000_bad_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    text = "Confidence NN B-NP\nin IN B-PP\n\nthe DT B-NP\n" + bad_line + "\nis VBZ B-VP\n"
    path = write(tmp_path, "train.txt", text)
    expect_error(lambda: read_conll2000(path), path, 5, problem)


def test_iob2_inside_tag_cannot_open_a_sentence(tmp_path: Path) -> None:
    path = write(tmp_path, "train.txt", "Confidence NN B-NP\n\nin IN I-NP\n")
    expect_error(lambda: read_conll2000(path), path, 3, "tag 'I-NP' follows 'O'")


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("Empire B-location", "expected 2 tab-separated columns (token, tag), got 1"),
        ("Empire\tB-location\tO", "expected 2 tab-separated columns (token, tag), got 3"),
        ("\tB-location", "empty token"),
        ("Empire\tB-city", "unknown type 'city' in tag 'B-city' (known: corporation,"),
        ("Empire\tB-Location", "unknown type 'Location'"),
        ("Empire\tI-person", "tag 'I-person' follows 'O': IOB2 opens every span with B-person"),
    ],
)
def test_wnut17_bad_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    path = write(tmp_path, "wnut17train.conll", "@paulwalk\tO\n\t\nIt\tO\n" + bad_line + "\n")
    expect_error(lambda: read_wnut17(path), path, 4, problem)


# Raganato XML and gold keys


@pytest.mark.parametrize(
    ("old", "new", "line", "problem"),
    [
        ("</sentence>", "</sentenc>", 9, "malformed XML: mismatched tag (column 3)"),
        (">art<", ">art & craft<", 6, "malformed XML: not well-formed (invalid token)"),
        ('lemma="be"', "lemma=be", 7, "malformed XML: not well-formed (invalid token)"),
        ('<wf lemma="the"', '<word lemma="the"', 5, "unexpected element <word>"),
        (' pos="NOUN">art', ">art", 6, "<instance> without pos attribute"),
        ('pos="NOUN">art', 'pos="NUM">art', 6, "pos 'NUM' is not one of NOUN, VERB, ADJ, ADV"),
        ("t001", "t000", 8, "instance id 'd000.s000.t000' appears twice"),
        ('<sentence id="d000.s000">', "<sentence>", 4, "<sentence> without an id attribute"),
        (">is<", "> <", 7, "empty <wf>"),
    ],
)
def test_raganato_bad_xml(tmp_path: Path, old: str, new: str, line: int, problem: str) -> None:
    assert old in RAGANATO_XML
    xml = write(tmp_path, "x.data.xml", RAGANATO_XML.replace(old, new, 1))
    gold = write(tmp_path, "x.gold.key.txt", RAGANATO_GOLD)
    expect_error(lambda: read_raganato(xml, gold), xml, line, problem)


def test_raganato_empty_xml(tmp_path: Path) -> None:
    xml = write(tmp_path, "x.data.xml", "")
    gold = write(tmp_path, "x.gold.key.txt", RAGANATO_GOLD)
    expect_error(lambda: read_raganato(xml, gold), xml, 1, "malformed XML: no element found")


def test_raganato_instance_without_gold_key(tmp_path: Path) -> None:
    xml = write(tmp_path, "x.data.xml", RAGANATO_XML)
    gold = write(tmp_path, "x.gold.key.txt", RAGANATO_GOLD.split("\n")[0] + "\n")
    problem = f"instance 'd000.s000.t001' has no gold key in {gold}"
    expect_error(lambda: read_raganato(xml, gold), xml, 8, problem)


def test_raganato_gold_key_for_unknown_instance(tmp_path: Path) -> None:
    xml = write(tmp_path, "x.data.xml", RAGANATO_XML)
    extra = "d000.s000.t007 art%1:09:00::\nd000.s009.t000 art%1:09:00::\n"
    gold = write(tmp_path, "x.gold.key.txt", RAGANATO_GOLD + extra)
    problem = f"gold key for unknown instance id 'd000.s000.t007' (not in {xml}); 1 more"
    expect_error(lambda: read_raganato(xml, gold), gold, 3, problem)


def test_gold_key_not_in_wordnet(tmp_path: Path, wordnet: WordNetSenseIndex) -> None:
    xml = write(tmp_path, "x.data.xml", RAGANATO_XML)
    gold = write(tmp_path, "x.gold.key.txt", RAGANATO_GOLD.replace("specific", "strange"))
    problem = f"sense key 'peculiar%5:00:00:strange:00' is not in WordNet ({wordnet.path})"
    expect_error(lambda: read_raganato(xml, gold, wordnet), gold, 2, problem)


@pytest.mark.parametrize(
    ("content", "line", "problem"),
    [
        ("d000.s000.t000\n", 1, "expected an instance id and at least one sense key"),
        ("a art%1:09:00::\n\nb art%1:09\n", 3, "malformed sense key 'art%1:09'"),
        ("a art%1:09:00::\nb art%0:09:00::\n", 2, "malformed sense key 'art%0:09:00::'"),
        ("a art%1:09:00::\na art%1:09:00::\n", 2, "instance 'a' already has gold keys (line 1)"),
    ],
)
def test_gold_key_file_bad_line(tmp_path: Path, content: str, line: int, problem: str) -> None:
    path = write(tmp_path, "x.gold.key.txt", content)
    expect_error(lambda: read_gold_keys(path), path, line, problem)


def test_gold_key_file_empty(tmp_path: Path) -> None:
    path = write(tmp_path, "x.gold.key.txt", "\n")
    expect_error(lambda: read_gold_keys(path), path, None, "no gold keys")


# SemCor TSV (gzip)


def semcor_rows(n_sentences: int) -> str:
    rows = []
    for s in range(n_sentences):
        rows.append(f"d000.s{s:03d}.t000\tThe\tthe\tDT\t_\t_\n")
        rows.append(f"d000.s{s:03d}.t001\tart\tart\tNN\tart%1:09:00::\tart%1:09:00::\n")
    return SEMCOR_HEADER + "".join(rows)


@pytest.mark.parametrize(
    ("bad_row", "problem"),
    [
        ("d000.s001.t002\tis\tbe\tVB\t_", "expected 6 tab-separated columns, got 5"),
        ("d000.s001\tis\tbe\tVB\t_\t_", "token id 'd000.s001' is not dDOC.sSENT.tTOK"),
        ("d000.s000.t002\tis\tbe\tVB\t_\t_", "sentence 'd000.s000' resumes after other sentences"),
        ("d000.s001.t002\tis\tbe\tVB\tbe%2:42:03\t_", "malformed sense key 'be%2:42:03'"),
        (
            "d000.s001.t002\tis\tbe\tVB\tbe%2:42:03::;art%1:09:00::\t_",
            "the sense keys of 'd000.s001.t002' disagree on lemma or part of speech",
        ),
    ],
)
def test_semcor_bad_row(tmp_path: Path, bad_row: str, problem: str) -> None:
    path = write(tmp_path, "semcor30.tsv.gz", semcor_rows(2) + bad_row + "\n")
    expect_error(lambda: read_semcor(path), path, 6, problem)


def test_semcor_sense_key_not_in_wordnet(tmp_path: Path, wordnet: WordNetSenseIndex) -> None:
    row = "d000.s002.t000\tpeculiar\tpeculiar\tJJ\tpeculiar%5:00:00:strange:00\t_\n"
    path = write(tmp_path, "semcor30.tsv.gz", semcor_rows(2) + row)
    expect_error(lambda: read_semcor(path, wordnet), path, 6, "is not in WordNet")


def test_semcor_truncated_gzip(tmp_path: Path) -> None:
    compressed = gzip.compress(semcor_rows(5_000).encode(), compresslevel=1)
    truncated = compressed[: len(compressed) // 2]
    path = tmp_path / "semcor30.tsv.gz"
    path.write_bytes(truncated)
    good_lines = zlib.decompressobj(wbits=31).decompress(truncated).count(b"\n")
    assert 100 < good_lines < 9_000
    problem = "truncated or corrupt gzip data (Compressed file ended before the end-of-stream"
    expect_error(lambda: read_semcor(path), path, good_lines + 1, problem)


def test_not_gzip_at_all(tmp_path: Path) -> None:
    path = tmp_path / "semcor30.tsv.gz"
    path.write_text(semcor_rows(1))
    expect_error(lambda: read_lines(path), path, 1, "truncated or corrupt gzip data (Not a gzipped")


def test_semcor_without_tokens(tmp_path: Path) -> None:
    path = write(tmp_path, "semcor30.tsv.gz", SEMCOR_HEADER)
    expect_error(lambda: read_semcor(path), path, None, "no sentences")


# WordNet index.sense


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("art%1:04:00:: 00933420 2", "expected 4 space-separated fields"),
        ("art%1:04:00::\t00933420 2 15", "expected 4 space-separated fields"),
        ("art%1:04:00:: 00933420 two 15", "sense number 'two' is not a positive integer"),
        ("art%1:04:00:: 00933420 0 15", "sense number '0' is not a positive integer"),
        ("art:1:04:00:: 00933420 2 15", "malformed sense key 'art:1:04:00::'"),
        ("art%1:09:00:: 05638987 2 7", "sense key 'art%1:09:00::' appears twice"),
    ],
)
def test_index_sense_bad_line(tmp_path: Path, bad_line: str, problem: str) -> None:
    path = write(tmp_path, "index.sense", INDEX_SENSE + bad_line + "\n")
    expect_error(lambda: read_wordnet_sense_index(path), path, 4, problem)


def test_index_sense_empty(tmp_path: Path) -> None:
    path = write(tmp_path, "index.sense", "")
    expect_error(lambda: read_wordnet_sense_index(path), path, None, "no sense keys")
