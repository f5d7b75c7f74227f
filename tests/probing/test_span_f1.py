"""Span F1 (seqeval, counted as conlleval does) and accuracy against hand-computed values."""

from pathlib import Path

import pytest
import torch
from seqeval.metrics.sequence_labeling import get_entities

from elmolab.data.conll import TagScheme, read_columns, read_conll2000, read_wnut17
from elmolab.data.labels import LabelVocabulary
from elmolab.probing.metrics import (
    accuracy,
    conlleval_codes,
    sentence_span_counts,
    span_f1,
    span_f1_of_counts,
    task_score,
    untyped_span_f1,
)


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize(
    ("gold", "predicted", "expected"),
    [
        pytest.param(
            [["B-NP", "I-NP", "O", "B-VP"]], [["B-NP", "I-NP", "O", "B-VP"]], 1.0, id="exact"
        ),
        # gold NP(0-1) LOC(3); predicted NP(0) LOC(3): a partial span is wrong, 1 of 2 right
        pytest.param(
            [["B-NP", "I-NP", "O", "B-LOC"]], [["B-NP", "O", "O", "B-LOC"]], 0.5, id="partial"
        ),
        # the right boundaries with the wrong type count for nothing
        pytest.param(
            [["B-PER", "I-PER", "O", "B-ORG"]], [["B-ORG", "I-ORG", "O", "B-ORG"]], 0.5, id="type"
        ),
        # conlleval: an I- that starts the sentence (or follows O) opens a chunk
        pytest.param([["O", "B-NP", "I-NP"]], [["O", "I-NP", "I-NP"]], 1.0, id="I-without-B"),
        # conlleval: I-VP after B-NP closes NP and opens VP; gold has one NP chunk, predicted
        # NP(0) and VP(1): nothing right
        pytest.param([["B-NP", "I-NP"]], [["B-NP", "I-VP"]], 0.0, id="I-of-another-type"),
        # ... which is why B-NP I-VP matches gold B-NP B-VP exactly
        pytest.param([["B-NP", "B-VP"]], [["B-NP", "I-VP"]], 1.0, id="I-type-change-opens"),
        # 4 gold chunks, 2 predicted, both right: P = 1, R = 1/2
        pytest.param(
            [["B-NP", "O", "B-NP", "B-PP"], ["B-NP"]],
            [["B-NP", "O", "O", "B-PP"], ["O"]],
            _f1(1.0, 1 / 2),
            id="micro-over-sentences",
        ),
        # a chunk never continues into the next sentence: I-NP there opens a new chunk
        pytest.param([["B-NP"], ["I-NP"]], [["B-NP"], ["B-NP"]], 1.0, id="sentence-boundary"),
        pytest.param([["O", "O"]], [["O", "O"]], 0.0, id="no-chunks"),
        # 2 gold chunks; predicted NP(0-1) wrong, VP(3) right and a spurious NP(4): P 1/3, R 1/2
        pytest.param(
            [["B-NP", "O", "O", "B-VP", "O"]],
            [["B-NP", "I-NP", "O", "B-VP", "I-NP"]],
            _f1(1 / 3, 1 / 2),
            id="spurious",
        ),
    ],
)
def test_span_f1_hand_computed(
    gold: list[list[str]], predicted: list[list[str]], expected: float
) -> None:
    assert span_f1(gold, predicted) == pytest.approx(expected)


