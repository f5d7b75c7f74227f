"""``elmolab.Elmo`` and ``elmolab.batch_to_ids`` compute what allennlp 2.10.1's do.

The reference is allennlp itself, run by ``tools/allennlp_reference.py`` on the fixture's weights
(``tests/fixtures/allennlp_elmo_reference.npz``): two output representations, dropout 0, learned
mixes set to non-trivial weights and fixed ``scalar_mix_parameters``, each with and without layer
norm, the sentence boundaries kept, and a stateful run. Gradients, the L2 penalty, dropout and
every bad input are checked here on the real model.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import expect_error

from elmolab import Elmo, batch_to_ids
from elmolab.core.errors import ElmolabError

REFERENCE = Path(__file__).parent / "fixtures" / "allennlp_elmo_reference.npz"
ATOL = 1e-5  # the acceptance tolerance; measured: 1.5e-6 at most
N_BATCHES = 3  # as the reference tool: batch i = sentence i of each of the three lists
MIX_W = [[0.5, -0.25, 1.0], [-1.0, 0.0, 2.0]]  # as the reference tool sets the learned mixes
MIX_GAMMA = [1.3, 0.7]
FIXED = [0.3, -1.2, 0.9]
EXTRA_SENTENCES = [["Zürich", "naïve", "日本語", "<S>", "</S>", "x"], ["\u00e9", "🙂"]]
SETTINGS = {  # name: (Elmo keyword arguments, states reset before every batch)
    "learned": ({}, True),
    "learned_ln": ({"do_layer_norm": True}, True),
    "fixed": ({"scalar_mix_parameters": FIXED}, True),
    "fixed_ln": ({"scalar_mix_parameters": FIXED, "do_layer_norm": True}, True),
    "boundaries_ln": ({"do_layer_norm": True, "keep_sentence_boundaries": True}, True),
    "stateful": ({"stateful": True}, False),
}


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(REFERENCE) as data:
        return dict(data)


@pytest.fixture(scope="module")
def batches(fixture_dir: Path) -> list[list[list[str]]]:
    lists = json.loads((fixture_dir / "sentences.json").read_text(encoding="utf-8"))
    return [[lists[k][i].split() for k in range(3)] for i in range(N_BATCHES)]


def make_elmo(fixture_dir: Path, options: Path | None = None, **kwargs) -> Elmo:
    options = options or fixture_dir / "options.json"
    return Elmo(
        options, fixture_dir / "lm_weights.hdf5", 2, dropout=kwargs.pop("dropout", 0.0), **kwargs
    )


def test_reference_settings_match_the_tool() -> None:
    with np.load(REFERENCE) as data:
        assert list(data["settings"]) == list(SETTINGS)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_equals_allennlp(
    setting: str, fixture_dir: Path, batches: list, reference: dict[str, np.ndarray]
) -> None:
    kwargs, reset = SETTINGS[setting]
    elmo = make_elmo(fixture_dir, **kwargs).eval()
    if "scalar_mix_parameters" not in kwargs:
        with torch.no_grad():
            elmo.scalar_mix.w.copy_(torch.tensor(MIX_W))
            elmo.scalar_mix.gamma.copy_(torch.tensor(MIX_GAMMA))
    for i, batch in enumerate(batches):
        if reset:
            elmo.reset_states()
        output = elmo(batch_to_ids(batch))
        mask = output["mask"]
        assert mask.dtype == torch.bool
        np.testing.assert_array_equal(mask.numpy(), reference[f"{setting}/{i}/mask"])
        assert len(output["elmo_representations"]) == 2
        for k, representation in enumerate(output["elmo_representations"]):
            want = reference[f"{setting}/{i}/rep{k}"]
            assert representation.shape == want.shape
            np.testing.assert_allclose(
                representation.detach().numpy(), want, rtol=0, atol=ATOL, err_msg=f"{i}/rep{k}"
            )


def test_reference_covers_what_it_claims(reference: dict[str, np.ndarray]) -> None:
    """The settings differ where they should: the tests above could not pass by accident."""

    def gap(a: str, b: str) -> float:
        return float(np.abs(reference[a] - reference[b]).max())

    assert gap("stateful/0/rep0", "learned/0/rep0") == 0  # the first batch starts from zeros
    assert gap("stateful/1/rep0", "learned/1/rep0") > 0.1  # the second continues batch 0
    assert gap("learned_ln/0/rep0", "learned/0/rep0") > 0.1
    assert gap("learned/0/rep0", "learned/0/rep1") > 0.1  # each representation its own mix
    assert gap("fixed/0/rep0", "fixed/0/rep1") == 0
    mask = reference["boundaries_ln/0/mask"]  # (3, time + 2): <S> .. </S>, then padding
    assert mask.shape[1] == reference["learned/0/mask"].shape[1] + 2
    assert (~mask).any()  # with padding, which layer norm leaves nonzero as allennlp does


def test_batch_to_ids_equals_allennlp(batches: list, reference: dict[str, np.ndarray]) -> None:
    for i, batch in enumerate(batches):
        ids = batch_to_ids(batch)
        assert ids.dtype == torch.long
        np.testing.assert_array_equal(ids.numpy(), reference[f"ids/{i}"])
    np.testing.assert_array_equal(batch_to_ids(EXTRA_SENTENCES).numpy(), reference["ids/extra"])


def conll_sentences(path: Path) -> list[list[str]]:
    """The tokens (first column) of a CoNLL-2003 file's sentences; the tags are not read (the
    training file has a tag that breaks its own IOB1 scheme, which is not this test's matter)."""
    sentences, tokens = [], []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if line.strip() and not line.startswith("-DOCSTART-"):
            tokens.append(line.split()[0])
        elif tokens:
            sentences.append(tokens)
            tokens = []
    return sentences


