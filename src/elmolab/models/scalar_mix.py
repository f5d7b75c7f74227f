"""How the biLM's layers become one feature: a scalar mix (learned or frozen) or a concatenation.

Every probing feature mode but ``concat`` is a :class:`ScalarMix`: ``layer0/1/2`` freeze one-hot
weights, ``mean`` freezes uniform weights, ``scalar_mix`` learns them. One code path thus serves
single layers and mixes alike (docs/architecture.md §5).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import torch
from torch import nn

from elmolab.errors import ElmolabError


class ScalarMix(nn.Module):
    """``mix = gamma * sum_j s_j * h_j`` with ``s = softmax(w)``, over layers ``h_0 .. h_{L-1}``.

    ``w`` is initialised to 0 (uniform weights) and ``gamma`` to 1, as in ELMo (Peters et al. 2018,
    eq. 1). With ``trainable=False`` neither is learned: the normalized weights ``s`` are stored as
    given (no softmax, so a one-hot ``s`` reproduces its layer bit for bit) and ``gamma`` stays 1.

    With ``layer_norm`` each layer is first normalized over all its unmasked elements (every
    position and dimension of the batch, one mean and variance per layer, as allennlp does):
    ``h_j <- (h_j - mean_j) / sqrt(var_j + eps)``. The statistics then depend on the batch.

    ``regularization()`` is the L2 penalty ``l2_lambda * sum_j w_j^2`` to add to the loss.

    Parameters
    ----------
    num_layers : ``int``
        L, the number of layers mixed.
    trainable : ``bool``, optional (default = ``True``)
        Learn ``w`` and ``gamma``. If ``False`` the weights are frozen to ``fixed_weights``.
    fixed_weights : ``Sequence[float]``, optional (default = uniform ``1 / L``)
        The frozen normalized weights ``s`` (non-negative, summing to 1); only when not trainable.
    layer_norm : ``bool``, optional (default = ``False``)
        Normalize each layer before mixing (pass the mask of padded batches to ``forward``).
    l2_lambda : ``float``, optional (default = ``0.0``)
        Strength of the L2 penalty on ``w`` returned by ``regularization()``.
    eps : ``float``, optional (default = ``1e-12``)
        Added to the variance in the layer norm.
    """

    def __init__(
        self,
        num_layers: int,
        *,
        trainable: bool = True,
        fixed_weights: Sequence[float] | None = None,
        layer_norm: bool = False,
        l2_lambda: float = 0.0,
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.trainable = trainable
        self.layer_norm = layer_norm
        self.l2_lambda = l2_lambda
        self.eps = eps
        self.w: nn.Parameter | None = None
        if trainable:
            if fixed_weights is not None:
                raise ValueError("fixed_weights is only meaningful with trainable=False")
            self.w = nn.Parameter(torch.zeros(num_layers))
            self.gamma = nn.Parameter(torch.ones(()))
        else:
            weights = (
                torch.full((num_layers,), 1.0 / num_layers)
                if fixed_weights is None
                else torch.tensor(fixed_weights, dtype=torch.float32)
            )
            if weights.shape != (num_layers,):
                raise ValueError(f"{num_layers} layers but {weights.numel()} fixed weights")
            if bool((weights < 0).any()) or abs(float(weights.sum()) - 1.0) > 1e-6:
                raise ValueError(f"fixed weights must be >= 0 and sum to 1, got {weights.tolist()}")
            self.register_buffer("fixed_weights", weights)
            self.register_buffer("gamma", torch.ones(()))

    def normalized_weights(self) -> torch.Tensor:
        """``s``: ``softmax(w)`` when trainable, else the frozen weights; ``(num_layers,)``."""
        if self.w is not None:
            return torch.softmax(self.w, dim=0)
        return self.fixed_weights

    def weights(self) -> list[float]:
        """``s`` as plain numbers, for logging."""
        return self.normalized_weights().tolist()

    def gamma_value(self) -> float:
        """``gamma`` as a plain number, for logging."""
        return self.gamma.item()

    def regularization(self) -> torch.Tensor:
        """``l2_lambda * sum_j w_j^2`` (0 when frozen): add it to the training loss."""
        if self.w is None or self.l2_lambda == 0.0:
            return torch.zeros(())
        return self.l2_lambda * (self.w**2).sum()

    def output_dim(self, input_dim: int) -> int:
        """The mix has the dimension of one layer."""
        return input_dim

    @property
    def precomputable(self) -> bool:
        """True when each token's output is fixed (nothing learned, no batch statistics)."""
        return not self.trainable and not self.layer_norm

    def forward(self, layers: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mix the layers.

        Parameters
        ----------
        layers : ``torch.Tensor``
            ``(num_layers, ..., dim)``, the layer axis first as in feature files, e.g.
            ``(3, tokens, dim)`` or ``(3, batch, time, dim)``.
        mask : ``torch.Tensor``, optional
            ``(...)`` bool, True at real tokens; only the layer norm reads it (default: all real).
            Outputs at masked positions are computed but meaningless.

        Returns
        -------
        ``torch.Tensor``
            ``(..., dim)``.
        """
        if layers.shape[0] != self.num_layers:
            raise ValueError(
                f"expected {self.num_layers} layers on axis 0, got shape {tuple(layers.shape)}"
            )
        if self.layer_norm:
            layers = self._normalize_layers(layers, mask)  # (num_layers, ..., dim)
        s = self.normalized_weights().to(layers.dtype)  # (num_layers,)
        # One matrix-vector product over the contiguous layer axis: a single pass over the
        # layers forward and backward.
        return self.gamma * torch.tensordot(s, layers, dims=1)  # (..., dim)

    def _normalize_layers(self, layers: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        other_axes = tuple(range(1, layers.dim()))
        if mask is None:
            mean = layers.mean(dim=other_axes, keepdim=True)  # (num_layers, 1, .., 1)
            centered = layers - mean  # (num_layers, ..., dim)
            variance = (centered**2).mean(dim=other_axes, keepdim=True)  # (num_layers, 1, .., 1)
        else:
            keep = mask[None, ..., None].to(layers.dtype)  # (1, ..., 1)
            count = keep.sum() * layers.shape[-1]
            mean = (layers * keep).sum(dim=other_axes, keepdim=True) / count
            centered = layers - mean  # (num_layers, ..., dim)
            variance = ((centered * keep) ** 2).sum(dim=other_axes, keepdim=True) / count
        return centered / torch.sqrt(variance + self.eps)  # (num_layers, ..., dim)


class LayerConcat(nn.Module):
    """``[h_0; h_1; ..; h_{L-1}]``: the layers side by side, ``L * dim`` wide; nothing learned."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.num_layers = num_layers

    def regularization(self) -> torch.Tensor:
        """Nothing to regularize: 0."""
        return torch.zeros(())

    def output_dim(self, input_dim: int) -> int:
        """``num_layers * input_dim``."""
        return self.num_layers * input_dim

    @property
    def precomputable(self) -> bool:
        """Always: each token's output is its own layers."""
        return True

    def forward(self, layers: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(num_layers, ..., dim)`` -> ``(..., num_layers * dim)``; ``mask`` is not needed."""
        return layers.movedim(0, -2).flatten(start_dim=-2)  # (..., num_layers * dim)


FeatureMixer = ScalarMix | LayerConcat


class FeatureMode(StrEnum):
    """The probing feature modes (docs/architecture.md §5); ``layer0`` is the char CNN's output."""

    LAYER0 = "layer0"
    LAYER1 = "layer1"
    LAYER2 = "layer2"
    MEAN = "mean"  # frozen uniform weights
    SCALAR_MIX = "scalar_mix"  # learned weights and gamma
    CONCAT = "concat"  # the three layers side by side

    @classmethod
    def parse(cls, name: str) -> FeatureMode:
        """The mode called ``name``; an ElmolabError lists the valid names otherwise."""
        try:
            return cls(name)
        except ValueError:
            valid = ", ".join(mode.value for mode in cls)
            raise ElmolabError(f"unknown feature mode {name!r} (expected one of {valid})") from None


def build_feature_mixer(
    mode: FeatureMode | str,
    num_layers: int = 3,
    *,
    layer_norm: bool = False,
    l2_lambda: float = 0.0,
) -> FeatureMixer:
    """The module that turns ``(num_layers, ..., dim)`` features into a probe's input for ``mode``.

    ``layer_norm`` applies to every scalar-mix mode (a single layer then gets normalized too);
    ``l2_lambda`` only matters for the learned ``scalar_mix``.
    """
    mode = FeatureMode.parse(mode)
    if mode is FeatureMode.CONCAT:
        return LayerConcat(num_layers)
    if mode is FeatureMode.SCALAR_MIX:
        return ScalarMix(num_layers, layer_norm=layer_norm, l2_lambda=l2_lambda)
    if mode is FeatureMode.MEAN:
        return ScalarMix(num_layers, trainable=False, layer_norm=layer_norm)
    layer = int(mode.value.removeprefix("layer"))
    if layer >= num_layers:
        raise ElmolabError(f"feature mode {mode.value!r} needs at least {layer + 1} layers")
    one_hot = [1.0 if j == layer else 0.0 for j in range(num_layers)]
    return ScalarMix(num_layers, trainable=False, fixed_weights=one_hot, layer_norm=layer_norm)
