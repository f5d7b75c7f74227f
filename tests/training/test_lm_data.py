"""The vocabulary and bilm-tf's LM batches: packing, directions, ranks, resuming, bad input."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from elmolab.core.errors import ElmolabError
from elmolab.text.chars import BOS_CHAR, EOS_CHAR, EOW_CHAR, char_ids_for_token
from elmolab.text.vocab import Vocabulary, build_vocabulary
from elmolab.training.data import (
    LMBatchIterator,
    LMDataModule,
    SentenceEncoder,
    ShardedCorpus,
)

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "naïve", "日本", "x", "rare"]
IN_VOCABULARY = ["the", "a", "cat", "dog", "sat", "on", "naïve"]  # the others are <UNK>


def _sentences(rng: random.Random, first: int, count: int) -> list[list[str]]:
    """Random sentences made unique by a first word ``s<index>`` (out of the vocabulary)."""
    return [
        [f"s{index}"] + [rng.choice(WORDS) for _ in range(rng.randint(0, 8))]
        for index in range(first, first + count)
    ]


def _write_corpus(root: Path, shard_sizes: dict[str, list[int]]) -> None:
    """Shards of random sentences under ``root/<split>/`` plus ``root/vocab.txt``."""
    rng = random.Random(0)
    for split, sizes in shard_sizes.items():
        (root / split).mkdir(parents=True)
        first = 0
        for shard, size in enumerate(sizes):
            sentences = _sentences(rng, first, size)
            text = "".join(" ".join(sentence) + "\n" for sentence in sentences)
            (root / split / f"shard-{shard:05d}.txt").write_text(text, encoding="utf-8")
            first += size
    Vocabulary(build_vocabulary(Counter(IN_VOCABULARY), None)).save(root / "vocab.txt")


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    _write_corpus(root, {"train": [20, 0, 15, 25], "valid": [9, 8], "test": [5]})
    return root


@pytest.fixture(scope="module")
def encoder(corpus_dir: Path) -> SentenceEncoder:
    return SentenceEncoder(Vocabulary.from_file(corpus_dir / "vocab.txt"))


@pytest.fixture(scope="module")
def train(corpus_dir: Path) -> ShardedCorpus:
    return ShardedCorpus.from_dir(corpus_dir / "train")


def _token(char_ids: list[int]) -> str:
    """Invert ``char_ids_for_token`` (+1 shift, BOW, bytes, EOW, padding); "" for no token."""
    if not any(char_ids):
        return ""
    ids = [i - 1 for i in char_ids]
    body = ids[1 : ids.index(EOW_CHAR)]
    return {(BOS_CHAR,): "<S>", (EOS_CHAR,): "</S>"}.get(tuple(body)) or bytes(body).decode()


def _streams(batches: list[dict], direction: str) -> list[tuple[list[str], list[int], list[int]]]:
    """Per row: the input tokens (read from the char ids), input ids and targets, all batches."""
    rows = batches[0]["mask"].shape[0]
    streams = []
    for row in range(rows):
        chars = torch.cat([b[f"{direction}_char_ids"][row] for b in batches]).tolist()
        ids = torch.cat([b[f"{direction}_token_ids"][row] for b in batches]).tolist()
        targets = torch.cat([b[f"{direction}_targets"][row] for b in batches]).tolist()
        streams.append(([_token(c) for c in chars], ids, targets))
    return streams


def _complete_sentences(tokens: list[str], start: str) -> list[tuple[str, ...]]:
    """The sentences between consecutive ``start`` marks, without the mark."""
    marks = [i for i, token in enumerate(tokens) if token == start]
    return [tuple(tokens[a + 1 : b]) for a, b in itertools.pairwise(marks)]


def _assert_same_batches(left: list[dict], right: list[dict]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


def test_build_vocabulary_orders_by_count_then_token() -> None:
    counts = Counter({"b": 3, "a": 3, "c": 5, "d": 1, "<UNK>": 9})
    assert build_vocabulary(counts, None) == ["<S>", "</S>", "<UNK>", "c", "a", "b", "d"]
    assert build_vocabulary(counts, None, min_count=3) == ["<S>", "</S>", "<UNK>", "c", "a", "b"]
    assert build_vocabulary(counts, max_size=5) == ["<S>", "</S>", "<UNK>", "c", "a"]


def test_vocabulary_round_trip_and_lookup(tmp_path: Path) -> None:
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "the", "日本"])
    vocab.save(tmp_path / "vocab.txt")
    loaded = Vocabulary.from_file(tmp_path / "vocab.txt")
    assert loaded.tokens == vocab.tokens and len(loaded) == 5
    assert (loaded.bos_id, loaded.eos_id, loaded.unk_id) == (0, 1, 2)
    assert loaded.ids(["the", "日本", "unseen"]) == [3, 4, 2]
    assert loaded.token_to_id("unseen") == 2 and loaded.id_to_token(4) == "日本"
    assert "the" in loaded and "unseen" not in loaded


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("</S>\n<S>\n<UNK>\n", 1, "expected '<S>'"),
        ("<S>\n</S>\n", 3, "expected '<UNK>' here"),
        ("<S>\n</S>\n<UNK>\nthe\ncat\nthe\n", 6, "already appears at line 4"),
        ("<S>\n</S>\n<UNK>\nthe\n\ncat\n", 5, "empty token"),
        ("<S>\n</S>\n<UNK>\nthe cat\n", 4, "whitespace U+0020"),
        ("<S>\r\n</S>\r\n<UNK>\r\n", 1, "expected '<S>'"),
    ],
)
def test_vocabulary_file_errors_name_file_and_line(
    tmp_path: Path, text: str, line: int, problem: str
) -> None:
    path = tmp_path / "vocab.txt"
    path.write_bytes(text.encode())
    with pytest.raises(ElmolabError, match=re.escape(problem)) as error:
        Vocabulary.from_file(path)
    assert (error.value.path, error.value.line) == (str(path), line)


def test_a_vocabulary_from_a_list_names_the_bad_entry() -> None:
    with pytest.raises(ElmolabError, match="vocabulary entry 5: 'a' already appears at entry 4"):
        Vocabulary(["<S>", "</S>", "<UNK>", "a", "a"])


def test_encoder_gives_vocabulary_ids_and_real_characters(encoder: SentenceEncoder) -> None:
    ids, chars = encoder.encode(["the", "rare", "日本"])
    vocab = encoder.vocab
    assert ids.tolist() == [vocab.bos_id, vocab.token_to_id("the"), vocab.unk_id, vocab.unk_id, 1]
    for position, token in enumerate(["<S>", "the", "rare", "日本", "</S>"]):
        assert chars[position].tolist() == char_ids_for_token(token)
    assert encoder.char_table.shape == (len(vocab), 50)


def _epoch_sentences(
    batches: list[dict], n_sentences: int, global_streams: int, first_stream: int, epoch: int
) -> list[tuple[str, ...]]:
    """The sentences each row read in data epoch ``epoch``: global stream ``g`` reads
    ``len(range(g, n_sentences, global_streams))`` sentences per epoch."""
    read = []
    for row, (tokens, _, _) in enumerate(_streams(batches, "forward")):
        per_epoch = len(range(first_stream + row, n_sentences, global_streams))
        sentences = _complete_sentences(tokens, "<S>")
        assert len(sentences) >= (epoch + 1) * per_epoch, "iterate more batches"
        read += sentences[epoch * per_epoch : (epoch + 1) * per_epoch]
    return read


def test_rows_pack_sentences_into_exactly_unroll_steps_pairs(
    train: ShardedCorpus, encoder: SentenceEncoder
) -> None:
    iterator = LMBatchIterator(train, encoder, batch_size=3, unroll_steps=7, seed=0)
    batches = [next(iterator) for _ in range(45)]  # more than two data epochs per stream
    for index, batch in enumerate(batches):
        assert batch["batch_index"] == index
        assert batch["forward_char_ids"].shape == batch["backward_char_ids"].shape == (3, 7, 50)
        for key in ("forward_token_ids", "forward_targets", "backward_targets", "mask"):
            assert batch[key].shape == (3, 7)
        assert batch["forward_char_ids"].dtype == batch["forward_targets"].dtype == torch.long
        assert batch["mask"].all()

    for tokens, ids, targets in _streams(batches, "forward"):
        assert ids == encoder.vocab.ids(tokens)  # the token ids are those of the characters
        for t in range(len(ids) - 1):  # targets are the next inputs, but </S> then <S>
            assert targets[t] == ids[t + 1] or (targets[t], ids[t + 1]) == (1, 0)
        assert tokens[0] == "<S>" and "</S>" not in tokens

    every_sentence = sorted(tuple(train.tokens(i)) for i in range(len(train)))
    first, second = (_epoch_sentences(batches, len(train), 3, 0, epoch) for epoch in (0, 1))
    assert sorted(first) == sorted(second) == every_sentence  # each epoch reads each once
    assert first != second  # in a new order


def test_every_batch_mixes_the_shards(tmp_path: Path, encoder: SentenceEncoder) -> None:
    # The prepare stage writes a shard per source: streams that read shard after shard would
    # train on one source at a time. The first batch's 16 rows start in all three shards.
    _write_corpus(tmp_path, {"train": [300, 300, 300]})
    corpus = ShardedCorpus.from_dir(tmp_path / "train")
    iterator = LMBatchIterator(corpus, encoder, batch_size=16, unroll_steps=2, seed=1)
    firsts = [tokens[1] for tokens, _, _ in _streams([next(iterator)], "forward")]
    shards = {int(first.removeprefix("s")) // 300 for first in firsts}  # sentence s<k>
    assert shards == {0, 1, 2}


def test_backward_stream_reads_each_sentence_reversed(
    train: ShardedCorpus, encoder: SentenceEncoder
) -> None:
    iterator = LMBatchIterator(train, encoder, batch_size=2, unroll_steps=6, seed=3)
    batches = [next(iterator) for _ in range(30)]
    forward, backward = _streams(batches, "forward"), _streams(batches, "backward")
    for (tokens, _, _), (reversed_tokens, ids, targets) in zip(forward, backward, strict=True):
        assert ids == encoder.vocab.ids(reversed_tokens)
        for t in range(len(ids) - 1):  # </S> wn .. w1 <S>: a target <S> is followed by </S>
            assert targets[t] == ids[t + 1] or (targets[t], ids[t + 1]) == (0, 1)
        reversed_sentences = _complete_sentences(reversed_tokens, "</S>")
        sentences = _complete_sentences(tokens, "<S>")
        assert len(sentences) > 5
        assert [s[::-1] for s in reversed_sentences] == sentences[: len(reversed_sentences)]


def test_ranks_read_disjoint_streams_of_the_same_global_split(
    train: ShardedCorpus, encoder: SentenceEncoder
) -> None:
    def batches(batch_size: int, rank: int, world_size: int) -> list[dict]:
        iterator = LMBatchIterator(
            train, encoder, batch_size, 5, seed=1, rank=rank, world_size=world_size
        )
        return [next(iterator) for _ in range(30)]

    single = batches(4, 0, 1)
    ranks = [batches(2, 0, 2), batches(2, 1, 2)]
    for rank, rank_batches in enumerate(ranks):
        rows = slice(2 * rank, 2 * rank + 2)  # rank r's row i is global stream 2 r + i
        for mine, whole in zip(rank_batches, single, strict=True):
            for key in ("forward_char_ids", "forward_targets", "backward_targets"):
                assert torch.equal(mine[key], whole[key][rows])

    read = [
        set(_epoch_sentences(rank_batches, len(train), 4, 2 * rank, 0))
        for rank, rank_batches in enumerate(ranks)
    ]
    assert not read[0] & read[1]
    assert read[0] | read[1] == {tuple(train.tokens(i)) for i in range(len(train))}


def test_resuming_from_a_state_continues_with_the_next_batch(
    train: ShardedCorpus, encoder: SentenceEncoder
) -> None:
    def iterator() -> LMBatchIterator:
        return LMBatchIterator(train, encoder, batch_size=3, unroll_steps=4, seed=5)

    uninterrupted = iterator()
    reference = [next(uninterrupted) for _ in range(60)]  # the streams cross data epochs
    for stop in (0, 1, 7, 23, 41, 55):
        interrupted = iterator()
        for _ in range(stop):
            next(interrupted)
        state = interrupted.state_dict()
        assert state == {"next_batch": stop, "seed": 5, "global_streams": 3, "unroll_steps": 4}
        resumed = iterator()
        resumed.load_state_dict(state)
        _assert_same_batches([next(resumed) for _ in range(60 - stop)], reference[stop:])


def test_a_state_from_other_data_settings_is_refused(
    train: ShardedCorpus, encoder: SentenceEncoder
) -> None:
    state = LMBatchIterator(train, encoder, 3, 4, seed=5).state_dict()
    for other in (
        LMBatchIterator(train, encoder, 3, 4, seed=6),
        LMBatchIterator(train, encoder, 2, 4, seed=5),
        LMBatchIterator(train, encoder, 3, 5, seed=5),
    ):
        with pytest.raises(ElmolabError, match="saved data position"):
            other.load_state_dict(state)


def test_the_seed_decides_the_order(train: ShardedCorpus, encoder: SentenceEncoder) -> None:
    def batches(seed: int) -> list[dict]:
        iterator = LMBatchIterator(train, encoder, batch_size=2, unroll_steps=5, seed=seed)
        return [next(iterator) for _ in range(5)]

    _assert_same_batches(batches(11), batches(11))
    assert not torch.equal(batches(11)[0]["forward_targets"], batches(12)[0]["forward_targets"])


def test_too_few_sentences_for_the_streams_is_an_error(
    train: ShardedCorpus, encoder: SentenceEncoder
) -> None:
    with pytest.raises(ElmolabError, match="cannot feed 120 streams"):
        LMBatchIterator(train, encoder, batch_size=60, unroll_steps=5, seed=0, world_size=2)


def test_an_evaluation_pass_reads_every_sentence_once_on_any_number_of_ranks(
    corpus_dir: Path, encoder: SentenceEncoder
) -> None:
    valid = ShardedCorpus.from_dir(corpus_dir / "valid")
    every_sentence = sorted(tuple(valid.tokens(i)) for i in range(len(valid)))
    for world_size in (1, 2):
        read, n_batches, n_targets = [], set(), 0
        for rank in range(world_size):
            iterator = LMBatchIterator(
                valid, encoder, 3, 4, seed=None, rank=rank, world_size=world_size
            )
            batches = list(iterator)
            n_batches.add(len(batches))
            assert len(batches) == iterator.n_batches
            assert sum(int(b["mask"].sum()) for b in batches) == iterator.n_targets
            n_targets += iterator.n_targets
            for tokens, ids, _ in _streams(batches, "forward"):
                real = tokens.index("") if "" in tokens else len(tokens)
                assert set(tokens[real:]) <= {""} and not any(ids[real:])  # padding at the end
                read += _complete_sentences([*tokens[:real], "<S>"], "<S>")
        assert len(n_batches) == 1  # every rank runs the same number of batches
        assert sorted(read) == every_sentence
        assert n_targets == valid.n_tokens + len(valid)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"", "empty line"),
        (b"the\tcat", "whitespace U+0009"),
        (b"the  cat", "two spaces in a row"),
        (b"the cat ", "two spaces in a row"),
        (b"the cat\r", "whitespace U+000D"),
        (b"the\xc2\xa0cat", "whitespace U+00A0"),
        (b"the \xff", "not valid UTF-8"),
        (b"the <S> cat", "cannot appear in the text"),
    ],
)
def test_bad_shard_lines_name_the_file_and_line(tmp_path: Path, line: bytes, problem: str) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "shard-00000.txt").write_bytes(b"fine line\n")
    shard = tmp_path / "train" / "shard-00001.txt"
    shard.write_bytes(b"a good one\nanother\n" + line + b"\nlast\n")
    with pytest.raises(ElmolabError, match=re.escape(problem)) as error:
        ShardedCorpus.from_dir(tmp_path / "train")
    assert (error.value.path, error.value.line) == (str(shard), 3)


def test_a_split_without_shards_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ElmolabError, match="no shard"):
        ShardedCorpus.from_dir(tmp_path)


class _BatchRecorder(L.LightningModule):
    """Records the training batches it is given; one parameter so the optimizer has work."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.seen: list[dict] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self.seen.append({key: value for key, value in batch.items()})
        return self.scale * batch["mask"].float().mean()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        assert batch["mask"].shape == (2, 5)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(corpus_dir: Path, root: Path, max_steps: int, ckpt_path: Path | None) -> list[dict]:
    # 230 tokens per epoch: 23 batches of 2 x 5, so the run crosses a Lightning epoch.
    data = LMDataModule(corpus_dir, batch_size=2, unroll_steps=5, seed=4, n_train_tokens=230)
    model = _BatchRecorder()
    checkpoints = ModelCheckpoint(
        dirpath=root, filename="{step}", every_n_train_steps=10, save_top_k=-1
    )
    trainer = L.Trainer(
        max_steps=max_steps,
        limit_val_batches=2,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    assert len(trainer.train_dataloader) == data.batches_per_epoch == 23
    return model.seen


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning: loader length, mid-epoch resume
def test_a_lightning_run_resumed_from_a_checkpoint_gets_the_same_batches(
    corpus_dir: Path, tmp_path: Path
) -> None:
    uninterrupted = _fit(corpus_dir, tmp_path, 40, None)
    assert [b["batch_index"] for b in uninterrupted] == list(range(40))
    for step in (10, 30):  # within the first Lightning epoch, and in the second
        resumed = _fit(corpus_dir, tmp_path / "resumed", 40, tmp_path / f"step={step}.ckpt")
        _assert_same_batches(resumed, uninterrupted[step:])
    state = torch.load(tmp_path / "step=30.ckpt")["LMDataModule"]
    assert state == {"next_batch": 30, "seed": 4, "global_streams": 2, "unroll_steps": 5}


def test_the_data_module_refuses_a_position_from_other_settings(corpus_dir: Path) -> None:
    data = LMDataModule(corpus_dir, batch_size=2, unroll_steps=5, seed=4)
    data.load_state_dict(data.state_dict())
    with pytest.raises(ElmolabError, match="global_streams = 4"):
        data.load_state_dict({**data.state_dict(), "global_streams": 4})


def test_a_worker_process_builds_the_same_batches(corpus_dir: Path) -> None:
    def first_batches(num_workers: int) -> list[dict]:
        data = LMDataModule(corpus_dir, 2, 5, seed=4, n_train_tokens=60, num_workers=num_workers)
        data.setup("fit")
        return list(data.train_dataloader())

    in_process = first_batches(0)
    assert len(in_process) == 6
    _assert_same_batches(first_batches(1), in_process)