def test_batch_to_ids_on_conll2003(data_dir: Path) -> None:
    """The real NER file: every sentence converts; its over-long tokens need ``truncate``."""
    sentences = conll_sentences(data_dir / "probing/conll2003/eng.testa")
    ids = batch_to_ids(sentences[:64])
    assert ids.shape == (64, max(len(s) for s in sentences[:64]), 50)
    assert ((ids > 0).any(-1).sum(1) == torch.tensor([len(s) for s in sentences[:64]])).all()
    train = conll_sentences(data_dir / "probing/conll2003/eng.train")
    long = [s for s in train if any(len(t.encode()) > 48 for t in s)]
    assert sum(len(t.encode()) > 48 for s in long for t in s) == 4  # rows of dashes
    with pytest.raises(
        ElmolabError,
        match=r"sentence 0, token 0 \('Company-{13}Price-{3}Br\.\.\.'\) has 50 UTF-8 bytes",
    ):
        batch_to_ids(long)
    cut = batch_to_ids(long, truncate=True)
    assert cut.shape[0] == len(long)


def test_gradients_reach_the_mix_and_only_a_fine_tuned_bilm(fixture_dir: Path, batches) -> None:
    ids = batch_to_ids(batches[0])
    frozen = make_elmo(fixture_dir, do_layer_norm=True)
    assert not any(p.requires_grad for p in frozen.bilm.parameters())
    loss = sum(r.square().sum() for r in frozen(ids)["elmo_representations"])
    loss.backward()
    for grad in (frozen.scalar_mix.w.grad, frozen.scalar_mix.gamma.grad):
        assert grad is not None and (grad.abs() > 0).all()  # every mix, every layer weight
    assert all(p.grad is None for p in frozen.bilm.parameters())

    tuned = make_elmo(fixture_dir, requires_grad=True)
    loss = sum(r.square().sum() for r in tuned(ids)["elmo_representations"])
    loss.backward()
    bilm = tuned.bilm
    for param in (
        bilm.token_encoder.char_embed,
        bilm.token_encoder.W_proj,
        bilm.forward_lstm.layers[0].W_0,
        bilm.backward_lstm.layers[1].W_P,
    ):
        assert param.grad is not None and param.grad.abs().sum() > 0
    assert (tuned.scalar_mix.w.grad.abs() > 0).all()


def test_fixed_mix_is_not_trained(fixture_dir: Path, batches) -> None:
    elmo = make_elmo(fixture_dir, scalar_mix_parameters=FIXED)
    assert not any(p.requires_grad for p in elmo.parameters())
    assert elmo.scalar_mix_l2(0.1).item() == 0.0


