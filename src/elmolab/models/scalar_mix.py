"""How the biLM's layers become one feature: the feature modes' (``io.results.FeatureMode``) scalar
mixes, concatenation.

Every feature mode but ``concat`` is a scalar mix ``gamma * sum_j s_j h_j`` of the layers ``h_j``
(ELMo, Peters et al. 2018, eq. 1): ``layer0/1/2`` with frozen one-hot weights ``s`` (a single layer,
bit for bit), ``mean`` with frozen uniform ones, ``scalar_mix`` with learned ``s = softmax(w)`` and
``gamma``; ``gamma`` is 1 where frozen. One code path thus serves single layers and mixes alike
(docs/architecture.md §5). :class:`HeadMix` holds the mixes of many probe heads side by side (the
probe engine trains them, ``elmolab.probing.engine``); :func:`mix_layers` applies a frozen mode
(WSD's 1-NN, which trains nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from elmolab.core.errors import ElmolabError
from elmolab.io.results import FeatureMode


def frozen_weights(mode: FeatureMode | str, num_layers: int) -> torch.Tensor:
    """The fixed weights ``s`` ``(num_layers,)`` of a frozen mode: one-hot for ``layer<k>``,
    uniform for ``mean``."""
    mode = FeatureMode.parse(mode)
    if mode is FeatureMode.MEAN:
        return torch.full((num_layers,), 1.0 / num_layers)
    if mode in (FeatureMode.SCALAR_MIX, FeatureMode.CONCAT):
        raise ValueError(f"feature mode {mode.value!r} has no fixed weights")
    layer = int(mode.value.removeprefix("layer"))
    if layer >= num_layers:
        raise ElmolabError(f"feature mode {mode.value!r} needs at least {layer + 1} layers")
    return F.one_hot(torch.tensor(layer), num_layers).float()


def mix_layers(layers: torch.Tensor, mode: FeatureMode | str) -> torch.Tensor:
    """A frozen mode's feature of ``layers`` ``(num_layers, ..., dim)``, the layer axis first as
    in feature files: ``(..., dim)`` for a scalar mix (one product over the layer axis; a one-hot
    mix is its layer exactly), ``(..., num_layers * dim)`` for ``concat``."""
    mode = FeatureMode.parse(mode)
    if mode is FeatureMode.CONCAT:
        return layers.movedim(0, -2).flatten(start_dim=-2)
    if mode is FeatureMode.SCALAR_MIX:
        raise ElmolabError("the learned scalar_mix exists only trained with a probe (HeadMix)")
    s = frozen_weights(mode, layers.shape[0]).to(layers.dtype)
    return torch.tensordot(s, layers, dims=1)


class HeadMix(nn.Module):
    """The scalar mixes of heads: ``gamma_h * sum_j s_hj h_j``, ``s_h = softmax(w_h)`` for a learned
    mix (``w = 0``, ``gamma = 1`` at the start), else fixed (one-hot for a layer, uniform for
    ``mean``; ``gamma`` 1). Frozen heads get no gradient.

    ``fixed`` (len(modes), num_layers), optional: the frozen heads' weights ``s`` in place of
    their modes' (e.g. allennlp's frozen mix, ``softmax`` of given scalar parameters); the rows
    of learned heads are ignored."""

    def __init__(
        self,
        modes: Sequence[FeatureMode],
        num_layers: int,
        l2_lambda: float,
        fixed: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if fixed is None:
            fixed = torch.zeros(len(modes), num_layers)
            for h, mode in enumerate(modes):
                if mode is not FeatureMode.SCALAR_MIX:
                    fixed[h] = frozen_weights(mode, num_layers)
        elif fixed.shape != (len(modes), num_layers):
            raise ValueError(f"fixed must be ({len(modes)}, {num_layers}), got {fixed.shape}")
        self.register_buffer("fixed", fixed.float().clone())
        self.register_buffer("learned", torch.tensor([m is FeatureMode.SCALAR_MIX for m in modes]))
        self.w = nn.Parameter(torch.zeros(len(modes), num_layers))
        self.gamma = nn.Parameter(torch.ones(len(modes)))
        self.l2_lambda = l2_lambda

    def weights(self, heads: torch.Tensor) -> torch.Tensor:
        """``gamma_h * s_h``: ``(h, num_layers)``."""
        learned = self.learned[heads, None]
        s = torch.where(learned, torch.softmax(self.w[heads], dim=-1), self.fixed[heads])
        gamma = torch.where(learned[:, 0], self.gamma[heads], torch.ones(()))
        return gamma[:, None] * s

    def coefficients(self, heads: torch.Tensor) -> torch.Tensor:
        """Each head's weights of the layers ``(h, num_layers)``: :meth:`weights`, with a graph
        behind them only where a head's mix is learned."""
        return self.weights(heads) if bool(self.learned[heads].any()) else self.fixed[heads]

    def penalty(self, heads: torch.Tensor) -> torch.Tensor:
        """``l2_lambda * |w_h|^2`` for learned mixes, else 0: ``(h,)``."""
        squares = (self.w[heads] ** 2).sum(dim=-1) * self.learned[heads]
        return self.l2_lambda * squares

    def forward(self, x: torch.Tensor, groups: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """``x``: ``(num_layers, G, *N, dim)``, minibatch ``g`` for heads of group ``g``;
        ``groups`` ``(h,)`` each head's minibatch -> ``(h, *N, dim)``.

        Every mix, fixed or learned, is one matrix product over the (layer, minibatch) pairs: a
        weight per head and pair, zero where the head does not read the minibatch (a one-hot mix
        reads its layer exactly, in float32 and in bf16)."""
        layers, group_count = x.shape[:2]
        s = self.coefficients(heads)  # (h, layers)
        select = F.one_hot(groups, group_count).to(s.dtype)  # (h, G)
        m = (s[:, :, None] * select[:, None, :]).reshape(len(heads), layers * group_count)
        return (m @ x.reshape(layers * group_count, -1)).view(len(heads), *x.shape[2:])

    def summary(self, head: int) -> tuple[list[float], float]:
        """The normalized weights and gamma of one head, as plain numbers."""
        with torch.no_grad():
            index = torch.tensor([head])
            learned = bool(self.learned[head])
            s = torch.softmax(self.w[index], -1) if learned else self.fixed[index]
            gamma = float(self.gamma[head]) if learned else 1.0
        return s[0].tolist(), gamma


def normalize_layers(
    x: torch.Tensor, mask: torch.Tensor | None, eps: float = 1e-12
) -> torch.Tensor:
    """ELMo's optional normalization before mixing: each layer of each minibatch normalized over
    all its unmasked elements (every position and dimension, one mean and variance, as allennlp
    does), so the statistics depend on the batch; float32. ``x`` ``(num_layers, G, *N, dim)``,
    ``mask`` ``(G, *N)`` bool (True at real tokens) or None (all real)."""
    axes = tuple(range(2, x.dim()))
    x = x.float()
    if mask is None:
        mean = x.mean(dim=axes, keepdim=True)
        centered = x - mean
        variance = (centered**2).mean(dim=axes, keepdim=True)
    else:
        keep = mask[None, ..., None].to(x.dtype)  # (1, G, *N, 1)
        count = keep.sum(dim=axes, keepdim=True) * x.shape[-1]
        mean = (x * keep).sum(dim=axes, keepdim=True) / count
        centered = x - mean
        variance = ((centered * keep) ** 2).sum(dim=axes, keepdim=True) / count
    return centered / torch.sqrt(variance + eps)
