"""Extract stage: slices of the real probing data through a tiny biLM -> feature files.

Runs on the mini workspace of ``tests/fixtures/workspace.py`` (slices of ``data/probing``, two
tiny encoders, a composed config pointing at them).
"""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from fixtures.workspace import DIM, SENTENCES, make_workspace
from omegaconf import DictConfig

from elmolab.core.config import section
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import ExtractConfig
from elmolab.data.catalogue import (
    data_catalog,
    dataset_digest,
    multiword_parts,
    read_split_features,
)
from elmolab.data.conll import LOOSE_BEGINS
from elmolab.embed import embed_sentences
from elmolab.extraction.features import extract, extract_split
from elmolab.io.features import DATASET_DIGEST, feature_path, read_features, units_path
from elmolab.models.encoder_files import load_encoder


@pytest.fixture(scope="module")
def workspace(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> DictConfig:
    return make_workspace(data_dir, tmp_path_factory.mktemp("extract"))


def _config(cfg: DictConfig) -> ExtractConfig:
    """A fresh copy of the ``extract`` section (tests may change it)."""
    return section(cfg, "extract", ExtractConfig)


def _artifacts(cfg: DictConfig) -> Path:
    return Path(cfg.paths.artifacts)


def test_every_split_of_every_encoder_is_written_in_the_elmo_format(workspace: DictConfig) -> None:
    config = _config(workspace)
    features = _artifacts(workspace) / "features"
    # no temporary folders
    assert sorted(p.name for p in features.iterdir()) == ["random", "token_only", "trained"]
    for encoder in ("trained", "random", "token_only"):
        for source in data_catalog(config).sources():
            path = feature_path(features / encoder, source.dataset, source.split)
            units = source.units()
            with h5py.File(path) as f:
                assert "sentence_to_index" in f
                assert {f[str(i)].dtype for i in range(len(units))} == {np.dtype("float16")}
            lines = read_features(path, [len(u) for u in units])
            assert len(lines) == len(units)
            assert {line.shape[::2] for line in lines} == {(3, DIM)}
            sidecar = units_path(path, source.format.is_wsd)
            assert sidecar.read_text(encoding="utf-8") == "".join(" ".join(u) + "\n" for u in units)
        for dataset in config.datasets:
            summary = json.loads((features / encoder / dataset / "extract.json").read_text())
            assert summary["dataset_sha256"] == dataset_digest(dataset, config.datasets[dataset])
            for split in summary["splits"]:
                with h5py.File(feature_path(features / encoder, dataset, split)) as f:
                    assert f.attrs[DATASET_DIGEST] == summary["dataset_sha256"]
    # the columns reader's counts: CoNLL-2003 (IOB1) records its B- tags after O, none in the
    # first sentences; the other formats record nothing
    conll2003 = json.loads((features / "trained" / "conll2003" / "extract.json").read_text())
    assert conll2003["splits"]["train"]["reader"] == {LOOSE_BEGINS: 0}
    conll2000 = json.loads((features / "trained" / "conll2000" / "extract.json").read_text())
    assert "reader" not in conll2000["splits"]["train"]
    conll_dev = features / "trained" / "conll2000" / "dev.tokens.txt"
    assert 0 < len(conll_dev.read_text().splitlines()) < SENTENCES  # carved from train


def test_the_token_layer_control_shares_layer_0_and_nothing_else(workspace: DictConfig) -> None:
    features = _artifacts(workspace) / "features"
    source = data_catalog(_config(workspace)).read("ud_english_ewt", "dev")
    layers = {
        encoder: read_split_features(features / encoder, source)
        for encoder in ("trained", "token_only")
    }
    for trained, control in zip(layers["trained"], layers["token_only"], strict=True):
        np.testing.assert_array_equal(trained[0], control[0])
        assert not np.allclose(trained[1:], control[1:])
    digests = {
        encoder: {
            json.loads((features / encoder / dataset / "extract.json").read_text())[
                "token_layer_sha256"
            ]
            for dataset in _config(workspace).datasets
        }
        for encoder in ("trained", "token_only", "random")
    }
    assert len(digests["trained"]) == 1  # the same on every dataset
    assert digests["trained"] == digests["token_only"] != digests["random"]
    control = load_encoder(_artifacts(workspace) / "bilm_token_only")
    for stack in (control.forward_lstm, control.backward_lstm):
        for layer in stack.layers:
            w = layer.W_0.detach()  # (input + proj, 4 * cell): orthonormal rows
            torch.testing.assert_close(w @ w.T, torch.eye(w.shape[0]), atol=1e-5, rtol=0)
            assert layer.B.abs().max() <= 1 / layer.cell_size**0.5 and layer.B.std() > 0


def test_a_wsd_instance_is_the_mean_of_its_words_in_the_sentence(workspace: DictConfig) -> None:
    config = _config(workspace)
    source = data_catalog(config).read("raganato_eval", "ALL")
    sentences = source.wsd_sentences()
    index, instance = next(
        (i, inst)
        for i, s in enumerate(sentences)
        for inst in s.instances
        if len(multiword_parts(s.tokens[inst.position])) > 1
    )  # a multiword instance ("United States")
    sentence = sentences[index]
    words = [w for token in sentence.tokens for w in multiword_parts(token)]
    start = sum(len(multiword_parts(t)) for t in sentence.tokens[: instance.position])
    width = len(multiword_parts(sentence.tokens[instance.position]))
    model = load_encoder(_artifacts(workspace) / "bilm")
    ((_, layers),) = list(embed_sentences(model, [words]))  # (3, n_words, dim)
    expected = layers[:, start : start + width].mean(dim=1)  # (3, dim)
    stored = read_split_features(_artifacts(workspace) / "features" / "trained", source)[index]
    column = list(sentence.instances).index(instance)
    np.testing.assert_allclose(stored[:, column], expected.numpy(), atol=2e-3, rtol=2e-3)


def test_a_sidecar_that_disagrees_with_the_data_names_its_file_and_line(
    workspace: DictConfig, tmp_path: Path
) -> None:
    source = data_catalog(_config(workspace)).read("ud_english_ewt", "dev")
    encoder = tmp_path / "trained"
    (encoder / "ud_english_ewt").mkdir(parents=True)
    original = _artifacts(workspace) / "features" / "trained" / "ud_english_ewt"
    for name in ("dev.hdf5", "dev.tokens.txt"):
        (encoder / "ud_english_ewt" / name).write_bytes((original / name).read_bytes())
    sidecar = encoder / "ud_english_ewt" / "dev.tokens.txt"
    lines = sidecar.read_text().splitlines()
    lines[2] = lines[2].rpartition(" ")[0]  # the third sentence loses its last token
    sidecar.write_text("\n".join(lines) + "\n")
    with pytest.raises(ElmolabError, match=rf"{sidecar}:3: \d+ tokens, but sentence 3 of"):
        read_split_features(encoder, source)


def test_a_feature_line_with_the_wrong_token_count_names_the_file_and_line(
    workspace: DictConfig, tmp_path: Path
) -> None:
    source = data_catalog(_config(workspace)).read("wnut17", "test")
    encoder = tmp_path / "trained"
    (encoder / "wnut17").mkdir(parents=True)
    original = _artifacts(workspace) / "features" / "trained" / "wnut17"
    (encoder / "wnut17" / "test.tokens.txt").write_bytes(
        (original / "test.tokens.txt").read_bytes()
    )
    path = encoder / "wnut17" / "test.hdf5"
    path.write_bytes((original / "test.hdf5").read_bytes())
    with h5py.File(path, "r+") as f:
        short = f["4"][:, :-1]
        del f["4"]
        f["4"] = short
    expected = rf"{path}: line index 4: (\d+) token vectors, expected (?!\1)\d+"
    with pytest.raises(ElmolabError, match=expected):
        read_split_features(encoder, source)


def test_a_failure_leaves_no_partial_output(
    workspace: DictConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(workspace)
    bad = tmp_path / "bad.conllu"
    good = Path(config.datasets["ud_english_ewt"].splits["test"])
    lines = good.read_text(encoding="utf-8").splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines, 1) if line[:1].isdigit())
    lines[number - 1] = lines[number - 1].replace("\t", " ", 1)
    bad.write_text("".join(lines), encoding="utf-8")
    config.datasets["ud_english_ewt"].splits["test"] = str(bad)
    out = tmp_path / "features"
    with pytest.raises(ElmolabError, match=rf"{bad}:{number}: expected 10 tab-separated"):
        extract(config, out)
    assert not out.exists() or not any(out.iterdir())

    calls = []

    def fail_on_third_split(*args: object) -> dict:
        calls.append(args)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return extract_split(*args)

    monkeypatch.setattr("elmolab.extraction.features.extract_split", fail_on_third_split)
    with pytest.raises(RuntimeError, match="killed"):
        extract(_config(workspace), out)
    # neither the two finished splits nor their dataset's folder: a dataset appears complete
    assert not [path for path in out.rglob("*") if path.is_file() or path.parent != out]
