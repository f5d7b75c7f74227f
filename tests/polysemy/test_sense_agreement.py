"""The polysemy stage's sense agreement: leave-one-out nearest-neighbour agreement against an
independent loop, ties counted as a share, its block of ``neighbours.json`` (round trip, older
files, bad files) and the stage on hand-made and on the real SemCor."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import expect_error
from fixtures.report.fake_artifacts import report_config, write_model_and_vocab, write_semcor

from elmolab.io.polysemy import (
    TABLE_FILE,
    PolysemyTable,
    SenseAgreement,
    WordNeighbours,
    read_table,
    write_table,
)
from elmolab.polysemy.neighbours import sense_agreement
from elmolab.stages.polysemy import run as polysemy_stage
from elmolab.text.chars import SPECIAL_TOKENS

PLAY, STAGE = "play%2:33:00::", "play%1:10:01::"  # the verb (a game), the noun (theatre)


def _loop_agreement(vectors: np.ndarray, senses: list[str]) -> list[float]:
    """The same measure, one occurrence at a time in plain Python."""
    shares = []
    for i, v in enumerate(vectors):
        cosines = {
            j: float(v @ w / (np.linalg.norm(v) * np.linalg.norm(w)))
            for j, w in enumerate(vectors)
            if j != i
        }
        highest = max(cosines.values())
        nearest = [j for j, c in cosines.items() if c >= highest - 1e-6]
        shares.append(sum(senses[j] == senses[i] for j in nearest) / len(nearest))
    return shares


def test_tied_neighbours_count_as_a_share_of_agreement():
    # Occurrences 0-2 have one vector (spelled alike, on the token layer); 3 is orthogonal to
    # them, so its nearest are all three (cosine 0).
    vectors = torch.tensor([[1.0, 0.0], [1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    shares = sense_agreement(vectors, ["a", "a", "b", "b"])
    assert shares.tolist() == [1 / 2, 1 / 2, 0.0, 1 / 3]
    assert shares.dtype == torch.float64


def test_agreement_equals_a_plain_loop_on_random_vectors_with_duplicates():
    generator = torch.Generator().manual_seed(0)
    vectors = torch.randn(30, 8, generator=generator)
    vectors[10:20] = vectors[0]  # ties, as on the token layer
    senses = [f"s{i % 3}" for i in range(30)]
    expected = _loop_agreement(vectors.double().numpy(), senses)
    assert sense_agreement(vectors, senses).tolist() == pytest.approx(expected, abs=1e-12)


def test_a_single_occurrence_has_no_agreement():
    assert sense_agreement(torch.ones(1, 4), ["a"]).shape == (0,)
    with pytest.raises(ValueError, match="2 vectors but 1 sense keys"):
        sense_agreement(torch.ones(2, 4), ["a"])


# --- the file ---------------------------------------------------------------------------------


def _agreement() -> SenseAgreement:
    return SenseAgreement(
        ("play", "play", "play", "bank", "bank"),
        (PLAY, PLAY, STAGE, "bank%1:14:00::", "bank%1:17:01::"),
        np.array([1.0, 0.5, 0.0, 0.0, 1 / 3]),
        np.array([0.5, 0.5, 0.0, 0.0, 0.0]),
        [1, 2],
    )


def _table(agreement: SenseAgreement | None) -> PolysemyTable:
    return PolysemyTable([1, 2], [WordNeighbours("play", [("game", 0.5)], [], 3)], [], agreement)


def test_the_agreement_block_round_trips_with_per_word_means(tmp_path):
    path = tmp_path / TABLE_FILE
    write_table(_table(_agreement()), path)
    block = json.loads(path.read_text(encoding="utf-8"))["sense_agreement"]
    assert block["occurrences"][2] == {
        "word": "play",
        "sense_key": STAGE,
        "contextual": 0.0,
        "token_layer": 0.0,
    }
    assert block["words"] == [
        {"word": "play", "occurrences": 3, "contextual": 0.5, "token_layer": 1 / 3},
        {"word": "bank", "occurrences": 2, "contextual": 1 / 6, "token_layer": 0.0},
    ]
    read = read_table(path).agreement
    written = _agreement()
    assert (read.words, read.sense_keys) == (written.words, written.sense_keys)
    assert read.contextual_layers == [1, 2]
    np.testing.assert_array_equal(read.contextual, written.contextual)
    np.testing.assert_array_equal(read.token_layer, written.token_layer)
    assert read.word_means() == written.word_means()


def test_without_agreement_and_in_older_files_it_reads_as_none(tmp_path):
    path = tmp_path / TABLE_FILE
    write_table(_table(None), path)
    assert read_table(path).agreement is None
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["sense_agreement"]  # a file written before the block existed
    path.write_text(json.dumps(data), encoding="utf-8")
    assert read_table(path).agreement is None


BAD_BLOCKS = {
    "a share above 1": (
        lambda b: b["occurrences"][1].update(contextual=1.5),
        "sense_agreement: occurrence 1 ('play') has a contextual share 1.5, not in [0, 1]",
    ),
    "a NaN share": (
        lambda b: b["occurrences"][4].update(token_layer=math.nan),
        "sense_agreement: occurrence 4 ('bank') has a token_layer share nan, not in [0, 1]",
    ),
    "a share that is a string": (
        lambda b: b["occurrences"][0].update(token_layer="0.5"),
        "sense_agreement.occurrences[0].token_layer: '0.5' is not a number",
    ),
    "a missing field": (lambda b: b["occurrences"][3].pop("sense_key"), "'sense_key'"),
    "a word that is no string": (
        lambda b: b["occurrences"][0].update(word=1),
        "sense_agreement.occurrences[0].word: 1 is not a string",
    ),
    "a mean that is not its occurrences'": (
        lambda b: b["words"][1].update(contextual=0.5),
        "sense_agreement.words: 'bank' says 2 occurrences with means [0.5, 0.0], its "
        "occurrences are 2 with means",
    ),
    "a word without its mean": (
        lambda b: b["words"].pop(),
        "sense_agreement.words: ['play'] are not the words of its occurrences, ['play', 'bank']",
    ),
}


@pytest.mark.parametrize("case", BAD_BLOCKS)
def test_a_bad_agreement_block_is_one_line_naming_the_file(tmp_path, case):
    path = tmp_path / TABLE_FILE
    write_table(_table(_agreement()), path)
    data = json.loads(path.read_text(encoding="utf-8"))
    change, problem = BAD_BLOCKS[case]
    change(data["sense_agreement"])
    path.write_text(json.dumps(data), encoding="utf-8")
    expect_error(lambda: read_table(path), path, None, f"not a polysemy table: {problem}")


# --- the stage --------------------------------------------------------------------------------

WORDS = [
    {"word": "play", "examples": ["The children [play] football ."]},
    {"word": "bank", "examples": ["The [bank] lent money ."]},
    {"word": "plant", "examples": ["Water the [plant] ."]},
]


def test_the_stage_scores_words_with_two_or_more_occurrences(tmp_path):
    """Occurrences spelled alike tie on the token layer: its shares are the share of the other
    occurrences with the same sense. ``bank`` occurs once and ``plant`` not at all: unscored."""
    write_model_and_vocab(tmp_path / "artifacts")
    semcor = [
        ("We play tennis on Sunday", {1: PLAY}),
        ("The children play football after school", {2: PLAY}),
        ("Critics saw the play in London", {3: STAGE}),
        ("The bank lent money", {1: "bank%1:14:00::"}),
    ]
    write_semcor(tmp_path / "data" / "probing" / "wsd" / "semcor30" / "semcor30.tsv.gz", semcor)
    cfg = report_config(tmp_path, **{"polysemy.words": WORDS})
    out = tmp_path / "artifacts" / "polysemy"
    polysemy_stage(cfg, out)
    table = read_table(out / TABLE_FILE)
    agreement = table.agreement
    assert agreement.words == ("play", "play", "play")
    assert agreement.sense_keys == (PLAY, PLAY, STAGE)
    assert agreement.token_layer.tolist() == [0.5, 0.5, 0.0]
    assert all(share in (0.0, 0.5, 1.0) for share in agreement.contextual.tolist())
    assert agreement.contextual_layers == table.contextual_layers == [2]
    assert [w.semcor_occurrences for w in table.words] == [3, 1, 0]


@pytest.mark.slow
def test_the_stage_on_the_real_semcor_scores_every_word_in_0_1(tmp_path, fixture_dir, data_dir):
    """bilm-tf's tiny reference model over the pulled SemCor 3.0, the configured words."""
    bilm = tmp_path / "bilm"
    bilm.mkdir()
    shutil.copy(fixture_dir / "options.json", bilm / "options.json")
    shutil.copy(fixture_dir / "lm_weights.hdf5", bilm / "weights.hdf5")
    vocab = tmp_path / "vocab.txt"  # the fixture's words, its special tokens first as ours
    words = (fixture_dir / "vocab_test.txt").read_text(encoding="utf-8").split()
    vocab.write_text("\n".join(dict.fromkeys([*SPECIAL_TOKENS, *words])) + "\n", encoding="utf-8")
    semcor = data_dir / "probing" / "wsd" / "semcor30" / "semcor30.tsv.gz"
    overrides = {
        "polysemy.bilm": str(bilm),
        "polysemy.vocab": str(vocab),
        "polysemy.semcor": str(semcor),
        "polysemy.contextual_layers": [1, 2],
    }
    cfg = report_config(tmp_path, **overrides)
    polysemy_stage(cfg, tmp_path / "polysemy")
    table = read_table(tmp_path / "polysemy" / TABLE_FILE)
    agreement = table.agreement
    assert agreement is not None and agreement.contextual_layers == [1, 2]
    assert list(agreement.word_means()) == [w.word for w in table.words]
    for shares in (agreement.contextual, agreement.token_layer):
        assert len(shares) > 100 and np.all((shares >= 0) & (shares <= 1))
    for word in table.words:  # every occurrence scored: each word occurs more than once
        assert agreement.word_means()[word.word][0] == word.semcor_occurrences
