"""ScalarMix and the feature modes against independent numpy computations."""

import numpy as np
import pytest
import torch

from elmolab.errors import ElmolabError
from elmolab.models.scalar_mix import (
    FeatureMode,
    LayerConcat,
    ScalarMix,
    build_feature_mixer,
)


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


def _set(mix: ScalarMix, w: list[float], gamma: float) -> None:
    assert mix.w is not None
    with torch.no_grad():
        mix.w.copy_(torch.tensor(w))
        mix.gamma.fill_(gamma)


def test_initial_mix_is_the_uniform_average() -> None:
    layers = _layers(3, 5, 4)
    mix = ScalarMix(3)
    assert mix.weights() == pytest.approx([1 / 3] * 3)
    assert mix.gamma_value() == 1.0
    np.testing.assert_allclose(mix(layers).detach().numpy(), layers.numpy().mean(0), atol=1e-6)


def test_mix_matches_numpy_on_padded_batches() -> None:
    layers = _layers(3, 2, 6, 4)  # (layers, batch, time, dim)
    mix = ScalarMix(3)
    _set(mix, [0.3, -1.2, 2.0], 1.7)
    expected = _numpy_mix(layers.numpy().astype(np.float64), np.array([0.3, -1.2, 2.0]), 1.7)
    np.testing.assert_allclose(mix(layers).detach().numpy(), expected, rtol=1e-5, atol=1e-6)


def test_layer_norm_with_mask_matches_numpy() -> None:
    layers = 3.0 + 2.0 * _layers(3, 2, 5, 4)  # (layers, batch, time, dim)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    layers[:, 1, 2:] = 100.0  # padding must not move the statistics
    mix = ScalarMix(3, layer_norm=True)
    _set(mix, [0.5, 0.0, -0.5], 0.8)
    normed = _numpy_layer_norm(layers.numpy(), mask.numpy())
    expected = _numpy_mix(normed, np.array([0.5, 0.0, -0.5]), 0.8)
    got = mix(layers, mask).detach().numpy()
    np.testing.assert_allclose(got[mask.numpy()], expected[mask.numpy()], rtol=1e-5, atol=1e-5)


def test_layer_norm_without_mask_uses_every_position() -> None:
    layers = _layers(3, 7, 4)  # (layers, tokens, dim)
    mix = ScalarMix(3, trainable=False, layer_norm=True)
    normed = _numpy_layer_norm(layers.numpy(), np.ones(7, dtype=bool))
    np.testing.assert_allclose(mix(layers).numpy(), normed.mean(0), rtol=1e-5, atol=1e-5)


def test_gradients_reach_w_and_gamma_and_match_numpy() -> None:
    layers = _layers(3, 6, 4)
    upstream = _layers(6, 4, seed=1)
    w, gamma = np.array([0.2, -0.4, 1.0]), 1.3
    mix = ScalarMix(3)
    _set(mix, w.tolist(), gamma)
    (mix(layers) * upstream).sum().backward()
    # d/dw_k sum(g * mix) = gamma * s_k * (a_k - sum_j s_j a_j) with a_j = sum(g * h_j)
    s = np.exp(w) / np.exp(w).sum()
    a = (layers.numpy().astype(np.float64) * upstream.numpy()).sum(axis=(1, 2))
    assert mix.w is not None and mix.w.grad is not None and mix.gamma.grad is not None
    np.testing.assert_allclose(mix.w.grad.numpy(), gamma * s * (a - s @ a), rtol=1e-4)
    np.testing.assert_allclose(float(mix.gamma.grad), s @ a, rtol=1e-4)


def test_frozen_one_hot_mix_is_exactly_the_layer() -> None:
    layers = _layers(3, 9, 8) * 1e3
    for j, mode in enumerate(("layer0", "layer1", "layer2")):
        mixer = build_feature_mixer(mode)
        assert isinstance(mixer, ScalarMix)
        assert not list(mixer.parameters())
        assert torch.equal(mixer(layers), layers[j])
        assert mixer.weights() == [float(i == j) for i in range(3)]


def test_mean_mode_is_frozen_uniform() -> None:
    layers = _layers(3, 4, 5)
    mixer = build_feature_mixer("mean")
    assert isinstance(mixer, ScalarMix) and mixer.precomputable
    np.testing.assert_allclose(mixer(layers).numpy(), layers.numpy().mean(0), atol=1e-6)


def test_regularization_is_l2_on_w_and_zero_when_frozen() -> None:
    mix = ScalarMix(3, l2_lambda=0.1)
    _set(mix, [1.0, -2.0, 0.5], 1.0)
    assert mix.regularization().item() == pytest.approx(0.1 * (1 + 4 + 0.25))
    assert float(ScalarMix(3, trainable=False).regularization()) == 0.0


def test_concat_stacks_layers_side_by_side() -> None:
    layers = _layers(3, 2, 5, 4)
    concat = build_feature_mixer("concat")
    assert isinstance(concat, LayerConcat) and concat.output_dim(4) == 12
    expected = np.concatenate(list(layers.numpy()), axis=-1)  # (batch, time, 3 * dim)
    assert np.array_equal(concat(layers).numpy(), expected)


def test_only_the_learned_mode_trains() -> None:
    learned = build_feature_mixer(FeatureMode.SCALAR_MIX, l2_lambda=0.01)
    assert sum(p.numel() for p in learned.parameters()) == 4  # w and gamma
    assert not learned.precomputable
    assert not build_feature_mixer("layer1", layer_norm=True).precomputable


def test_bad_modes_and_weights_are_rejected() -> None:
    with pytest.raises(ElmolabError, match="unknown feature mode 'layer3'"):
        FeatureMode.parse("layer3")
    with pytest.raises(ElmolabError, match="needs at least 3 layers"):
        build_feature_mixer("layer2", num_layers=2)
    with pytest.raises(ValueError, match="sum to 1"):
        ScalarMix(3, trainable=False, fixed_weights=[0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="only meaningful"):
        ScalarMix(3, fixed_weights=[1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="expected 3 layers on axis 0"):
        ScalarMix(3)(_layers(2, 4, 5))
