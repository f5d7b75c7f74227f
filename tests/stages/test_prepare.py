"""The prepare stage: readers of every corpus source, splits, vocabulary, statistics, bad input."""

import json
import zipfile
from pathlib import Path

import pytest

from elmolab.core.errors import ElmolabError
from elmolab.core.schema import CorpusConfig, SourceConfig
from elmolab.text.corpus import open_source
from elmolab.text.prepare import assign_splits, prepare_corpus


def _masc_zip(path: Path, docs: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("masc_tagged/categories.txt", "written/x.txt blog\n")
        for name, text in docs.items():
            zf.writestr(f"masc_tagged/written/{name}.txt", text)
    return path


def _config(sources: dict[str, SourceConfig | None], **overrides) -> CorpusConfig:
    values = dict(
        sources=sources,
        valid_fraction=0.2,
        test_fraction=0.2,
        max_sentence_tokens=50,
        min_sentence_tokens=1,
        vocab_max_size=None,
        vocab_min_count=1,
        shard_sentences=3,
    )
    values.update(overrides)
    return CorpusConfig(**values)


def _tiny_masc(tmp_path: Path, n_docs: int = 10) -> Path:
    docs = {
        f"doc{i:02d}": f"The_DT cat_NN sat_VBD ._.\nA_DT dog_NN number_NN {i}_CD ran_VBD ._.\n"
        for i in range(n_docs)
    }
    return _masc_zip(tmp_path / "masc.zip", docs)


def test_prepare_writes_shards_vocab_and_stats(tmp_path):
    cfg = _config({"masc": SourceConfig("masc", str(_tiny_masc(tmp_path)))})
    out = tmp_path / "corpus"
    stats = prepare_corpus(cfg, out, seed=1)
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert vocab[:3] == ["<S>", "</S>", "<UNK>"]
    assert vocab[3:6] == [".", "A", "The"]  # count 2 per training doc each; ties by string
    train_lines = [line for shard in sorted((out / "train").glob("*.txt")) for line in shard.open()]
    assert all(line.endswith("\n") and "  " not in line for line in train_lines)
    assert "The cat sat .\n" in train_lines
    assert sorted(p.name for p in (out / "train").glob("*.txt"))[0] == "shard-masc-00000.txt"
    assert stats["splits"]["train"]["documents"] == 6
    assert stats["splits"]["valid"]["documents"] == 2
    assert stats["splits"]["test"]["documents"] == 2
    assert stats["splits"]["train"]["sentences"] == len(train_lines) == 12
    assert stats["splits"]["train"]["tokens"] == 6 * 10
    # numbers seen only in held-out documents are OOV there
    assert stats["splits"]["valid"]["oov_rate"] == pytest.approx(2 / 20)
    assert stats["splits"]["valid"]["unigram_perplexity"] > 1
    assert json.loads((out / "stats.json").read_text()) == stats


def test_a_rerun_writes_the_same_bytes(tmp_path):
    """The corpus holds no timing, so a re-run keeps its DVC hash and later stages stay cached."""
    cfg = _config({"masc": SourceConfig("masc", str(_tiny_masc(tmp_path)))})
    first, second = tmp_path / "first", tmp_path / "second"
    prepare_corpus(cfg, first, seed=1)
    prepare_corpus(cfg, second, seed=1)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)


def test_splits_are_deterministic_per_seed_and_cover_every_document():
    docs = [f"d{i}" for i in range(100)]
    a = assign_splits(docs, 0.1, 0.05, seed=1, source="x")
    assert a == assign_splits(docs, 0.1, 0.05, seed=1, source="x")
    assert a != assign_splits(docs, 0.1, 0.05, seed=2, source="x")
    assert sorted(a) == sorted(docs)
    assert list(a.values()).count("valid") == 10 and list(a.values()).count("test") == 5
    # tiny sources keep at least one training document
    assert list(assign_splits(["only"], 0.1, 0.1, seed=1, source="x").values()) == ["train"]


def test_filters_and_max_documents(tmp_path):
    cfg = _config(
        {"masc": SourceConfig("masc", str(_tiny_masc(tmp_path)))},
        max_sentence_tokens=4,
        max_documents=5,
    )
    stats = prepare_corpus(cfg, tmp_path / "out", seed=1)
    assert stats["vocabulary"]["dropped_sentences"] == {"masc": 5}  # the 6-token sentences
    assert sum(s["documents"] for s in stats["splits"].values()) == 5


