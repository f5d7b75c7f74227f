"""The trained-token-layer control: what it keeps, what it replaces, and its errors."""

import json
from pathlib import Path

import pytest
import torch
from fixtures.workspace import FIXTURE_OPTIONS

from elmolab.core.errors import ElmolabError
from elmolab.core.params import compose_params
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import load_bilm, load_bilm_from_checkpoint, save_bilm_checkpoint
from elmolab.models.controls import token_layer_control, token_layer_digest
from elmolab.stages import token_control

CONF = Path(__file__).resolve().parents[2] / "conf"


def _trained(folder: Path) -> BiLM:
    torch.manual_seed(7)
    model = BiLM(BiLMOptions.from_json(FIXTURE_OPTIONS))
    folder.mkdir()
    save_bilm_checkpoint(model, folder / "model.pt")
    (folder / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n", encoding="utf-8")
    return model


def test_the_control_keeps_the_token_layer_and_replaces_every_lstm_weight(tmp_path: Path) -> None:
    trained = _trained(tmp_path / "bilm")
    metrics = token_layer_control(tmp_path / "bilm", tmp_path / "control", seed=1)
    control = load_bilm(tmp_path / "control/options.json", tmp_path / "control/weights.hdf5")
    assert (
        metrics["token_layer_sha256"] == token_layer_digest(trained) == token_layer_digest(control)
    )
    for name, tensor in control.state_dict().items():
        if name.startswith("token_encoder."):
            torch.testing.assert_close(tensor, trained.state_dict()[name], rtol=0, atol=0)
        else:  # every LSTM tensor, biases included
            assert not torch.allclose(tensor, trained.state_dict()[name]), name
    checkpoint = load_bilm_from_checkpoint(tmp_path / "control/model.pt")
    for name, tensor in checkpoint.state_dict().items():
        torch.testing.assert_close(tensor, control.state_dict()[name], rtol=0, atol=0)
    assert (tmp_path / "control/vocab.txt").read_text() == (tmp_path / "bilm/vocab.txt").read_text()


def test_the_seed_fixes_the_random_lstms(tmp_path: Path) -> None:
    _trained(tmp_path / "bilm")
    weights = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        token_layer_control(tmp_path / "bilm", tmp_path / name, seed=seed)
        weights[name] = load_bilm_from_checkpoint(tmp_path / name / "model.pt").state_dict()
    key = "forward_lstm.layers.0.W_0"
    torch.testing.assert_close(weights["a"][key], weights["b"][key], rtol=0, atol=0)
    assert not torch.allclose(weights["a"][key], weights["c"][key])


def test_a_missing_trained_model_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bilm").mkdir()
    with pytest.raises(ElmolabError, match=r"bilm/model.pt: no model.pt: run the pretrain stage"):
        token_layer_control(tmp_path / "bilm", tmp_path / "control", seed=1)
    assert not (tmp_path / "control").exists()


def test_the_stage_writes_each_instance_with_its_own_seed(tmp_path: Path, capsys) -> None:
    """token_control@<instance>: bilm_<instance>, the LSTMs of ``controls.token_layer``'s seed for
    it, the global seed aside (instance 1's, 1, drew the single control of before)."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    _trained(artifacts / "bilm")
    params = tmp_path / "params.yaml"
    text = compose_params(CONF, [f"paths.artifacts={artifacts}", "seed=7"])
    params.write_text(text, encoding="utf-8")
    for instance in ("token_only", "token_only_2"):
        token_control.main(CONF, ["--params", str(params), "--instance", instance])
    for seed in (1, 2):
        token_layer_control(artifacts / "bilm", tmp_path / f"seed{seed}", seed=seed)
    key = "forward_lstm.layers.0.W_0"
    for instance, seed in (("token_only", 1), ("token_only_2", 2)):
        folder = artifacts / f"bilm_{instance}"
        assert json.loads((folder / "metrics.json").read_text())["seed"] == seed
        written = load_bilm_from_checkpoint(folder / "model.pt").state_dict()
        drawn = load_bilm_from_checkpoint(tmp_path / f"seed{seed}" / "model.pt").state_dict()
        for name, tensor in written.items():
            torch.testing.assert_close(tensor, drawn[name], rtol=0, atol=0)
    first, second = (
        load_bilm_from_checkpoint(artifacts / f"bilm_{name}" / "model.pt").state_dict()[key]
        for name in ("token_only", "token_only_2")
    )
    assert not torch.allclose(first, second)
    with pytest.raises(SystemExit):
        token_control.main(CONF, ["--params", str(params), "--instance", "token_only_9"])
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "--instance 'token_only_9': not an instance of controls.token_layer (token_only,"
            " token_only_2, token_only_3)"
        )
    )