def test_scalar_mix_l2(fixture_dir: Path) -> None:
    elmo = make_elmo(fixture_dir)
    assert elmo.scalar_mix_l2(0.5).item() == 0.0  # w starts at 0
    with torch.no_grad():
        elmo.scalar_mix.w.copy_(torch.tensor(MIX_W))
    penalty = elmo.scalar_mix_l2(0.5)
    assert penalty.item() == pytest.approx(0.5 * sum(v * v for row in MIX_W for v in row))
    penalty.backward()
    torch.testing.assert_close(elmo.scalar_mix.w.grad, 2 * 0.5 * torch.tensor(MIX_W))


def test_dropout_acts_in_train_mode_only(fixture_dir: Path, batches) -> None:
    ids = batch_to_ids(batches[1])
    plain = make_elmo(fixture_dir)(ids)["elmo_representations"][0]
    elmo = make_elmo(fixture_dir, dropout=0.5)
    torch.testing.assert_close(elmo.eval()(ids)["elmo_representations"][0], plain)
    torch.manual_seed(0)
    dropped = elmo.train()(ids)["elmo_representations"][0].detach()
    kept = dropped != 0
    real = plain != 0
    assert 0.4 < (kept & real).sum() / real.sum() < 0.6
    torch.testing.assert_close(dropped[kept], 2 * plain[kept])


def test_options_dropout_is_not_applied(fixture_dir: Path, tmp_path: Path, batches) -> None:
    """allennlp's biLM ignores the options' training dropout, in train mode too."""
    options = json.loads((fixture_dir / "options.json").read_text())
    (tmp_path / "options.json").write_text(json.dumps({**options, "dropout": 0.5}))
    ids = batch_to_ids(batches[2])
    want = make_elmo(fixture_dir)(ids)["elmo_representations"][0]
    elmo = make_elmo(fixture_dir, tmp_path / "options.json", requires_grad=True).train()
    torch.testing.assert_close(elmo(ids)["elmo_representations"][0], want)


def test_leading_dimensions_are_kept(fixture_dir: Path, batches) -> None:
    elmo = make_elmo(fixture_dir)
    ids = batch_to_ids(batches[0] + batches[1])  # (6, time, 50)
    flat = elmo(ids)
    nested = elmo(ids.view(2, 3, *ids.shape[1:]))
    assert nested["mask"].shape == (2, 3, ids.shape[1])
    torch.testing.assert_close(
        nested["elmo_representations"][1].flatten(0, 1), flat["elmo_representations"][1]
    )
    assert elmo.get_output_dim() == flat["elmo_representations"][0].shape[-1] == 32


def test_an_elmo_of_a_bilm_in_memory_and_of_given_layers(fixture_dir: Path, batches) -> None:
    """``Elmo.from_bilm`` is the file constructor's ``Elmo`` (a copy: fine-tuning leaves the
    given biLM as it is); ``layers`` then ``mix`` give ``forward``'s representations (the
    boundaries kept), and an ``Elmo.of_layers`` mixes them alike without a biLM."""
    ids = batch_to_ids(batches[0])
    loaded = make_elmo(fixture_dir, do_layer_norm=True, keep_sentence_boundaries=True)
    elmo = Elmo.from_bilm(
        loaded.bilm, 2, dropout=0.0, do_layer_norm=True, keep_sentence_boundaries=True
    )
    assert elmo.bilm is not loaded.bilm
    want = loaded(ids)
    found = elmo(ids)
    pairs = zip(found["elmo_representations"], want["elmo_representations"], strict=True)
    assert all(torch.equal(mine, theirs) for mine, theirs in pairs)
    layers, mask = elmo.layers(ids)  # (L, batch, time + 2, D): the boundaries kept
    assert torch.equal(mask, want["mask"]) and layers.shape[:2] == (3, len(batches[0]))
    mixed = elmo.mix(layers, mask)
    given = Elmo.of_layers(3, 2, do_layer_norm=True, dropout=0.0).mix(layers, mask)
    for a, b, c in zip(mixed, given, want["elmo_representations"], strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    with pytest.raises(ElmolabError, match="has no biLM"):
        Elmo.of_layers(3, 1)(ids)
    with pytest.raises(ElmolabError, match="layers has 2 layers on its first axis, the mix has 3"):
        elmo.mix(layers[:2])
    tuned = Elmo.from_bilm(loaded.bilm, 1, requires_grad=True)
    assert all(p.requires_grad for p in tuned.bilm.parameters())
    assert not any(p.requires_grad for p in loaded.bilm.parameters())


def test_bad_arguments(fixture_dir: Path) -> None:
    expect_error(lambda: make_elmo_k(fixture_dir, 0), None, None, "must be at least 1, got 0")
    expect_error(
        lambda: make_elmo(fixture_dir, scalar_mix_parameters=[0.0, 1.0]),
        fixture_dir / "options.json",
        None,
        "scalar_mix_parameters has 2 values, the model has 3 layers to mix",
    )
    expect_error(
        lambda: Elmo.of_layers(2, 1, scalar_mix_parameters=[0.0]),
        None,
        None,
        "scalar_mix_parameters has 1 values, the model has 2 layers to mix",
    )


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        (torch.zeros(2, 3, 50), "; got torch.float32 of shape (2, 3, 50)"),
        (torch.zeros(2, 3, dtype=torch.long), "; got shape (2, 3): word ids?"),
        (torch.zeros(2, 5, 48, dtype=torch.long), "; got shape (2, 5, 48)"),
        ([["EU", "rejects"]], "; got list, not a tensor"),
    ],
)
def test_ids_that_are_not_character_ids_say_what_was_given(
    fixture_dir: Path, given: object, problem: str
) -> None:
    expected = "Elmo expects integer character ids of shape (batch, timesteps, 50), as "
    expected += "batch_to_ids(sentences) makes them"
    expect_error(lambda: make_elmo(fixture_dir)(given), None, None, expected + problem)