def test_undecodable_bytes_are_replaced_counted_and_reported(tmp_path):
    bad = _masc_zip(
        tmp_path / "bad.zip",
        {f"d{i}": "caf\xe9_NN ok_JJ\n" for i in range(5)},  # latin-1 é below
    )
    with zipfile.ZipFile(bad, "w") as zf:
        for i in range(5):
            zf.writestr(f"masc_tagged/written/d{i}.txt", b"caf\xe9_NN ok_JJ\n")
    stats = prepare_corpus(
        _config({"masc": SourceConfig("masc", str(bad))}), tmp_path / "out", seed=1
    )
    replaced = stats["undecodable_bytes_replaced"]
    assert len(replaced) == 5 and all(n == 1 for n in replaced.values())
    assert f"{bad}/masc_tagged/written/d0.txt" in replaced


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: p / "missing.zip", "no such file or folder"),
        (
            lambda p: (p / "corrupt.zip").write_bytes(b"PK\x03\x04garbage") and p / "corrupt.zip",
            "not a readable zip archive",
        ),
        (lambda p: _masc_zip(p / "empty.zip", {}), "the archive holds no document"),
        (lambda p: _masc_zip(p / "blank.zip", {"a": "\n\n", "b": ""}), "has no sentence"),
    ],
)
def test_bad_sources_fail_clearly_and_leave_no_output(tmp_path, make, problem):
    path = make(tmp_path)
    out = tmp_path / "corpus"
    with pytest.raises(ElmolabError, match=problem) as err:
        prepare_corpus(_config({"masc": SourceConfig("masc", str(path))}), out, seed=1)
    assert str(path) in str(err.value)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_corrupt_member_names_the_member(tmp_path):
    path = _tiny_masc(tmp_path)
    data = bytearray(path.read_bytes())
    offset = data.index(b"The_DT") if b"The_DT" in data else 60
    data[offset : offset + 4] = b"XXXX"  # stored uncompressed by writestr: CRC now fails
    path.write_bytes(bytes(data))
    with pytest.raises(ElmolabError, match=r"masc_tagged/written/doc00\.txt: corrupt zip member"):
        prepare_corpus(_config({"masc": SourceConfig("masc", str(path))}), tmp_path / "o", seed=1)


def test_empty_after_filtering_and_all_sources_disabled(tmp_path):
    src = SourceConfig("masc", str(_tiny_masc(tmp_path)))
    with pytest.raises(ElmolabError, match="training split is empty after filtering"):
        prepare_corpus(
            _config({"masc": src}, min_sentence_tokens=100, max_sentence_tokens=200),
            tmp_path / "o",
            seed=1,
        )
    with pytest.raises(ElmolabError, match="every source is disabled"):
        prepare_corpus(_config({"masc": None}), tmp_path / "o", seed=1)
    with pytest.raises(ElmolabError, match="unknown reader 'nope'"):
        prepare_corpus(_config({"x": SourceConfig("nope", str(src.path))}), tmp_path / "o", seed=1)


def test_a_failed_run_keeps_the_previous_output(tmp_path):
    src = SourceConfig("masc", str(_tiny_masc(tmp_path)))
    out = tmp_path / "corpus"
    prepare_corpus(_config({"masc": src}), out, seed=1)
    before = (out / "vocab.txt").read_text()
    with pytest.raises(ElmolabError):
        prepare_corpus(
            _config({"masc": src}, min_sentence_tokens=100, max_sentence_tokens=200), out, seed=1
        )
    assert (out / "vocab.txt").read_text() == before


@pytest.mark.parametrize(
    ("name", "reader", "path", "documents", "sentences", "tokens"),
    [
        # The data card (data/README.md): MASC 592,536 and Brown 1,161,192 tokens (whitespace
        # tokens of the source)
        ("masc", "masc", "corpus/masc_tagged.zip", 392, 34533, 592536),
        ("brown", "brown", "corpus/brown.zip", 500, 57340, 1161192),
    ],
)
def test_pretokenized_sources_match_the_published_counts(
    data_dir, name, reader, path, documents, sentences, tokens
):
    source = open_source(name, reader, data_dir / path)
    assert len(source.documents()) == documents
    n_sentences = n_tokens = 0
    for _, doc in source.iter_documents():
        for sentence in doc:
            n_sentences += 1
            n_tokens += len(sentence)
            assert all(t and not any(c.isspace() for c in t) for t in sentence)
    assert (n_sentences, n_tokens) == (sentences, tokens)


def test_wikitext_documents_are_articles_without_headings(data_dir):
    source = open_source("w", "wikitext", data_dir / "corpus/wikitext-2/valid.txt")
    docs = source.documents()
    assert len(docs) == 60 and docs[0] == "0000-Homarus gammarus"
    _, sentences = next(source.iter_documents())
    first = next(sentences)
    assert first[:4] == ["Homarus", "gammarus", ",", "known"] and first[-1] == "."
    assert all("=" not in s[0] for s in sentences)


def test_raw_text_is_split_into_sentences_and_tokens(tmp_path):
    path = tmp_path / "raw.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("state_union/1945-X.txt", "Mr. Speaker, we can't stop.  It is 1945!\n \n")
    source = open_source("su", "raw_text_zip", path)
    documents = [(doc_id, list(sentences)) for doc_id, sentences in source.iter_documents()]
    assert documents[0][1] == [
        ["Mr.", "Speaker", ",", "we", "ca", "n't", "stop", "."],
        ["It", "is", "1945", "!"],
    ]
