"""bilm-tf files, the biLM checkpoint and feature files: round trips are exact, bad inputs fail
with one ElmolabError that names the file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmolab.core.errors import ElmolabError
from elmolab.io.features import open_feature_writer, read_features
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import (
    MAX_PARAMETERS,
    export_bilm,
    load_bilm,
    load_bilm_from_checkpoint,
    save_bilm_checkpoint,
)
from elmolab.models.char_cnn import CharCNN, Highway
from elmolab.models.lstm import LstmWithProjection

FIXTURES = ["elmo_fixture", "elmo_fixture_noskip"]


def datasets(path: Path) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                arrays.update({name: obj[...]}) if isinstance(obj, h5py.Dataset) else None
            )
        )
    return arrays


def assert_same_parameters(a: BiLM, b: BiLM) -> None:
    a_params, b_params = dict(a.named_parameters()), dict(b.named_parameters())
    assert a_params.keys() == b_params.keys()
    for name, tensor in a_params.items():
        assert torch.equal(tensor, b_params[name]), name


# -- bilm-tf files ---------------------------------------------------------------------------


@pytest.mark.parametrize("fixture_name", FIXTURES)
def test_export_then_load_is_bit_identical(
    data_dir: Path, tmp_path: Path, fixture_name: str
) -> None:
    fixture = data_dir / "reference" / fixture_name
    model = load_bilm(fixture / "options.json", fixture / "lm_weights.hdf5")
    export_bilm(model, tmp_path / "options.json", tmp_path / "lm_weights.hdf5")

    original, exported = (
        datasets(fixture / "lm_weights.hdf5"),
        datasets(tmp_path / "lm_weights.hdf5"),
    )
    assert original.keys() == exported.keys()
    for name, array in original.items():
        assert exported[name].dtype == np.float32
        np.testing.assert_array_equal(exported[name], array, err_msg=name)
    assert_same_parameters(
        model, load_bilm(tmp_path / "options.json", tmp_path / "lm_weights.hdf5")
    )
    options = json.loads((fixture / "options.json").read_text(encoding="utf-8"))
    again = json.loads((tmp_path / "options.json").read_text(encoding="utf-8"))
    assert {k: again[k] for k in options} == options
    assert list(tmp_path.iterdir()) == [
        tmp_path / "lm_weights.hdf5",
        tmp_path / "options.json",
    ] or sorted(tmp_path.iterdir()) == [tmp_path / "lm_weights.hdf5", tmp_path / "options.json"]


def test_published_small_shape_round_trips_random_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = BiLM(BiLMOptions.published("small"))
    export_bilm(model, tmp_path / "options.json", tmp_path / "lm_weights.hdf5")
    shapes = {name: a.shape for name, a in datasets(tmp_path / "lm_weights.hdf5").items()}
    assert shapes["char_embed"] == (261, 16)
    assert shapes["CNN/W_cnn_6"] == (1, 7, 16, 1024)
    assert shapes["CNN_high_0/W_carry"] == (2048, 2048)
    assert shapes["CNN_proj/W_proj"] == (2048, 128)
    assert shapes["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"] == (256, 4096)
    assert shapes["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0"] == (1024, 128)
    assert_same_parameters(
        model, load_bilm(tmp_path / "options.json", tmp_path / "lm_weights.hdf5")
    )


@pytest.mark.parametrize(
    ("name", "millions"), [("small", 13.6), ("medium", 28.0), ("original", 93.6)]
)
def test_published_shapes_have_elmos_parameter_counts(
    monkeypatch: pytest.MonkeyPatch, name: str, millions: float
) -> None:
    for module in (CharCNN, Highway, LstmWithProjection):  # shapes only: uninitialised memory
        monkeypatch.setattr(module, "reset_parameters", lambda self: None)
    model = BiLM(BiLMOptions.published(name))
    char_dim = model.options.char_cnn.embedding_dim
    stored = sum(p.numel() for p in model.parameters()) - char_dim  # the zero row is not stored
    assert round(stored / 1e6, 1) == millions


def test_options_round_trip_keeps_training_keys(tmp_path: Path) -> None:
    options = BiLMOptions.published("small", dropout=0.1)
    options.extra = {"n_tokens_vocab": 793471, "bidirectional": True}
    options.to_json(tmp_path / "options.json")
    assert BiLMOptions.from_json(tmp_path / "options.json") == options


def write_options(path: Path, fixture_dir: Path, edit) -> Path:
    options = json.loads((fixture_dir / "options.json").read_text(encoding="utf-8"))
    edit(options)
    path.write_text(json.dumps(options), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: o["lstm"].pop("projection_dim"), "missing key 'lstm.projection_dim'"),
        (lambda o: o["char_cnn"]["embedding"].pop("dim"), "missing key 'char_cnn.embedding.dim'"),
        (lambda o: o.pop("char_cnn"), "missing key 'char_cnn.filters'"),
        (lambda o: o.update(lstm=[]), "'lstm' must be a JSON object"),
        (lambda o: o["char_cnn"].update(filters=[[1, 4, 2]]), "'char_cnn.filters' must be a list"),
        (lambda o: o["lstm"].update(proj_clip=-1), "'lstm.proj_clip' must be a positive number"),
        (lambda o: o.update(dropout=1.5), r"'dropout' must be a number in \[0, 1\)"),
        (lambda o: o["char_cnn"].update(n_characters=261), "'char_cnn.n_characters' must be 262"),
        (lambda o: o["char_cnn"].update(activation="gelu"), "'char_cnn.activation' must be one of"),
        (lambda o: o["lstm"].update(dim="64"), "'lstm.dim' must be an integer >= 1, got '64'"),
    ],
)
def test_bad_options_name_the_file_and_the_key(
    fixture_dir: Path, tmp_path: Path, edit, message: str
) -> None:
    options = write_options(tmp_path / "options.json", fixture_dir, edit)
    with pytest.raises(ElmolabError, match=message) as error:
        load_bilm(options, fixture_dir / "lm_weights.hdf5")
    assert str(error.value).startswith(str(options))


def test_unreadable_options(tmp_path: Path, fixture_dir: Path) -> None:
    weights = fixture_dir / "lm_weights.hdf5"
    with pytest.raises(ElmolabError, match="no such options file"):
        load_bilm(tmp_path / "absent.json", weights)
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(ElmolabError, match=r"broken.json: not valid JSON"):
        load_bilm(tmp_path / "broken.json", weights)


def edit_weights(source: Path, target: Path, edit) -> Path:
    shutil.copy(source, target)
    with h5py.File(target, "r+") as f:
        edit(f)
    return target


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: f.__delitem__("CNN_proj/W_proj"), r"missing dataset 'CNN_proj/W_proj'$"),
        (lambda f: f.__delitem__("char_embed"), r"missing dataset 'char_embed'$"),
        (
            lambda f: f.move("CNN/W_cnn_3", "CNN/W_cnn3"),
            r"missing dataset 'CNN/W_cnn_3' \(the file has 'CNN/W_cnn3'\)",
        ),
        (
            lambda f: f.move("RNN_1/RNN/MultiRNNCell/Cell1", "RNN_1/RNN/MultiRNNCell/Cell_1"),
            r"missing dataset 'RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0' "
            r"\(the file has 'RNN_1/RNN/MultiRNNCell/Cell_1/LSTMCell/W_0'\)",
        ),
    ],
)
def test_missing_or_misnamed_dataset_is_named(
    fixture_dir: Path, tmp_path: Path, edit, message: str
) -> None:
    weights = edit_weights(fixture_dir / "lm_weights.hdf5", tmp_path / "w.hdf5", edit)
    with pytest.raises(ElmolabError, match=message) as error:
        load_bilm(fixture_dir / "options.json", weights)
    assert str(error.value).startswith(str(weights))


def test_shape_mismatch_names_dataset_expected_and_found(fixture_dir: Path, tmp_path: Path) -> None:
    options = write_options(
        tmp_path / "options.json", fixture_dir, lambda o: o["lstm"].update(projection_dim=32)
    )
    with pytest.raises(ElmolabError) as error:
        load_bilm(options, fixture_dir / "lm_weights.hdf5")
    assert str(error.value) == (
        f"{fixture_dir / 'lm_weights.hdf5'}: dataset 'CNN_proj/W_proj' has shape (124, 16), "
        f"{options} imply (124, 32) (from 'lstm.projection_dim' 32)"
    )


# The child reports its peak RSS after the imports and after the load, in KiB (Linux ru_maxrss).
MEASURE_LOAD = """
import resource, sys
from elmolab.cli import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
status = main(sys.argv[1:])
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(status)
"""


def test_options_far_larger_than_the_weights_are_refused_before_allocating(
    fixture_dir: Path, tmp_path: Path
) -> None:
    """``lstm.dim`` 200000 beside the fixture's 0.45 MB of weights implies 118M parameters
    (474 MB): ``elmolab embed`` ends with one line and its peak memory does not move.
    """
    weights = fixture_dir / "lm_weights.hdf5"
    options = write_options(
        tmp_path / "options.json", fixture_dir, lambda o: o["lstm"].update(dim=200000)
    )
    (tmp_path / "in.txt").write_text("One sentence .\n", encoding="utf-8")
    model_files = [str(tmp_path / "out.hdf5"), "--options", str(options), "--weights", str(weights)]
    done = subprocess.run(
        [sys.executable, "-c", MEASURE_LOAD, "embed", str(tmp_path / "in.txt"), *model_files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr == (
        f"elmolab embed: error: {weights}: dataset 'RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0' "
        f"has shape (32, 256), {options} imply (32, 800000) (from 'lstm.dim' 200000)\n"
    )
    before_kib, after_kib = map(int, done.stdout.split())
    # Building the model first (as before) raised the peak by ~480 MB; the check reads HDF5
    # metadata only. 4 MiB leaves room for h5py's and the allocator's bookkeeping, ~10x the file.
    assert (after_kib - before_kib) * 1024 < max(4 << 20, 10 * weights.stat().st_size)
    assert not (tmp_path / "out.hdf5").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda o: o["lstm"].update(n_layers=3),
            r"missing dataset 'RNN_0/RNN/MultiRNNCell/Cell2/LSTMCell/W_0' "
            r"\('lstm\.n_layers' is 3\)$",
        ),
        (
            lambda o: o["char_cnn"].update(n_highway=3),
            r"missing dataset 'CNN_high_2/W_carry' \('char_cnn\.n_highway' is 3\)$",
        ),
        (
            lambda o: o["char_cnn"]["filters"].__setitem__(2, [3, 17]),
            r"dataset 'CNN/W_cnn_2' has shape \(1, 3, 4, 16\), .*options\.json imply "
            r"\(1, 3, 4, 17\) \(from 'char_cnn\.filters\[2\]\[1\]' 17\)$",
        ),
        (
            lambda o: o["char_cnn"]["embedding"].update(dim=5),
            r"dataset 'char_embed' has shape \(261, 4\), .*options\.json imply \(261, 5\) "
            r"\(from 'char_cnn\.embedding\.dim' 5\)$",
        ),
    ],
    ids=["n_layers", "n_highway", "filter", "char_dim"],
)
def test_options_the_weights_do_not_hold_name_the_option(
    fixture_dir: Path, tmp_path: Path, edit, message: str
) -> None:
    options = write_options(tmp_path / "options.json", fixture_dir, edit)
    with pytest.raises(ElmolabError, match=message):
        load_bilm(options, fixture_dir / "lm_weights.hdf5")


def test_options_beyond_the_parameter_bound_are_refused(fixture_dir: Path, tmp_path: Path) -> None:
    options = write_options(
        tmp_path / "options.json", fixture_dir, lambda o: o["lstm"].update(dim=10**8)
    )
    with pytest.raises(ElmolabError, match=r"imply 59,200,067,236 parameters .* more than the"):
        load_bilm(options, fixture_dir / "lm_weights.hdf5")
    with torch.device("meta"):
        original = BiLM(BiLMOptions.published("original"))
    assert sum(p.numel() for p in original.parameters()) < MAX_PARAMETERS / 10


def test_unreadable_weights(fixture_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ElmolabError, match="no such weights file"):
        load_bilm(fixture_dir / "options.json", tmp_path / "absent.hdf5")
    (tmp_path / "text.hdf5").write_text("not hdf5", encoding="utf-8")
    with pytest.raises(ElmolabError, match=r"text.hdf5: not a readable HDF5 file"):
        load_bilm(fixture_dir / "options.json", tmp_path / "text.hdf5")


# -- checkpoint ------------------------------------------------------------------------------


def test_checkpoint_round_trip(fixture_dir: Path, tmp_path: Path) -> None:
    model = load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    save_bilm_checkpoint(model, tmp_path / "model.pt")
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert saved.keys() == {"options", "state_dict"}
    loaded = load_bilm_from_checkpoint(tmp_path / "model.pt")
    assert loaded.options == model.options
    assert_same_parameters(model, loaded)


def test_bad_checkpoints_name_the_file(fixture_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ElmolabError, match="no such checkpoint file"):
        load_bilm_from_checkpoint(tmp_path / "absent.pt")
    (tmp_path / "text.pt").write_text("not torch", encoding="utf-8")
    with pytest.raises(ElmolabError, match=r"text.pt: not a readable torch checkpoint"):
        load_bilm_from_checkpoint(tmp_path / "text.pt")
    model = load_bilm(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5")
    state_dict = model.state_dict()
    del state_dict["token_encoder.W_proj"]
    torch.save({"options": model.options.to_dict(), "state_dict": state_dict}, tmp_path / "x.pt")
    with pytest.raises(ElmolabError, match=r"x.pt: .*missing \['token_encoder.W_proj'\]"):
        load_bilm_from_checkpoint(tmp_path / "x.pt")
    options = model.options.to_dict()
    del options["lstm"]["dim"]
    torch.save({"options": options, "state_dict": model.state_dict()}, tmp_path / "y.pt")
    with pytest.raises(ElmolabError, match=r"y.pt: missing key 'lstm.dim'"):
        load_bilm_from_checkpoint(tmp_path / "y.pt")


# -- feature files ---------------------------------------------------------------------------


def random_layers(n_tokens: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, n_tokens, 8)).astype(np.float32)


@pytest.mark.parametrize("mode", ["all", "top", "average"])
def test_feature_file_round_trip(tmp_path: Path, mode: str) -> None:
    sentences = {0: "a b c", 1: "d e", 2: "f"}
    layers = {i: random_layers(len(s.split()), i) for i, s in sentences.items()}
    path = tmp_path / "features.hdf5"
    with open_feature_writer(path, mode) as writer:
        for i in (2, 0, 1):  # any order
            writer.write(i, sentences[i], layers[i])
    got = read_features(path, n_units=[3, 2, 1])
    for i, array in enumerate(got):
        want = {"all": layers[i], "top": layers[i][-1], "average": layers[i].mean(0)}[mode]
        assert array.dtype == np.float32
        np.testing.assert_array_equal(array, want)
    with h5py.File(path, "r") as f:
        assert json.loads(f["sentence_to_index"][0]) == {"a b c": "0", "d e": "1", "f": "2"}
        assert f["0"].dtype == np.float32


def test_float16_storage(tmp_path: Path) -> None:
    layers = random_layers(4, 0)
    with open_feature_writer(tmp_path / "f.hdf5", "all", dtype="float16") as writer:
        writer.write(0, "a b c d", layers)
    with h5py.File(tmp_path / "f.hdf5", "r") as f:
        assert f["0"].dtype == np.float16
    (array,) = read_features(tmp_path / "f.hdf5")
    np.testing.assert_allclose(array, layers, rtol=1e-3, atol=1e-3)


def test_feature_writer_leaves_nothing_on_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), open_feature_writer(tmp_path / "f.hdf5") as writer:
        writer.write(0, "a", random_layers(1, 0))
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_feature_reader_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "f.hdf5"
    with open_feature_writer(path) as writer:
        writer.write(0, "a b", random_layers(2, 0))
        writer.write(1, "c", random_layers(1, 1))
    with pytest.raises(ElmolabError, match=r"f.hdf5: line index 1: 1 token vectors, expected 2"):
        read_features(path, n_units=[2, 2])
    with pytest.raises(ElmolabError, match=r"f.hdf5: 2 lines, expected 3"):
        read_features(path, n_units=[2, 1, 1])
    with h5py.File(path, "r+") as f:
        f.move("1", "one")
    with pytest.raises(ElmolabError, match=r"f.hdf5: datasets must be named 0 \.\. 1"):
        read_features(path)
    with h5py.File(path, "r+") as f:
        del f["sentence_to_index"]
    with pytest.raises(ElmolabError, match="no 'sentence_to_index' dataset"):
        read_features(path)
    with pytest.raises(ElmolabError, match="no such feature file"):
        read_features(tmp_path / "absent.hdf5")