def test_span_f1_rejects_misaligned_input() -> None:
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        span_f1([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="1 gold sentences but 2 predicted"):
        span_f1([["O"]], [["O"], ["O"]])


def test_accuracy_is_micro() -> None:
    gold = torch.tensor([0, 0, 0, 1, 2, 2])
    predicted = torch.tensor([0, 0, 1, 1, 2, 0])
    assert accuracy(predicted, gold, num_classes=3) == pytest.approx(4 / 6)


def test_task_score_decodes_sentences_for_span_f1() -> None:
    vocabulary = LabelVocabulary(["B-NP", "I-NP", "O"])  # ids 0, 1, 2
    gold = torch.tensor([0, 1, 2, 0])  # sentences [B-NP I-NP O] [B-NP]
    predicted = torch.tensor([0, 2, 2, 1])  # [B-NP O O] [I-NP]: the second chunk is right
    assert task_score("span_f1", predicted, gold, [3, 1], vocabulary) == pytest.approx(0.5)
    assert task_score("accuracy", predicted, gold, [3, 1], vocabulary) == pytest.approx(0.5)


def test_predictions_are_written_in_the_data_scheme() -> None:
    """Test predictions of a BIOES dataset come out in BIOES (the chunks the scorer reads, a
    stray I- opening one as in conlleval); IOB2 data, and labels read without a scheme, come
    out as predicted."""
    labels = ["B-PER", "I-PER", "O"]  # ids 0, 1, 2: the IOB2 tags the data was converted to
    # [B-PER I-PER O B-PER] [I-PER O]: a two-token span, a one-token span; a stray I-PER
    predicted = torch.tensor([0, 1, 2, 0, 1, 2])
    lengths = [4, 2]
    bioes = LabelVocabulary(labels, scheme=TagScheme.BIOES)
    assert bioes.decode_in_data_scheme(predicted, lengths) == [
        ["B-PER", "E-PER", "O", "S-PER"],
        ["S-PER", "O"],
    ]
    iob1 = LabelVocabulary(labels, scheme=TagScheme.IOB1)
    assert iob1.decode_in_data_scheme(predicted, lengths) == [
        ["I-PER", "I-PER", "O", "I-PER"],
        ["I-PER", "O"],
    ]
    as_predicted = [["B-PER", "I-PER", "O", "B-PER"], ["I-PER", "O"]]
    for vocabulary in (LabelVocabulary(labels, scheme=TagScheme.IOB2), LabelVocabulary(labels)):
        assert vocabulary.decode_in_data_scheme(predicted, lengths) == as_predicted


# conlleval's count on IOB1 data as distributed (CoNLL-2003), worked by hand. Gold chunks:
#   s1 "the Atlanta Games": B-MISC after O opens MISC(1-2)             -> MISC[1,3)
#   s2 "Peter Blackburn of Reuters John": PER[0,2), ORG[3,4); B-PER after I-ORG opens PER[4,5)
# Predicted:
#   s1 I-MISC I-MISC after O: MISC[1,3), right
#   s2 I-PER I-PER O I-ORG I-PER: PER[0,2) right, ORG[3,4) right, and I-PER after I-ORG (another
#      type) opens PER[4,5), right; then I-LOC after I-PER in s3 opens LOC[0,1), spurious
#   s3 gold "in" O; predicted I-LOC: spurious
# 4 gold, 5 predicted, 4 correct: P 4/5, R 1, F1 8/9. Untyped: the same boundaries, 8/9.
CONLL2003_GOLD = ["O B-MISC I-MISC", "I-PER I-PER O I-ORG B-PER", "O"]
CONLL2003_PREDICTED = ["O I-MISC I-MISC", "I-PER I-PER O I-ORG I-PER", "I-LOC"]


def test_conlleval_count_on_iob1_data_hand_computed(tmp_path: Path) -> None:
    rows = []
    for gold, predicted in zip(CONLL2003_GOLD, CONLL2003_PREDICTED, strict=True):
        pairs = zip(gold.split(), predicted.split(), strict=True)
        rows += [f"w{i} NNP I-NP {g} {p}" for i, (g, p) in enumerate(pairs)] + [""]
    path = tmp_path / "eng.train"
    path.write_text("-DOCSTART- -X- -X- O O\n\n" + "\n".join(rows), encoding="utf-8")
    gold = [list(s.tags) for s in read_columns(path, TagScheme.IOB1, label_column=3)]
    predicted = [list(s.tags) for s in read_columns(path, TagScheme.IOB1, label_column=4)]
    assert gold == [["O", "B-MISC", "I-MISC"], ["B-PER", "I-PER", "O", "B-ORG", "B-PER"], ["O"]]
    vocabulary = LabelVocabulary.from_sentences(gold + predicted, scheme=TagScheme.IOB1)
    lengths = [len(s) for s in gold]
    gold_ids, predicted_ids = (
        torch.tensor([i for s in vocabulary.encode(side) for i in s]) for side in (gold, predicted)
    )
    for untyped in (False, True):
        score = task_score("span_f1", predicted_ids, gold_ids, lengths, vocabulary, untyped=untyped)
        assert score == pytest.approx(8 / 9)
    # seqeval's default mode, on the IOB1 tags as written, counts the same chunks
    written = [s.split() for s in CONLL2003_GOLD], [s.split() for s in CONLL2003_PREDICTED]
    assert span_f1(*written) == pytest.approx(8 / 9)
    # a wrong type on PER[4,5) costs the typed score only: P 3/5, R 3/4
    predicted[1][4] = "B-LOC"
    wrong_type = torch.tensor([i for s in vocabulary.encode(predicted) for i in s])
    assert task_score("span_f1", wrong_type, gold_ids, lengths, vocabulary) == pytest.approx(
        _f1(3 / 5, 3 / 4)
    )
    untyped_score = task_score("span_f1", wrong_type, gold_ids, lengths, vocabulary, untyped=True)
    assert untyped_score == pytest.approx(8 / 9)


# Span F1 on label ids (what the probe engine scores with) against seqeval on the decoded tags:
# the same float, typed and untyped, on random sequences (ill-formed ones included: I- after O or
# after another type, empty sentences, a gold-only label) and on real CoNLL-2000 chunk tags.
def _seqeval_on_ids(vocabulary, gold, predicted, lengths, untyped):
    decode = vocabulary.decode_sentences
    score = untyped_span_f1 if untyped else span_f1
    return score(decode(gold, lengths), decode(predicted, lengths))


@pytest.mark.parametrize("untyped", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_span_f1_of_ids_equals_seqeval_on_random_tags(seed: int, untyped: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    # types named like prefixes too, and types with hyphens (WNUT-17's creative-work)
    kinds = ["NP", "creative-work", "VP", "B", "I-NP", "O", "B-"][: 1 + seed % 7]
    labels = ["O"] + [f"{p}-{k}" for k in kinds for p in "BI"]
    vocabulary = LabelVocabulary(labels[:-1], unseen="keep")
    vocabulary.encode([[labels[-1]]])  # a label only the gold side has (an evaluation-only id)
    lengths = torch.randint(
        0, 9, (int(torch.randint(1, 40, (1,), generator=generator)),), generator=generator
    ).tolist()
    tokens = sum(lengths)
    gold = torch.randint(0, len(vocabulary), (tokens,), generator=generator)
    # predictions: mostly the gold tags (many matches), some random ones
    noise = torch.randint(0, vocabulary.num_train_labels, (tokens,), generator=generator)
    keep = torch.rand(tokens, generator=generator) < 0.6
    predicted = torch.where(keep & (gold < vocabulary.num_train_labels), gold, noise)
    assert conlleval_codes(vocabulary.labels) is not None  # scored on ids, not by seqeval
    expected = _seqeval_on_ids(vocabulary, gold, predicted, lengths, untyped)
    score = task_score("span_f1", predicted, gold, lengths, vocabulary, untyped=untyped)
    assert score == expected
    if not untyped:
        counts = sentence_span_counts(predicted, gold, lengths, vocabulary)
        assert counts == _seqeval_counts(vocabulary, gold, predicted, lengths)
        assert span_f1_of_counts(*(sum(counts[k]) for k in ("tp", "pred", "gold"))) == score


def _seqeval_counts(vocabulary, gold, predicted, lengths) -> dict[str, list[int]]:
    """Per sentence, the right, predicted and gold chunks as seqeval's default mode finds them."""
    counts = {"tp": [], "pred": [], "gold": []}
    for gold_tags, predicted_tags in zip(
        vocabulary.decode_sentences(gold, lengths),
        vocabulary.decode_sentences(predicted, lengths),
        strict=True,
    ):
        true, found = set(get_entities(gold_tags)), set(get_entities(predicted_tags))
        for key, chunks in (("tp", found & true), ("pred", found), ("gold", true)):
            counts[key].append(len(chunks))
    return counts


# Typed chunks per sentence, by hand (conlleval's count):
#   s1 gold PER[0,2) LOC[3];  predicted PER[0,2) right, ORG[3] wrong type   tp 1, pred 2, gold 2
#   s2 gold ORG[1];  predicted MISC[0], and I-ORG after MISC opens ORG[1]   tp 1, pred 2, gold 1
#   s3 gold LOC[0] PER[1];  predicted nothing                              tp 0, pred 0, gold 2
# Sums tp 2, pred 4, gold 5: P = 2/4, R = 2/5, F1 = 2 (1/2)(2/5) / (1/2 + 2/5) = (2/5) / (9/10)
# = 4/9, which is 2 tp / (pred + gold) = 4/9.
SPAN_GOLD = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG"], ["B-LOC", "B-PER"]]
SPAN_PREDICTED = [["B-PER", "I-PER", "O", "B-ORG"], ["B-MISC", "I-ORG"], ["O", "O"]]


@pytest.mark.parametrize("odd_label", [[], ["E-PER"]], ids=["on-ids", "through-seqeval"])
def test_sentence_span_counts_hand_computed(odd_label: list[str]) -> None:
    labels = ["O"] + [f"{p}-{k}" for k in ("PER", "LOC", "ORG", "MISC") for p in "BI"]
    vocabulary = LabelVocabulary(labels + odd_label)  # an E- label: seqeval counts the chunks
    assert (conlleval_codes(vocabulary.labels) is None) == bool(odd_label)
    lengths = [len(s) for s in SPAN_GOLD]
    gold, predicted = (
        torch.tensor([i for s in vocabulary.encode(side) for i in s])
        for side in (SPAN_GOLD, SPAN_PREDICTED)
    )
    counts = sentence_span_counts(predicted, gold, lengths, vocabulary)
    assert counts == {"tp": [1, 1, 0], "pred": [2, 2, 0], "gold": [2, 1, 2]}
    score = task_score("span_f1", predicted, gold, lengths, vocabulary)
    assert span_f1_of_counts(2, 4, 5) == score == pytest.approx(4 / 9)
    # 2 tp / (pred + gold) is the same number but not the same float: 0.4444444444444444, where
    # seqeval's order of operations (span_f1_of_counts) gives 0.4444444444444445
    assert score == pytest.approx(2 * 2 / (4 + 5)) and score != 2 * 2 / (4 + 5)
    # a resample of sentences (s2 twice, s3): tp 2, pred 4, gold 4, F1 1/2
    assert span_f1_of_counts(1 + 1 + 0, 2 + 2 + 0, 1 + 1 + 2) == 0.5
    assert span_f1_of_counts(0, 0, 2) == span_f1_of_counts(0, 0, 0) == 0.0


@pytest.mark.parametrize(
    ("file", "read", "field"),
    [
        ("conll2000/test.txt", read_conll2000, "chunks"),
        ("wnut17/emerging.test.annotated", read_wnut17, "tags"),  # types with hyphens
    ],
)
def test_span_f1_of_ids_equals_seqeval_on_real_tags(file: str, read, field: str) -> None:
    path = Path(__file__).resolve().parents[2] / "data" / "probing" / file
    if not path.is_file():
        pytest.skip(f"{file} is not pulled (make data)")
    sentences = [getattr(sentence, field) for sentence in read(path)]
    vocabulary = LabelVocabulary([t for s in sentences for t in s])
    assert conlleval_codes(vocabulary.labels) is not None  # scored on ids, not by seqeval
    lengths = [len(s) for s in sentences]
    gold = torch.tensor([i for ids in vocabulary.encode(sentences) for i in ids])
    generator = torch.Generator().manual_seed(0)
    for rate in (0.0, 0.05, 0.3):  # a probe's errors: a share of the tags replaced at random
        noise = torch.randint(0, len(vocabulary), gold.shape, generator=generator)
        predicted = torch.where(torch.rand(gold.shape, generator=generator) < rate, noise, gold)
        for untyped in (False, True):
            expected = _seqeval_on_ids(vocabulary, gold, predicted, lengths, untyped)
            score = task_score("span_f1", predicted, gold, lengths, vocabulary, untyped=untyped)
            assert score == expected


def test_labels_outside_iob2_go_through_seqeval() -> None:
    assert conlleval_codes(["O", "B-NP", "I-NP"]) is not None
    for odd in (["O", "E-NP"], ["O", "S-NP"], ["B-"], ["B-_"], ["O-NP"], ["NP"]):
        assert conlleval_codes(odd) is None
    vocabulary = LabelVocabulary(["O", "B-NP", "E-NP"])  # IOBES-like tags: seqeval decides
    ids = torch.tensor(vocabulary.encode([["B-NP", "E-NP", "O"]])[0])
    assert task_score("span_f1", ids, ids, [3], vocabulary) == 1.0
