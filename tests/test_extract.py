"""Extract stage: slices of the real probing data through a tiny biLM -> feature files.

The fixtures here (slices of ``data/probing`` in the same layout, two tiny encoders, a composed
config pointing at them) are shared with ``test_probe_stage.py``.
"""

import gzip
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from elmolab.config import section
from elmolab.controls import token_layer_control
from elmolab.embed import embed_sentences
from elmolab.errors import ElmolabError
from elmolab.extract import ExtractConfig, extract, extract_split, load_encoder
from elmolab.io.features import feature_path, read_features, units_path
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import export_bilm, save_bilm_checkpoint
from elmolab.params import compose_params
from elmolab.probing.tasks import multiword_parts, read_split_features

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
FIXTURE_OPTIONS = ROOT / "data" / "reference" / "elmo_fixture" / "options.json"
SENTENCES = 150  # per column-format split: enough that dev and test labels occur in train
WSD_SENTENCES = 40  # per WSD split
DIM = 32  # 2 * the fixture's projection (16)
COLUMN_FILES = [
    "ud_english_ewt/en_ewt-ud-train.conllu",
    "ud_english_ewt/en_ewt-ud-dev.conllu",
    "ud_english_ewt/en_ewt-ud-test.conllu",
    "conll2000/train.txt",
    "conll2000/test.txt",
    "wnut17/wnut17train.conll",
    "wnut17/emerging.dev.conll",
    "wnut17/emerging.test.annotated",
]
RAGANATO_SETS = ["ALL", "semeval2007"]


def _first_blocks(text: str, n: int) -> str:
    """The first ``n`` blank-line-separated blocks (a whitespace-only line is blank)."""
    kept, blocks, in_block = [], 0, False
    for line in text.splitlines():
        blank = not line.strip()
        if blank and in_block:
            blocks += 1
            if blocks == n:
                break
        in_block = not blank
        kept.append(line)
    return "\n".join(kept) + "\n"


def write_mini_data(data: Path, dest: Path) -> None:
    """Slices of ``data/probing`` under ``dest/probing`` (same layout, so ``paths.data=dest``
    points every config path at them), with WordNet cut to the lemmas the slices use."""
    source, target = data / "probing", dest / "probing"
    for name in COLUMN_FILES:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        text = (source / name).read_text(encoding="utf-8")
        (target / name).write_text(_first_blocks(text, SENTENCES), encoding="utf-8")

    lemmas: set[str] = set()
    semcor = "wsd/semcor30/semcor30.tsv.gz"
    lines, sentences = [], []
    with gzip.open(source / semcor, "rt", encoding="utf-8") as fin:
        for line in fin:
            sentence = line.split("\t")[0].rpartition(".")[0]
            if not line.startswith("#") and sentence not in sentences:
                if len(sentences) == WSD_SENTENCES:
                    break
                sentences.append(sentence)
            lines.append(line)
            keys = line.split("\t")[4]
            lemmas.update(key.partition("%")[0] for key in keys.split(";") if "%" in key)
    (target / semcor).parent.mkdir(parents=True)
    with gzip.open(target / semcor, "wt", encoding="utf-8") as fout:
        fout.writelines(lines)

    for name in RAGANATO_SETS:
        folder = Path("wsd/raganato_eval") / name
        (target / folder).mkdir(parents=True)
        xml = (source / folder / f"{name}.data.xml").read_text(encoding="utf-8")
        end = [m.end() for m in re.finditer("</sentence>", xml)][WSD_SENTENCES - 1]
        kept = xml[:end] + "\n</text>\n</corpus>\n"
        (target / folder / f"{name}.data.xml").write_text(kept, encoding="utf-8")
        ids = set(re.findall(r'<instance id="([^"]+)"', kept))
        lemmas.update(
            lemma.lower() for lemma in re.findall(r'<instance [^>]*lemma="([^"]+)"', kept)
        )
        gold = (source / folder / f"{name}.gold.key.txt").read_text(encoding="utf-8")
        gold_lines = [line for line in gold.splitlines(keepends=True) if line.split()[0] in ids]
        for line in gold_lines:
            lemmas.update(key.partition("%")[0] for key in line.split()[1:])
        (target / folder / f"{name}.gold.key.txt").write_text("".join(gold_lines), "utf-8")

    wordnet = "wsd/wordnet30/index.sense"
    (target / wordnet).parent.mkdir(parents=True)
    index = (source / wordnet).read_text(encoding="utf-8").splitlines(keepends=True)
    kept_index = [line for line in index if line.partition("%")[0] in lemmas]
    (target / wordnet).write_text("".join(kept_index), encoding="utf-8")


