"""Probes: small classifiers on frozen biLM features, mixed by a :class:`FeatureMixer`.

A token probe classifies each token from its mixed feature ``x``. The pair probe (dependency
labels) classifies the relation of each word to its gold head from
``[x_dep; x_head; x_dep * x_head]``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from elmolab.models.scalar_mix import FeatureMixer

ProbeKind = Literal["linear", "mlp"]
RootVector = Literal["learned", "zeros"]


class LinearProbe(nn.Module):
    """``logits = x W^T + b``: the standard probe (Liu et al. 2019).

    ``forward``: ``(batch, input_dim)`` -> ``(batch, num_labels)``.
    """

    def __init__(self, input_dim: int, num_labels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(input_dim, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)  # (batch, num_labels)


class MLPProbe(nn.Module):
    """``logits = dropout(relu(x W_1^T + b_1)) W_2^T + b_2``: one hidden layer.

    ``forward``: ``(batch, input_dim)`` -> ``(batch, num_labels)``.

    Parameters
    ----------
    input_dim, num_labels : ``int``
    hidden_dim : ``int``, optional (default = ``256``)
        Width of the hidden layer.
    dropout : ``float``, optional (default = ``0.2``)
        Dropout on the hidden layer, in training only.
    """

    def __init__(
        self, input_dim: int, num_labels: int, hidden_dim: int = 256, dropout: float = 0.2
    ) -> None:
        super().__init__()
        self.hidden = nn.Linear(input_dim, hidden_dim)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(hidden_dim, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(torch.relu(self.hidden(x)))  # (batch, hidden_dim)
        return self.output(hidden)  # (batch, num_labels)


def build_classifier(
    kind: ProbeKind, input_dim: int, num_labels: int, hidden_dim: int = 256, dropout: float = 0.2
) -> LinearProbe | MLPProbe:
    """A ``"linear"`` or ``"mlp"`` probe (``hidden_dim`` and ``dropout`` are the MLP's)."""
    if kind == "linear":
        return LinearProbe(input_dim, num_labels)
    if kind == "mlp":
        return MLPProbe(input_dim, num_labels, hidden_dim, dropout)
    raise ValueError(f"unknown probe kind {kind!r} (expected 'linear' or 'mlp')")


class ArcPair(nn.Module):
    """``[x_dep; x_head; x_dep * x_head]``, the input of the dependency-label probe.

    The root has no token, so a word attached to it gets a stand-in head vector ``r``: a learned
    parameter initialised to zeros (``root="learned"``, the default), or fixed zeros
    (``root="zeros"``, then ``x_head`` and the product are 0 and the label must come from
    ``x_dep``, which suffices for ``root`` since only root attachments look like that).

    ``forward``: ``dep (batch, dim)``, ``head (batch, dim)`` (any value where ``is_root``),
    ``is_root (batch,)`` bool -> ``(batch, 3 * dim)``.
    """

    def __init__(self, dim: int, root: RootVector = "learned") -> None:
        super().__init__()
        if root not in ("learned", "zeros"):
            raise ValueError(f"unknown root vector {root!r} (expected 'learned' or 'zeros')")
        self.root = nn.Parameter(torch.zeros(dim), requires_grad=root == "learned")

    def forward(self, dep: torch.Tensor, head: torch.Tensor, is_root: torch.Tensor) -> torch.Tensor:
        head = torch.where(is_root[:, None], self.root.to(head.dtype), head)  # (batch, dim)
        return torch.cat([dep, head, dep * head], dim=-1)  # (batch, 3 * dim)


class ProbeModel(nn.Module):
    """A feature mixer followed by a classifier, for token tasks or (with ``arc_pair``) pairs.

    ``mix`` and ``classify`` are separate so that frozen mixes are computed once per dataset;
    ``forward`` chains them.

    Parameters
    ----------
    mixer : ``FeatureMixer``
        Layers ``(num_layers, ..., dim)`` -> mixed feature ``(..., mixed_dim)``.
    classifier : ``nn.Module``
        ``(batch, mixed_dim)`` (``3 * mixed_dim`` with ``arc_pair``) -> ``(batch, num_labels)``.
    arc_pair : ``ArcPair``, optional
        Makes this a pair probe: ``classify`` then needs the head features.
    """

    def __init__(
        self, mixer: FeatureMixer, classifier: nn.Module, arc_pair: ArcPair | None = None
    ) -> None:
        super().__init__()
        self.mixer = mixer
        self.classifier = classifier
        self.arc_pair = arc_pair

    def mix(self, layers: torch.Tensor) -> torch.Tensor:
        """``(num_layers, batch, dim)`` float -> ``(batch, mixed_dim)``."""
        return self.mixer(layers)

    def classify(
        self,
        mixed: torch.Tensor,
        head_mixed: torch.Tensor | None = None,
        is_root: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(batch, num_labels)`` from mixed features ``(batch, mixed_dim)``.

        A pair probe also takes the mixed features of each token's head ``(batch, mixed_dim)``
        and ``is_root`` ``(batch,)`` bool.
        """
        if self.arc_pair is None:
            return self.classifier(mixed)  # (batch, num_labels)
        if head_mixed is None or is_root is None:
            raise ValueError("a pair probe needs head_mixed and is_root")
        return self.classifier(self.arc_pair(mixed, head_mixed, is_root))  # (batch, num_labels)

    def forward(
        self,
        layers: torch.Tensor,
        head_layers: torch.Tensor | None = None,
        is_root: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(batch, num_labels)`` from layers ``(num_layers, batch, dim)`` (and the heads').

        Dependents and heads are mixed in one call, so a layer norm sees them as one batch.
        """
        if head_layers is None:
            return self.classify(self.mix(layers), None, is_root)
        both = torch.cat([layers, head_layers], dim=1)  # (num_layers, 2 * batch, dim)
        mixed, head_mixed = self.mix(both).chunk(2)  # (batch, mixed_dim) each
        return self.classify(mixed, head_mixed, is_root)
