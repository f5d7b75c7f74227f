"""The probing-data readers on the real files: first lines, special cases, the data card's counts.

Expected values were read off the files themselves; counts are those of the data card,
``data/README.md`` (pulled with the data). Tests that need ``data/`` skip when it is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from elmolab.core.schema import DatasetConfig
from elmolab.data.catalogue import read_split
from elmolab.data.conll import (
    CONLL2000_CHUNK_TYPES,
    LOOSE_BEGINS,
    WNUT17_ENTITY_TYPES,
    ChunkSentence,
    TaggedSentence,
    TagScheme,
    UDSentence,
    carve_dev,
    read_conll2000,
    read_conllu,
    read_wnut17,
)
from elmolab.data.wsd import (
    SenseInstance,
    WordNetSenseIndex,
    WsdSentence,
    read_gold_keys,
    read_raganato,
    read_semcor,
    read_wordnet_sense_index,
    sense_key_lemma_pos,
)

PROBING = Path(__file__).resolve().parents[2] / "data" / "probing"


def data_file(relative: str) -> Path:
    """The path of a probing data file; skips the test when data/ has not been pulled."""
    path = PROBING / relative
    if not path.exists():
        pytest.skip(f"{path} is absent: `make install` pulls data/ (dvc pull)")
    return path


def counts(sentences: list[TaggedSentence]) -> tuple[int, int]:
    return len(sentences), sum(len(sentence) for sentence in sentences)


@pytest.fixture(scope="module")
def ewt_train() -> list[UDSentence]:
    return read_conllu(data_file("ud_english_ewt/en_ewt-ud-train.conllu"))


@pytest.fixture(scope="module")
def conll2000_train() -> list[ChunkSentence]:
    return read_conll2000(data_file("conll2000/train.txt"))


@pytest.fixture(scope="module")
def wordnet() -> WordNetSenseIndex:
    return read_wordnet_sense_index(data_file("wsd/wordnet30/index.sense"))


@pytest.fixture(scope="module")
def semcor(wordnet: WordNetSenseIndex) -> list[WsdSentence]:
    return read_semcor(data_file("wsd/semcor30/semcor30.tsv.gz"), wordnet)


# UD English EWT


@pytest.mark.parametrize(
    ("split", "n_sentences", "n_tokens"),
    [("dev", 2_001, 25_147), ("test", 2_077, 25_094)],
)
def test_ewt_counts(split: str, n_sentences: int, n_tokens: int) -> None:
    sentences = read_conllu(data_file(f"ud_english_ewt/en_ewt-ud-{split}.conllu"))
    assert counts(sentences) == (n_sentences, n_tokens)
    assert all(sentence.sent_id for sentence in sentences)


def test_ewt_train_counts(ewt_train: list[UDSentence]) -> None:
    assert counts(ewt_train) == (12_544, 204_577)
    assert all(sentence.sent_id for sentence in ewt_train)


def test_ewt_first_sentence(ewt_train: list[UDSentence]) -> None:
    first = ewt_train[0]
    assert first.sent_id == "weblog-juancole.com_juancole_20051126063000_ENG_20051126_063000-0001"
    assert first.tokens[:7] == ("Al", "-", "Zaman", ":", "American", "forces", "killed")
    assert first.upos[:7] == ("PROPN", "PUNCT", "PROPN", "PUNCT", "ADJ", "NOUN", "VERB")
    assert first.xpos[:7] == ("NNP", "HYPH", "NNP", ":", "JJ", "NNS", "VBD")
    assert first.heads[:7] == (0, 3, 1, 7, 6, 7, 1)
    assert first.deprels[:7] == ("root", "punct", "flat", "punct", "amod", "nsubj", "parataxis")
    assert len(first) == 29
    assert first.tokens[-1] == "."


def test_ewt_skips_multiword_tokens_and_empty_nodes(ewt_train: list[UDSentence]) -> None:
    # line 205: "19-20 don't" spans the words "do" and "n't"
    assert ewt_train[8].tokens[17:21] == ("I", "do", "n't", "find")
    # line 1746: the empty node "8.1 reported" is not a word
    elided = ewt_train[61]
    assert elided.sent_id.endswith("_ENG_20040409_053012-0022")
    text = " ".join(elided.tokens)
    assert text == "Over 300 Iraqis are reported dead and 500 wounded in Fallujah alone ."
    assert elided.heads == (2, 3, 5, 5, 0, 5, 8, 5, 8, 11, 5, 11, 5)


# CoNLL-2000


def test_conll2000_counts(conll2000_train: list[ChunkSentence]) -> None:
    assert counts(conll2000_train) == (8_936, 211_727)
    assert counts(read_conll2000(data_file("conll2000/test.txt"))) == (2_012, 47_377)


def test_conll2000_first_sentences(conll2000_train: list[ChunkSentence]) -> None:
    train = conll2000_train
    assert train[0].tokens[:5] == ("Confidence", "in", "the", "pound", "is")
    assert train[0].pos[:5] == ("NN", "IN", "DT", "NN", "VBZ")
    assert train[0].chunks[:5] == ("B-NP", "B-PP", "B-NP", "I-NP", "B-VP")
    assert len(train[0]) == 37
    assert train[-1].tokens[-3:] == ("Francisco", "instead", ".")
    test = read_conll2000(data_file("conll2000/test.txt"))
    assert test[0].tokens[:5] == ("Rockwell", "International", "Corp.", "'s", "Tulsa")
    assert test[0].chunks[:5] == ("B-NP", "I-NP", "I-NP", "B-NP", "I-NP")
    chunk_types = {tag[2:] for sentence in train + test for tag in sentence.chunks if tag != "O"}
    assert chunk_types == CONLL2000_CHUNK_TYPES


def test_carve_dev_from_conll2000_train(conll2000_train: list[ChunkSentence]) -> None:
    train = conll2000_train
    rest, dev = carve_dev(train, fraction=0.1, seed=0)
    assert (len(rest), len(dev)) == (8_051, 885)
    assert dev[0].tokens[:3] == ("``", "If", "there")
    position = {id(sentence): i for i, sentence in enumerate(train)}
    for part in (rest, dev):
        indices = [position[id(sentence)] for sentence in part]
        assert indices == sorted(indices)
    assert {id(sentence) for sentence in rest + dev} == set(position)
    assert {sentence.tokens for sentence in rest}.isdisjoint(sentence.tokens for sentence in dev)
    assert carve_dev(train, fraction=0.1, seed=1)[1] != dev


def _toy_sentences() -> list[ChunkSentence]:
    return [
        ChunkSentence((f"w{i}", f"v{i % 7}"), ("NN", "NN"), ("B-NP", "I-NP")) for i in range(500)
    ]


def test_carve_dev_is_the_same_in_another_process() -> None:
    script = (
        "from elmolab.data.conll import ChunkSentence, carve_dev\n"
        "sentences = [ChunkSentence((f'w{i}', f'v{i % 7}'), ('NN', 'NN'), ('B-NP', 'I-NP'))"
        " for i in range(500)]\n"
        "print(' '.join(s.tokens[0] for s in carve_dev(sentences, 0.2, seed=3)[1]))\n"
    )
    dev = carve_dev(_toy_sentences(), 0.2, seed=3)[1]
    assert 60 < len(dev) < 140
    for hash_seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert result.stdout.split() == [sentence.tokens[0] for sentence in dev]


def test_carve_dev_keeps_duplicates_on_one_side() -> None:
    train, dev = carve_dev(_toy_sentences() * 2, fraction=0.3, seed=0)
    assert len(dev) % 2 == 0
    assert {sentence.tokens for sentence in train}.isdisjoint(sentence.tokens for sentence in dev)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_carve_dev_rejects_fraction_outside_open_unit_interval(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction must be in"):
        carve_dev(_toy_sentences(), fraction=fraction)


# WNUT-17


@pytest.mark.parametrize(
    ("name", "n_sentences", "n_tokens"),
    [
        ("wnut17train.conll", 3_394, 62_730),
        ("emerging.dev.conll", 1_009, 15_733),
        ("emerging.test.annotated", 1_287, 23_394),
    ],
)
def test_wnut17_counts_and_entity_types(name: str, n_sentences: int, n_tokens: int) -> None:
    sentences = read_wnut17(data_file(f"wnut17/{name}"))
    assert counts(sentences) == (n_sentences, n_tokens)
    types = {tag[2:] for sentence in sentences for tag in sentence.tags if tag != "O"}
    assert types == WNUT17_ENTITY_TYPES


# CoNLL-2003 English NER, as distributed (IOB1, -DOCSTART- lines), through the columns format


@pytest.mark.parametrize(
    ("split", "n_sentences", "n_tokens", "n_entities", "loose_begins"),
    [
        ("train", 14_041, 203_621, 23_499, 2),
        ("dev", 3_250, 51_362, 5_942, 0),
        ("test", 3_453, 46_435, 5_648, 0),
    ],
)
def test_conll2003_reads_as_distributed(
    split: str, n_sentences: int, n_tokens: int, n_entities: int, loose_begins: int
) -> None:
    files = {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"}
    root = data_file("conll2003")
    config = DatasetConfig(
        "columns", {name: str(root / file) for name, file in files.items()}, str(root)
    )
    source = read_split("conll2003", config, split)
    assert source.scheme is TagScheme.IOB1  # auto, from train
    assert counts(source.sentences) == (n_sentences, n_tokens)
    # IOB2 opens every entity with B-: one B- tag per entity
    tags = [tag for sentence in source.sentences for tag in sentence.tags]
    assert sum(tag.startswith("B-") for tag in tags) == n_entities
    assert {tag[2:] for tag in tags if tag != "O"} == {"PER", "LOC", "ORG", "MISC"}
    assert source.counts == {LOOSE_BEGINS: loose_begins}  # recorded by the extract stage
    if split == "train":
        # line 152428: "Atlanta NNP I-NP B-MISC" after "the DT I-NP O" opens the MISC span
        i, j = next(
            (i, lines.index(152428))
            for i, lines in enumerate(source.token_lines or [])
            if 152428 in lines
        )
        assert source.sentences[i].tokens[j - 1 : j + 2] == ("the", "Atlanta", "Games")
        assert source.sentences[i].tags[j - 1 : j + 2] == ("O", "B-MISC", "I-MISC")


def test_wnut17_first_sentences() -> None:
    train = read_wnut17(data_file("wnut17/wnut17train.conll"))
    assert train[0].tokens[:5] == ("@paulwalk", "It", "'s", "the", "view")
    assert train[0].tokens[14:19] == ("Empire", "State", "Building", "=", "ESB")
    assert train[0].tags[14:19] == ("B-location", "I-location", "I-location", "O", "B-location")
    assert len(train[0]) == 27
    # the next sentence starts after a line holding a lone tab
    assert train[1].tokens[:3] == ("From", "Green", "Newsfeed")
    test = read_wnut17(data_file("wnut17/emerging.test.annotated"))
    assert test[0].tokens[:5] == ("&", "gt", ";", "*", "The")
    assert test[-1].tokens[-3:] == ("dress", "code", "😂")


# Raganato et al. (2017) evaluation sets


@pytest.mark.parametrize(
    ("name", "n_sentences", "n_instances"),
    [
        ("ALL", 1_173, 7_253),
        ("senseval2", 242, 2_282),
        ("senseval3", 352, 1_850),
        ("semeval2007", 135, 455),
        ("semeval2013", 306, 1_644),
        ("semeval2015", 138, 1_022),
    ],
)
def test_raganato_counts(
    name: str, n_sentences: int, n_instances: int, wordnet: WordNetSenseIndex
) -> None:
    folder = f"wsd/raganato_eval/{name}"
    sentences = read_raganato(
        data_file(f"{folder}/{name}.data.xml"), data_file(f"{folder}/{name}.gold.key.txt"), wordnet
    )
    assert len(sentences) == n_sentences
    assert sum(len(sentence.instances) for sentence in sentences) == n_instances


def test_raganato_first_sentence_and_multiword_tokens() -> None:
    folder = "wsd/raganato_eval/ALL"
    sentences = read_raganato(
        data_file(f"{folder}/ALL.data.xml"), data_file(f"{folder}/ALL.gold.key.txt")
    )
    first = sentences[0]
    assert first.sentence_id == "senseval2.d000.s000"
    assert first.tokens[:6] == ("The", "art", "of", "change-ringing", "is", "peculiar")
    art, change_ringing, peculiar = first.instances[:3]
    assert art == SenseInstance(1, "senseval2.d000.s000.t000", "art", "NOUN", ("art%1:09:00::",))
    assert (change_ringing.position, change_ringing.lemma) == (3, "change_ringing")
    assert first.tokens[change_ringing.position] == "change-ringing"
    assert peculiar.sense_keys == (
        "peculiar%5:00:00:specific:00",
        "peculiar%5:00:00:characteristic:00",
    )
    belong = next(s for s in sentences if s.sentence_id == "senseval2.d000.s010")
    assert belong.tokens[:3] == ("They", "belong to", "a")
    assert (belong.instances[0].position, belong.instances[0].lemma) == (1, "belong_to")
    last = sentences[-1].instances[-1]
    assert last.instance_id == "semeval2015.d003.s023.t004"
    assert last.sense_keys == ("people%1:14:03::", "people%1:14:00::")


# SemCor 3.0


def test_semcor_counts(semcor: list[WsdSentence]) -> None:
    assert counts(semcor) == (37_176, 778_587)
    assert sum(len(sentence.instances) for sentence in semcor) == 225_415


def test_semcor_first_sentence(semcor: list[WsdSentence]) -> None:
    first = semcor[0]
    assert first.sentence_id == "d000.s000"
    assert first.tokens[:4] == ("The", "Fulton_County_Grand_Jury", "said", "Friday")
    assert len(first) == 21
    jury, said = first.instances[:2]
    assert jury == SenseInstance(1, "d000.s000.t001", "group", "NOUN", ("group%1:03:00::",))
    assert said == SenseInstance(2, "d000.s000.t002", "say", "VERB", ("say%2:32:00::",))
    recent = first.instances[5]
    assert (first.tokens[recent.position], recent.pos) == ("recent", "ADJ")
    assert semcor[1].sentence_id == "d000.s001"


def test_semcor_keys_match_its_gold_key_file(
    semcor: list[WsdSentence], wordnet: WordNetSenseIndex
) -> None:
    gold = read_gold_keys(data_file("wsd/semcor30/semcor30.gold.key.txt"), wordnet)
    tsv = {i.instance_id: i.sense_keys for sentence in semcor for i in sentence.instances}
    assert gold == tsv


# WordNet 3.0 index.sense


def test_wordnet_sense_index(wordnet: WordNetSenseIndex) -> None:
    assert len(wordnet) == 206_941
    assert "'hood%1:15:00::" in wordnet
    assert wordnet.sense_number("bank%1:06:00::") == 9
    assert wordnet.first_sense("bank", "NOUN") == "bank%1:17:01::"
    assert wordnet.senses("bank", "NOUN")[:3] == (
        "bank%1:17:01::",
        "bank%1:14:00::",
        "bank%1:17:00::",
    )
    # adjectives (ss_type 3) and satellites (5) are numbered together
    assert wordnet.senses("good", "ADJ")[:3] == (
        "good%3:00:01::",
        "good%5:00:00:ample:00",
        "good%3:00:02::",
    )
    assert wordnet.first_sense("peculiar", "ADJ") == "peculiar%5:00:00:strange:00"
    assert wordnet.first_sense("say", "VERB") == "say%2:32:00::"
    assert wordnet.first_sense("well", "ADV") == "well%4:02:00::"
    assert wordnet.first_sense("no_such_lemma", "NOUN") is None
    with pytest.raises(KeyError):
        wordnet.sense_number("bank%1:99:99::")
    with pytest.raises(ValueError, match="pos must be one of"):
        wordnet.senses("bank", "n")


@pytest.mark.parametrize(
    ("key", "lemma", "pos"),
    [
        ("art%1:09:00::", "art", "NOUN"),
        ("say%2:32:00::", "say", "VERB"),
        ("most%3:00:02::", "most", "ADJ"),
        ("peculiar%5:00:00:strange:00", "peculiar", "ADJ"),
        ("well%4:02:00::", "well", "ADV"),
        ("'hood%1:15:00::", "'hood", "NOUN"),
    ],
)
def test_sense_key_lemma_pos(key: str, lemma: str, pos: str) -> None:
    assert sense_key_lemma_pos(key) == (lemma, pos)


@pytest.mark.parametrize("key", ["art", "art%1:09:00", "art%6:09:00::", "%1:09:00::"])
def test_sense_key_lemma_pos_rejects_malformed_keys(key: str) -> None:
    with pytest.raises(ValueError, match="malformed sense key"):
        sense_key_lemma_pos(key)
