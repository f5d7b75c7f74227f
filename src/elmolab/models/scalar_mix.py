"""How the biLM's layers become one feature: the feature modes' (``io.results.FeatureMode``) scalar
mixes, concatenation.

Every feature mode but ``concat`` is a scalar mix ``gamma * sum_j s_j h_j`` of the layers ``h_j``
(ELMo, Peters et al. 2018, eq. 1): ``layer0/1/2`` with frozen one-hot weights ``s`` (a single layer,
bit for bit), ``mean`` with frozen uniform ones, ``scalar_mix`` with learned ``s = softmax(w)`` and
``gamma``; ``gamma`` is 1 where frozen. One code path thus serves single layers and mixes alike
(docs/architecture.md §5). :class:`ScalarMix` is the one mix module: a probe's input (one head,
``elmolab.probing.probes``), the probe engine's heads side by side, each reading its minibatch
(``elmolab.probing.engine``), and ``elmolab.Elmo``'s representations; :func:`mix_layers` applies a
frozen mode (WSD's 1-NN, which trains nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from elmolab.core.errors import ElmolabError
from elmolab.io.results import FeatureMode


def frozen_weights(mode: FeatureMode, num_layers: int) -> torch.Tensor:
    """The fixed weights ``s`` ``(num_layers,)`` of a frozen mode: one-hot for ``layer<k>``,
    uniform for ``mean``."""
    if mode is FeatureMode.MEAN:
        return torch.full((num_layers,), 1.0 / num_layers)
    if mode in (FeatureMode.SCALAR_MIX, FeatureMode.CONCAT):
        raise ValueError(f"feature mode {mode.value!r} has no fixed weights")
    layer = int(mode.value.removeprefix("layer"))
    if layer >= num_layers:
        raise ElmolabError(f"feature mode {mode.value!r} needs at least {layer + 1} layers")
    return F.one_hot(torch.tensor(layer), num_layers).float()


def mix_layers(layers: torch.Tensor, mode: FeatureMode) -> torch.Tensor:
    """A frozen mode's feature of ``layers`` ``(num_layers, ..., dim)``, the layer axis first as
    in feature files: ``(..., dim)`` for a scalar mix (one product over the layer axis; a one-hot
    mix is its layer exactly), ``(..., num_layers * dim)`` for ``concat``."""
    if mode is FeatureMode.CONCAT:
        return layers.movedim(0, -2).flatten(start_dim=-2)
    if mode is FeatureMode.SCALAR_MIX:
        raise ElmolabError("the learned scalar_mix exists only trained with a probe (ScalarMix)")
    s = frozen_weights(mode, layers.shape[0]).to(layers.dtype)
    return torch.tensordot(s, layers, dims=1)


class ScalarMix(nn.Module):
    """``heads`` scalar mixes of the same layers side by side (ELMo, Peters et al. 2018, eq. 1)::

        mix_h = gamma_h * sum_j s_hj * norm(h_j)

    ``s_h = softmax(w_h)`` and ``gamma_h`` learned (``w_h = 0``, ``gamma_h = 1`` at the start), or
    ``s_h`` fixed with ``gamma_h`` 1 and no gradient. ``norm`` is the identity, or with
    ``layer_norm`` :func:`normalize_layers` (each layer over the batch's unmasked elements).

    Parameters
    ----------
    num_layers : int
        The layers ``h_j`` mixed.
    heads : int, default 1
        How many mixes.
    learned : bool or sequence of bool, default True
        Whether each head's mix is learned (one value: every head's).
    fixed : Tensor, optional
        The frozen heads' weights ``s``: ``(heads, num_layers)``, or ``(num_layers,)`` for every
        head; needed where a head is frozen, ignored for learned heads.
    l2_lambda : float, default 0
        :meth:`penalty` is ``l2_lambda * |w_h|^2`` for each learned head, 0 for a frozen one.
    layer_norm : bool, default False
        Normalize the layers before mixing, with ``eps`` added to the variance.

    :meth:`of_modes` builds the mixes of feature modes (a probe's heads).
    """

    def __init__(
        self,
        num_layers: int,
        heads: int = 1,
        *,
        learned: bool | Sequence[bool] = True,
        fixed: torch.Tensor | None = None,
        l2_lambda: float = 0.0,
        layer_norm: bool = False,
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        flags = [learned] * heads if isinstance(learned, bool) else list(learned)
        if len(flags) != heads:
            raise ValueError(f"learned has {len(flags)} values for {heads} heads")
        if fixed is None:
            if not all(flags):
                raise ValueError("a frozen head needs its fixed weights")
            fixed = torch.zeros(heads, num_layers)
        elif fixed.shape == (num_layers,):
            fixed = fixed.expand(heads, num_layers)
        elif fixed.shape != (heads, num_layers):
            raise ValueError(f"fixed must be ({heads}, {num_layers}), got {tuple(fixed.shape)}")
        self.register_buffer("fixed", fixed.float().clone())
        self.register_buffer("learned", torch.tensor(flags))
        self.w = nn.Parameter(torch.zeros(heads, num_layers))
        self.gamma = nn.Parameter(torch.ones(heads))
        self.l2_lambda = l2_lambda
        self.layer_norm = layer_norm
        self.eps = eps

    @classmethod
    def of_modes(
        cls, modes: Sequence[FeatureMode], num_layers: int, l2_lambda: float = 0.0
    ) -> ScalarMix:
        """A head per feature mode: ``scalar_mix`` learned, the others frozen at
        :func:`frozen_weights` (``concat`` is no mix: a ValueError)."""
        fixed = torch.zeros(len(modes), num_layers)
        for h, mode in enumerate(modes):
            if mode is not FeatureMode.SCALAR_MIX:
                fixed[h] = frozen_weights(mode, num_layers)
        learned = [mode is FeatureMode.SCALAR_MIX for mode in modes]
        return cls(num_layers, len(modes), learned=learned, fixed=fixed, l2_lambda=l2_lambda)

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

    def penalty(self, heads: torch.Tensor | None = None) -> torch.Tensor:
        """``l2_lambda * |w_h|^2`` for learned mixes, else 0: ``(h,)``, every head by default."""
        heads = self._every_head() if heads is None else heads
        squares = (self.w[heads] ** 2).sum(dim=-1) * self.learned[heads]
        return self.l2_lambda * squares

    def forward(
        self,
        x: torch.Tensor,
        groups: torch.Tensor | None = None,
        heads: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Without ``groups``: every head (or those of ``heads`` ``(h,)``) mixes ``x``
        ``(num_layers, *N, dim)``, ``mask`` ``(*N,)`` True at real positions (the layer norm's
        statistics; None: all real) -> ``(h, *N, dim)``.

        With ``groups`` ``(h,)``, several minibatches side by side (a probe engine's heads):
        ``x`` ``(num_layers, G, *N, dim)``, head ``heads[i]`` mixes minibatch ``groups[i]``,
        ``mask`` ``(G, *N)``.

        A mix is one matrix product over the layers (and minibatches, a weight per head and
        (layer, minibatch) pair, zero where the head does not read the minibatch), so a one-hot
        mix reads its layer exactly, in float32 and in bf16."""
        heads = self._every_head() if heads is None else heads
        if groups is None:
            x = x[:, None]  # (num_layers, 1, *N, dim): one minibatch
            mask = None if mask is None else mask[None]
        if self.layer_norm:
            x = normalize_layers(x, mask, self.eps)
        s = self.coefficients(heads)  # (h, layers)
        if groups is None:
            return (s @ x.reshape(x.shape[0], -1)).view(len(heads), *x.shape[2:])
        layers, group_count = x.shape[:2]
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

    def _every_head(self) -> torch.Tensor:
        return torch.arange(len(self.gamma), device=self.gamma.device)


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
