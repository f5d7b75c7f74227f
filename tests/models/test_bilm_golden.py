"""The biLM computes what bilm-tf computes.

- On ``data/reference/elmo_fixture`` the stateful run in the reference batch order reproduces
  bilm-tf's top layer, and the char CNN its token embeddings, within 1e-6 (fp32).
- On both fixtures (with and without skip connections) every layer equals an independent float64
  numpy implementation written from the equations of docs/architecture.md §2.
- The training entry point ``encode_lm`` computes what ``forward`` computes, with dropout in
  training only, gradients everywhere, and states carried between windows.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmolab.models.bilm import BiLM
from elmolab.models.bilm_tf import load_bilm
from elmolab.text.chars import char_ids_for_sentences, char_ids_for_token

ATOL = 1e-6  # the reference tolerance of the fixture (the data card, data/README.md)


def reference_batches(fixture_dir: Path) -> list[list[list[str]]]:
    """Batch i = [sentences[0][i], sentences[1][i], sentences[2][i]], as the outputs were made."""
    sentences = json.loads((fixture_dir / "sentences.json").read_text(encoding="utf-8"))
    return [[sentences[k][i].split() for k in range(3)] for i in range(len(sentences[0]))]


def test_stateful_run_reproduces_bilm_tf_top_layer(model: BiLM, fixture_dir: Path) -> None:
    model.stateful = True
    model.reset_states()
    try:
        with torch.no_grad():
            outputs = [
                model(char_ids_for_sentences(batch, add_sentence_marks=False))
                for batch in reference_batches(fixture_dir)
            ]
    finally:
        model.stateful = False
        model.reset_states()
    proj = model.options.lstm.projection_dim
    for k in (0, 1):  # lm_embeddings_k holds row k of every batch
        with h5py.File(fixture_dir / f"lm_embeddings_{k}.hdf5", "r") as expected:
            assert len(expected) == len(outputs)
            for i, output in enumerate(outputs):
                want = expected[str(i)][...]  # (2, tokens, proj): forward, backward
                top = output.layers[k, -1, : want.shape[1]].numpy()  # (tokens, 2 * proj)
                assert output.mask[k].sum() == want.shape[1]
                got = np.stack([top[:, :proj], top[:, proj:]])
                np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"batch {i}")


def test_stateless_run_differs_from_the_stateful_reference(model: BiLM, fixture_dir: Path) -> None:
    """Batch 1 depends on the state left by batch 0: the golden test really tests statefulness."""
    with torch.no_grad():
        output = model(
            char_ids_for_sentences(reference_batches(fixture_dir)[1], add_sentence_marks=False)
        )
    with h5py.File(fixture_dir / "lm_embeddings_0.hdf5", "r") as expected:
        want = expected["1"][...]
    top = output.layers[0, -1, : want.shape[1]].numpy()
    assert np.abs(top[:, : want.shape[2]] - want[0]).max() > 1e-3


def test_token_embeddings_match_bilm_tf(model: BiLM, fixture_dir: Path) -> None:
    words = (fixture_dir / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    words = [w for w in words if w]
    ids = torch.tensor([char_ids_for_token(w) for w in words])  # (words, chars)
    with torch.no_grad():
        got = model.token_encoder(ids).numpy()  # (words, proj)
    with h5py.File(fixture_dir / "elmo_token_embeddings.hdf5", "r") as expected:
        want = expected["embedding"][...]
    assert got.shape == want.shape == (458, 16)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def numpy_bilm(fixture: Path, tokens: list[str]) -> np.ndarray:
    """Every layer (n_layers + 1, n_tokens, 2 * proj) for one sentence, in float64, from the
    hdf5 arrays and the equations of docs/architecture.md §2, one token and one step at a time.
    """
    options = json.loads((fixture / "options.json").read_text(encoding="utf-8"))
    cnn, lstm = options["char_cnn"], options["lstm"]
    with h5py.File(fixture / "lm_weights.hdf5", "r") as weights:
        w = {name: weights[name][...].astype(np.float64) for name in _datasets(weights)}

    def sigmoid(x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x))

    def token_vector(token: str) -> np.ndarray:
        embed = np.vstack([np.zeros((1, w["char_embed"].shape[1])), w["char_embed"]])
        chars = embed[char_ids_for_token(token)]  # (50, char_dim)
        features = []
        for i, (width, _) in enumerate(cnn["filters"]):
            kernel = w[f"CNN/W_cnn_{i}"][0]  # (width, char_dim, n)
            conv = [
                np.einsum("wd,wdn->n", chars[p : p + width], kernel)
                for p in range(len(chars) - width + 1)
            ]
            features.append(np.maximum(np.max(conv, axis=0) + w[f"CNN/b_cnn_{i}"], 0.0))
        x = np.concatenate(features)
        for k in range(cnn["n_highway"]):
            gate = sigmoid(x @ w[f"CNN_high_{k}/W_carry"] + w[f"CNN_high_{k}/b_carry"])
            transform = np.maximum(
                x @ w[f"CNN_high_{k}/W_transform"] + w[f"CNN_high_{k}/b_transform"], 0.0
            )
            x = gate * transform + (1.0 - gate) * x
        return x @ w["CNN_proj/W_proj"] + w["CNN_proj/b_proj"]

    def direction(d: int, inputs: np.ndarray) -> list[np.ndarray]:
        cell_clip, proj_clip = lstm["cell_clip"], lstm["proj_clip"]
        layers = []
        for layer in range(lstm["n_layers"]):
            prefix = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            W_0, B, W_P = (w[f"{prefix}/{name}"] for name in ("W_0", "B", "W_P_0"))
            h, c, outputs = np.zeros(lstm["projection_dim"]), np.zeros(lstm["dim"]), []
            for x_t in inputs:
                i, j, f, o = np.split(np.concatenate([x_t, h]) @ W_0 + B, 4)
                c = np.clip(sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j), -cell_clip, cell_clip)
                h = np.clip((sigmoid(o) * np.tanh(c)) @ W_P, -proj_clip, proj_clip)
                outputs.append(h)
            output = np.stack(outputs)
            if lstm["use_skip_connections"] and layer > 0:
                output = output + inputs
            layers.append(output)
            inputs = output
        return layers

    x = np.stack([token_vector(t) for t in ["<S>", *tokens, "</S>"]])  # (n + 2, proj)
    forward = direction(0, x)
    backward = [layer[::-1] for layer in direction(1, x[::-1])]
    layers = [np.concatenate([x, x], 1)]
    layers += [np.concatenate([f, b], 1) for f, b in zip(forward, backward, strict=True)]
    return np.stack(layers)[:, 1:-1]


def _datasets(f: h5py.File) -> list[str]:
    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


@pytest.mark.parametrize("fixture_name", ["elmo_fixture", "elmo_fixture_noskip"])
def test_every_layer_matches_an_independent_numpy_bilm(data_dir: Path, fixture_name: str) -> None:
    fixture = data_dir / "reference" / fixture_name
    model = load_bilm(fixture / "options.json", fixture / "lm_weights.hdf5")
    assert model.options.lstm.use_skip_connections == (fixture_name == "elmo_fixture")
    sentences = [["The", "cat", "sat", "on", "the", "mat", "."], ["Bonjour", "à", "tous", "!"]]
    with torch.no_grad():
        output = model(
            char_ids_for_sentences(sentences, add_sentence_marks=False)
        )  # one batch: the short row is padded
    for row, tokens in enumerate(sentences):
        want = numpy_bilm(fixture, tokens)  # (3, tokens, 2 * proj)
        got = output.layers[row, :, : len(tokens)].double().numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"{fixture_name} {row}")
        assert not output.layers[row, :, len(tokens) :].any()  # zero past the sentence


def test_encode_lm_matches_forward_on_a_full_row(model: BiLM) -> None:
    tokens = ["The", "cat", "sat", "."]
    forward_ids = torch.tensor([[char_ids_for_token(t) for t in ["<S>", *tokens, "</S>"]]])
    with torch.no_grad():
        forward, backward, state = model.encode_lm(forward_ids, forward_ids.flip(1))
        layers = model(char_ids_for_sentences([tokens], add_sentence_marks=False)).layers[
            0
        ]  # (3, tokens, 2 * proj)
    proj = model.options.lstm.projection_dim
    for k, (f, b) in enumerate(zip(forward, backward, strict=True)):  # (1, tokens + 2, proj)
        torch.testing.assert_close(layers[k + 1, :, :proj], f[0, 1:-1], rtol=0, atol=1e-6)
        torch.testing.assert_close(layers[k + 1, :, proj:], b[0].flip(0)[1:-1], rtol=0, atol=1e-6)
    assert state.forward.h.shape == (2, 1, proj)
    assert state.backward.c.shape == (2, 1, model.options.lstm.dim)


def test_encode_lm_trains_with_dropout_and_carries_state(model: BiLM) -> None:
    torch.manual_seed(0)
    trainee = BiLM(dataclasses.replace(model.options, dropout=0.5))
    trainee.load_state_dict(model.state_dict())
    ids = char_ids_for_sentences(
        [["<S>", "Some", "words", "to", "train", "on", "</S>"]] * 2, add_sentence_marks=False
    )
    forward, backward, state = trainee.encode_lm(ids, ids.flip(1))
    again, _, _ = trainee.encode_lm(ids, ids.flip(1))
    assert not torch.equal(forward[-1], again[-1])  # dropout acts in training
    (forward[-1].sum() + backward[-1].sum()).backward()
    assert all(p.grad is not None for p in trainee.parameters())
    assert not trainee.token_encoder.char_embed.grad[0].any()  # the padding row stays zero
    assert not state.forward.h.requires_grad  # detached for truncated BPTT

    trainee.eval()
    with torch.no_grad():
        first, _, _ = trainee.encode_lm(ids, ids.flip(1))
        second, _, _ = trainee.encode_lm(ids, ids.flip(1))
        carried, _, _ = trainee.encode_lm(ids, ids.flip(1), state)
    assert torch.equal(first[-1], second[-1])
    assert not torch.allclose(first[-1], carried[-1])
