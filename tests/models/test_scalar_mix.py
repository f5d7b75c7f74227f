"""The scalar mix (ScalarMix, frozen modes) and the layer norm against independent numpy
computations."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import default_probe_settings
from torch import nn

from elmolab.core.errors import ElmolabError
from elmolab.elmo import Elmo
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.scalar_mix import (
    FeatureMode,
    ScalarMix,
    frozen_weights,
    mix_layers,
    normalize_layers,
)
from elmolab.probing.engine import HeadProbes
from elmolab.probing.probes import Head, LayerInput
from elmolab.taskmodel.model import BiLstmCrfTagger, FineTunedLayers, TaggerShape
from tests.fixtures.workspace import FIXTURE_OPTIONS

MODES = [FeatureMode(mode) for mode in ("layer0", "layer1", "layer2", "mean", "scalar_mix")]


def _layers(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def _numpy_mix(layers: np.ndarray, w: np.ndarray, gamma: float) -> np.ndarray:
    s = np.exp(w) / np.exp(w).sum()
    return gamma * sum(s[j] * layers[j] for j in range(len(w)))


def _numpy_layer_norm(layers: np.ndarray, mask: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    normed = []
    for layer in layers.astype(np.float64):  # (..., dim)
        real = layer[mask]  # (real tokens, dim)
        mean, variance = real.mean(), real.var()
        normed.append((layer - mean) / np.sqrt(variance + eps))
    return np.stack(normed)


def _learned(w: list[float], gamma: float, l2_lambda: float = 0.0) -> ScalarMix:
    """One head with a learned mix, set to ``w`` and ``gamma``."""
    mix = ScalarMix.of_modes([FeatureMode.SCALAR_MIX], 3, l2_lambda)
    with torch.no_grad():
        mix.w.copy_(torch.tensor([w]))
        mix.gamma.fill_(gamma)
    return mix


def _mix(mix: ScalarMix, layers: torch.Tensor) -> torch.Tensor:
    """Every head of ``mix`` on ``layers`` ``(num_layers, *N, dim)`` -> ``(heads, *N, dim)``."""
    heads = torch.arange(len(mix.learned))
    return mix(layers[:, None], torch.zeros_like(heads), heads)


def test_a_learned_mix_starts_as_the_uniform_average() -> None:
    layers = _layers(3, 5, 4)
    mix = ScalarMix.of_modes([FeatureMode.SCALAR_MIX], 3)
    assert mix.summary(0) == (pytest.approx([1 / 3] * 3), 1.0)
    np.testing.assert_allclose(_mix(mix, layers)[0].detach(), layers.mean(0), atol=1e-6)


def test_learned_mix_matches_numpy_on_padded_batches() -> None:
    layers = _layers(3, 2, 6, 4)  # (layers, batch, time, dim)
    mix = _learned([0.3, -1.2, 2.0], 1.7)
    expected = _numpy_mix(layers.numpy().astype(np.float64), np.array([0.3, -1.2, 2.0]), 1.7)
    np.testing.assert_allclose(_mix(mix, layers)[0].detach(), expected, rtol=1e-5, atol=1e-6)


def test_each_head_reads_its_own_minibatch() -> None:
    layers = _layers(3, 2, 5, 4)  # (layers, G, N, dim): a minibatch per group
    mix = ScalarMix.of_modes(MODES, 3)
    groups = torch.tensor([1, 0, 1, 0, 1])
    mixed = mix(layers, groups, torch.arange(5)).detach()  # (heads, N, dim)
    for h in range(3):  # layer h of head h's minibatch
        assert torch.equal(mixed[h], layers[h, groups[h]])
    np.testing.assert_allclose(mixed[3], layers[:, 0].mean(0), atol=1e-6)
    np.testing.assert_allclose(mixed[4], layers[:, 1].mean(0), atol=1e-6)


def test_layer_norm_with_mask_matches_numpy() -> None:
    layers = 3.0 + 2.0 * _layers(3, 2, 5, 4)  # (layers, batch, time, dim)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    layers[:, 1, 2:] = 100.0  # padding must not move the statistics
    # The statistics are per layer and minibatch: here the whole batch is one minibatch.
    normed = normalize_layers(layers[:, None], mask[None])[:, 0]
    expected = _numpy_layer_norm(layers.numpy(), mask.numpy())
    np.testing.assert_allclose(normed[:, mask], expected[:, mask.numpy()], rtol=1e-5, atol=1e-5)


def test_layer_norm_without_mask_uses_every_position() -> None:
    layers = _layers(3, 7, 4)  # (layers, tokens, dim)
    normed = normalize_layers(layers[:, None], None)[:, 0]
    expected = _numpy_layer_norm(layers.numpy(), np.ones(7, dtype=bool))
    np.testing.assert_allclose(normed, expected, rtol=1e-5, atol=1e-5)


def test_gradients_reach_w_and_gamma_and_match_numpy() -> None:
    layers = _layers(3, 6, 4)
    upstream = _layers(6, 4, seed=1)
    w, gamma = np.array([0.2, -0.4, 1.0]), 1.3
    mix = _learned(w.tolist(), gamma)
    (_mix(mix, layers)[0] * upstream).sum().backward()
    # d/dw_k sum(g * mix) = gamma * s_k * (a_k - sum_j s_j a_j) with a_j = sum(g * h_j)
    s = np.exp(w) / np.exp(w).sum()
    a = (layers.numpy().astype(np.float64) * upstream.numpy()).sum(axis=(1, 2))
    assert mix.w.grad is not None and mix.gamma.grad is not None
    np.testing.assert_allclose(mix.w.grad[0].numpy(), gamma * s * (a - s @ a), rtol=1e-4)
    np.testing.assert_allclose(float(mix.gamma.grad[0]), s @ a, rtol=1e-4)


def test_frozen_heads_get_no_gradient() -> None:
    mix = ScalarMix.of_modes(MODES[:4], 3, 0.5)
    assert not _mix(mix, _layers(3, 6, 4)).requires_grad
    assert mix.penalty(torch.arange(4)).tolist() == [0.0] * 4


def test_frozen_one_hot_mix_is_exactly_the_layer() -> None:
    layers = _layers(3, 9, 8) * 1e3
    mix = ScalarMix.of_modes(MODES[:3], 3)
    mixed = _mix(mix, layers)
    for j, mode in enumerate(MODES[:3]):
        assert torch.equal(mix_layers(layers, mode), layers[j])
        assert torch.equal(mixed[j], layers[j])
        assert frozen_weights(mode, 3).tolist() == [float(i == j) for i in range(3)]
        assert mix.summary(j) == ([float(i == j) for i in range(3)], 1.0)


def test_mean_mode_is_frozen_uniform() -> None:
    layers = _layers(3, 4, 5)
    np.testing.assert_allclose(
        mix_layers(layers, FeatureMode.MEAN), layers.numpy().mean(0), atol=1e-6
    )
    assert frozen_weights(FeatureMode.MEAN, 4).tolist() == [0.25] * 4


def test_penalty_is_l2_on_w_of_learned_mixes() -> None:
    mix = _learned([1.0, -2.0, 0.5], 1.0, l2_lambda=0.1)
    assert mix.penalty(torch.tensor([0])).item() == pytest.approx(0.1 * (1 + 4 + 0.25))


def test_concat_stacks_layers_side_by_side() -> None:
    layers = _layers(3, 2, 5, 4)
    expected = np.concatenate(list(layers.numpy()), axis=-1)  # (batch, time, 3 * dim)
    assert np.array_equal(mix_layers(layers, FeatureMode.CONCAT).numpy(), expected)


def test_bad_modes_are_rejected() -> None:
    with pytest.raises(ElmolabError, match="unknown feature mode 'layer3'"):
        FeatureMode.parse("layer3")
    with pytest.raises(ElmolabError, match="needs at least 3 layers"):
        mix_layers(_layers(2, 4, 5), FeatureMode.LAYER2)
    with pytest.raises(ElmolabError, match="needs at least 3 layers"):
        ScalarMix.of_modes([FeatureMode.LAYER2], 2)
    with pytest.raises(ElmolabError, match="only trained with a probe"):
        mix_layers(_layers(3, 4, 5), FeatureMode.SCALAR_MIX)
    with pytest.raises(ValueError, match="no fixed weights"):
        frozen_weights(FeatureMode.CONCAT, 3)


def test_one_minibatch_without_groups_is_the_grouped_mix_bit_for_bit() -> None:
    """Every head reading ``x`` itself (no minibatch axis) is the grouped path with one
    minibatch, values and gradients alike; one head is ``tensordot`` of its weights."""
    layers = _layers(3, 2, 6, 4)
    mixes = [ScalarMix.of_modes(MODES, 3) for _ in range(2)]
    for mix in mixes:
        with torch.no_grad():
            mix.w.copy_(_layers(5, 3, seed=2))
            mix.gamma.fill_(1.3)
    heads = torch.arange(len(MODES))
    plain, grouped = mixes[0](layers), mixes[1](layers[:, None], torch.zeros_like(heads), heads)
    assert torch.equal(plain, grouped)
    (plain * layers[0]).sum().backward()
    (grouped * layers[0]).sum().backward()
    assert torch.equal(mixes[0].w.grad, mixes[1].w.grad)
    assert torch.equal(mixes[0].gamma.grad, mixes[1].gamma.grad)
    one = _learned([0.2, -1.0, 0.7], 1.7)
    expected = torch.tensordot(one.weights(torch.tensor([0]))[0], layers, dims=1)
    assert torch.equal(one(layers)[0], expected)


def test_the_layer_norm_is_normalize_layers_before_mixing() -> None:
    layers = _layers(3, 2, 6, 4)
    mask = torch.arange(6)[None, :] < torch.tensor([[6], [2]])  # (batch, time)
    normed = ScalarMix(3, heads=2, layer_norm=True, eps=1e-13)
    plain = ScalarMix(3, heads=2)
    expected = plain(normalize_layers(layers[:, None], mask[None], eps=1e-13)[:, 0])
    assert torch.equal(normed(layers, mask=mask), expected)


def test_fixed_weights_and_bad_arguments() -> None:
    layers = _layers(3, 4, 5)
    fixed = torch.tensor([0.5, 0.0, 0.5])
    mix = ScalarMix(3, heads=2, learned=[False, True], fixed=fixed)
    assert torch.equal(mix(layers)[0], torch.tensordot(fixed, layers, dims=1))
    assert mix.summary(0) == ([0.5, 0.0, 0.5], 1.0)
    assert mix.summary(1) == (pytest.approx([1 / 3] * 3), 1.0)
    with pytest.raises(ValueError, match="learned has 1 values for 2 heads"):
        ScalarMix(3, heads=2, learned=[True])
    with pytest.raises(ValueError, match="a frozen head needs its fixed weights"):
        ScalarMix(3, learned=False)
    with pytest.raises(ValueError, match=r"fixed must be \(2, 3\), got \(2,\)"):
        ScalarMix(3, heads=2, learned=False, fixed=torch.ones(2))
    with pytest.raises(ValueError, match="no fixed weights"):
        ScalarMix.of_modes([FeatureMode.CONCAT], 3)


def test_every_mix_is_the_one_scalar_mix() -> None:
    """The probe reference, the probe engine, Elmo and the task model (frozen and fine-tuned)
    mix with ``ScalarMix``, and the package defines no other mix module."""
    heads = [Head(FeatureMode.MEAN, 1), Head(FeatureMode.SCALAR_MIX, 1)]
    engine = HeadProbes(heads, 3, 4, default_probe_settings(), lambda _, width: nn.Identity())
    bilm = BiLM(BiLMOptions.from_json(FIXTURE_OPTIONS))
    shape = TaggerShape(3, 4, 1, 0, 3, 4, 8, 1, 0.0, 0.0)
    tuned = FineTunedLayers.of(bilm, torch.zeros(3, 4), torch.ones(3, 4))
    mixes = [
        LayerInput(FeatureMode.SCALAR_MIX, 3, 4).mix,
        *(part.mix for part in engine.parts),
        Elmo.from_bilm(bilm, 2).scalar_mix,
        Elmo.of_layers(3, 1).scalar_mix,
        BiLstmCrfTagger(shape).elmo.scalar_mix,
        BiLstmCrfTagger(shape, tuned).elmo.scalar_mix,
    ]
    assert len(mixes) == 7 and all(type(mix) is ScalarMix for mix in mixes)
    package = Path(__file__).parents[2] / "src" / "elmolab"
    modules = re.compile(r"^class (\w*Mix\w*)\((?:nn\.)?Module\)", re.MULTILINE)
    found = [m for path in package.rglob("*.py") for m in modules.findall(path.read_text())]
    assert found == ["ScalarMix"]