def write_tiny_encoders(artifacts: Path) -> None:
    """Two random biLMs of the fixture's shape: ``bilm`` as a checkpoint, ``bilm_random`` as
    bilm-tf files only (both ways of loading an encoder), and ``bilm_token``, the token-layer
    control of ``bilm``."""
    options = BiLMOptions.from_json(FIXTURE_OPTIONS)
    torch.manual_seed(1)
    (artifacts / "bilm").mkdir(parents=True)
    save_bilm_checkpoint(BiLM(options), artifacts / "bilm" / "model.pt")
    torch.manual_seed(2)
    (artifacts / "bilm_random").mkdir(parents=True)
    random = BiLM(options)
    export_bilm(
        random, artifacts / "bilm_random/options.json", artifacts / "bilm_random/weights.hdf5"
    )
    (artifacts / "bilm" / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n", encoding="utf-8")
    token_layer_control(artifacts / "bilm", artifacts / "bilm_token", seed=1)


def compose(root: Path, *overrides: str) -> DictConfig:
    """The real config, pointed at ``root/data`` and ``root/artifacts``."""
    text = compose_params(
        CONF,
        [f"paths.data={root / 'data'}", f"paths.artifacts={root / 'artifacts'}", *overrides],
    )
    return OmegaConf.create(yaml.safe_load(text))


def make_workspace(data_dir: Path, root: Path, *overrides: str) -> DictConfig:
    """Mini data and tiny encoders under ``root``, extracted into ``root/artifacts/features``;
    returns the config (with ``overrides``) pointing at them."""
    torch.set_num_threads(1)
    write_mini_data(data_dir, root / "data")
    write_tiny_encoders(root / "artifacts")
    cfg = compose(root, "extract.num_threads=1", *overrides)
    extract(section(cfg, "extract", ExtractConfig), root / "artifacts" / "features")
    return cfg


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
        for source in config.catalog().sources():
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
        assert (features / encoder / "extract.json").is_file()
    conll_dev = features / "trained" / "conll2000" / "dev.tokens.txt"
    assert 0 < len(conll_dev.read_text().splitlines()) < SENTENCES  # carved from train


def test_the_token_layer_control_shares_layer_0_and_nothing_else(workspace: DictConfig) -> None:
    features = _artifacts(workspace) / "features"
    source = _config(workspace).catalog().read("ud_english_ewt", "dev")
    layers = {
        encoder: read_split_features(features / encoder, source)
        for encoder in ("trained", "token_only")
    }
    for trained, control in zip(layers["trained"], layers["token_only"], strict=True):
        np.testing.assert_array_equal(trained[0], control[0])
        assert not np.allclose(trained[1:], control[1:])
    digests = {
        encoder: json.loads((features / encoder / "extract.json").read_text())["token_layer_sha256"]
        for encoder in ("trained", "token_only", "random")
    }
    assert digests["trained"] == digests["token_only"] != digests["random"]
    control = load_encoder(_artifacts(workspace) / "bilm_token")
    for stack in (control.forward_lstm, control.backward_lstm):
        for layer in stack.layers:
            w = layer.W_0.detach()  # (input + proj, 4 * cell): orthonormal rows
            torch.testing.assert_close(w @ w.T, torch.eye(w.shape[0]), atol=1e-5, rtol=0)
            assert layer.B.abs().max() <= 1 / layer.cell_size**0.5 and layer.B.std() > 0


def test_a_wsd_instance_is_the_mean_of_its_words_in_the_sentence(workspace: DictConfig) -> None:
    config = _config(workspace)
    source = config.catalog().read("raganato_eval", "ALL")
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
    source = _config(workspace).catalog().read("ud_english_ewt", "dev")
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
    source = _config(workspace).catalog().read("wnut17", "test")
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

    monkeypatch.setattr("elmolab.extract.extract_split", fail_on_third_split)
    with pytest.raises(RuntimeError, match="killed"):
        extract(_config(workspace), out)
    assert not out.exists() or not any(out.iterdir())  # neither the two finished splits