def test_integer_ids_of_another_type_read_as_long(fixture_dir: Path) -> None:
    elmo = make_elmo(fixture_dir).eval()
    ids = batch_to_ids([["EU", "rejects", "German", "call"], ["Peter"]])
    torch.testing.assert_close(
        elmo(ids.int())["elmo_representations"][0], elmo(ids)["elmo_representations"][0]
    )


def make_elmo_k(fixture_dir: Path, k: int) -> Elmo:
    return Elmo(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5", k)


def test_options_and_weights_of_different_shapes(fixture_dir: Path, tmp_path: Path) -> None:
    options = json.loads((fixture_dir / "options.json").read_text())
    options["lstm"]["projection_dim"] = 8
    (tmp_path / "options.json").write_text(json.dumps(options))
    weights = fixture_dir / "lm_weights.hdf5"
    with pytest.raises(ElmolabError) as caught:
        Elmo(tmp_path / "options.json", weights, 1)
    message = str(caught.value)
    assert "\n" not in message
    assert re.fullmatch(
        rf"{re.escape(str(weights))}: dataset '[\w/]+' has shape \([\d, ]+\), "
        rf"{re.escape(str(tmp_path / 'options.json'))} imply \([\d, ]+\) "
        r"\(from 'lstm\.projection_dim' 8\)",
        message,
    ), message


def test_weights_missing_a_layer(fixture_dir: Path, tmp_path: Path) -> None:
    weights = tmp_path / "lm_weights.hdf5"
    shutil.copy(fixture_dir / "lm_weights.hdf5", weights)
    with h5py.File(weights, "a") as f:
        del f["RNN_1/RNN/MultiRNNCell/Cell1"]
    expect_error(
        lambda: Elmo(fixture_dir / "options.json", weights, 1),
        weights,
        None,
        "missing dataset 'RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/",
    )


@pytest.mark.parametrize(
    ("sentences", "problem"),
    [
        ([], "batch_to_ids: no sentences"),
        ([["a"], []], "batch_to_ids: sentence 1 is empty"),
        (["a b"], "sentence 0 is a string, not a list of tokens"),
        (
            [["ok"], ["fine", "é" * 25]],
            "sentence 1, token 1 ('" + "é" * 25 + "') has 50 UTF-8 bytes, more than the 48",
        ),
    ],
)
def test_batch_to_ids_bad_input(sentences: list, problem: str) -> None:
    expect_error(lambda: batch_to_ids(sentences), None, None, problem)


def test_batch_to_ids_truncates_on_request() -> None:
    """``truncate=True`` cuts as allennlp: the first 48 bytes."""
    long, cut = "x" * 60, "x" * 48
    torch.testing.assert_close(batch_to_ids([[long]], truncate=True), batch_to_ids([[cut]]))
