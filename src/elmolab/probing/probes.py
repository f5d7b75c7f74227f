"""What every probe is, and the one loop that trains one: read this first.

A probe reads the frozen layers ``h_0 .. h_{L-1}`` of the biLM (layer 0 the char CNN's token
vector, then one per LSTM layer), turns them into one input (:class:`LayerInput`: a single layer,
their mean, a learned scalar mix ``gamma * sum_j softmax(w)_j h_j``, the layers side by side, or
layer 0 beside a mix) and maps that input to what its task predicts (a :class:`Probe`, one plain
module per kind, with its data, in ``elmolab.probing.kinds``):

- token: a label per token (UPOS, chunks, NER), a linear map or an MLP (:class:`Classifier`);
- sentence: a label per sentence (sentiment), the token probe on each layer mean-pooled over the
  sentence's tokens (pooling and mixing are both linear, so pooling first is mixing first);
- pair: the label of each word's arc to its gold head (dependency labels), the token probe on
  ``[dep; head; dep * head]``, a root vector standing for the head of the root word;
- arc: each word's head among the root and the sentence's words, a bilinear score;
- structural: Hewitt and Manning's distance probe, ``|B (m_i - m_j)|^2`` fitting the words'
  distances in the tree.

:func:`fit` trains one probe with Adam and one early-stopping rule (:class:`Stopping`), and leaves
it in its best state. The probes it trains are the reference: one at a time, in float32. The probe
stage trains a task's probes many at a time (``elmolab.probing.engine``: every feature mode and
seed of an encoder as heads of one model, in bf16 where the CPU has it); tests check that each
head of the engine trains as :func:`fit` trains it alone, epoch for epoch. To add a probe kind,
write its module in ``elmolab.probing.kinds``.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from elmolab.io.results import FeatureMode, conditional_features
from elmolab.models.scalar_mix import ScalarMix, normalize_layers
from elmolab.probing.settings import Schedule

EVAL_TOKENS = 4096  # tokens (padded words for trees) per evaluation batch
BASELINE_LAYER = 0  # conditional probing: the layer a head reads beside its mode's input


@dataclass(frozen=True)
class Head:
    """One probe run: its feature mode and seed (its initialisation, dropout and data order); with
    ``baseline``, the probe reads layer 0 beside the mode's input (``[layer0; mode]``,
    conditional probing), which a mode other than ``layer0`` and ``concat`` allows."""

    mode: FeatureMode
    seed: int
    baseline: bool = False

    def __post_init__(self) -> None:
        if self.baseline and self.mode in (FeatureMode.LAYER0, FeatureMode.CONCAT):
            raise ValueError(f"layer 0 beside {self.mode.value!r} adds nothing to condition on")

    @property
    def features(self) -> str:
        """The run's ``features`` name: the mode, or ``layer0+<mode>`` with the baseline."""
        return conditional_features(self.mode.value) if self.baseline else self.mode.value


# --- What a probe reads -------------------------------------------------------------------------


class LayerInput(nn.Module):
    """A feature mode's input from layers ``(L, *N, dim)``: ``(*N, width)``.

    ``concat`` joins the layers as they are; every other mode mixes them (:class:`ScalarMix`),
    after normalizing each layer over the batch when ``layer_norm`` (``mask`` ``(*N,)`` marks the
    real positions), and with ``baseline`` puts layer 0 before the mix."""

    def __init__(
        self,
        mode: FeatureMode,
        num_layers: int,
        dim: int,
        *,
        l2_lambda: float = 0.0,
        layer_norm: bool = False,
        baseline: bool = False,
    ) -> None:
        super().__init__()
        self.mix: ScalarMix | None = None
        if mode is not FeatureMode.CONCAT:
            self.mix = ScalarMix.of_modes([mode], num_layers, l2_lambda)
        self.layer_norm = layer_norm
        self.baseline = baseline
        self.width = dim * (num_layers if self.mix is None else 2 if baseline else 1)

    def forward(self, layers: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.mix is None:
            return layers.movedim(0, -2).flatten(-2)  # [h_0; h_1; ...]
        # Normalized here, not in the mix: the baseline reads the normalized layer 0 too. The
        # statistics take a batch axis first: one batch here.
        if self.layer_norm:
            layers = normalize_layers(layers[:, None], None if mask is None else mask[None])[:, 0]
        mixed = self.mix(layers)[0]  # (*N, dim): the one head
        return torch.cat([layers[BASELINE_LAYER], mixed], dim=-1) if self.baseline else mixed

    def penalty(self) -> torch.Tensor:
        return torch.zeros(()) if self.mix is None else self.mix.penalty()[0]


def uniform(generator: torch.Generator, shape: tuple[int, ...], bound: float) -> torch.Tensor:
    """``shape`` drawn from ``generator``, uniform in (-bound, bound)."""
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


class Classifier(nn.Module):
    """A linear map, or an MLP (one hidden layer, ReLU, dropout), each map initialised as
    ``nn.Linear`` from ``generator``, which also draws the dropout masks."""

    def __init__(
        self,
        generator: torch.Generator,
        d_in: int,
        labels: int,
        kind: str = "linear",
        hidden_dim: int = 0,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.generator, self.dropout = generator, dropout
        sizes = [d_in, hidden_dim, labels] if kind == "mlp" else [d_in, labels]
        self.maps = nn.ModuleList()
        for a, b in itertools.pairwise(sizes):
            linear = nn.utils.skip_init(nn.Linear, a, b)  # initialised from ``generator`` below
            with torch.no_grad():
                linear.weight.copy_(uniform(generator, (b, a), 1 / math.sqrt(a)))
                linear.bias.copy_(uniform(generator, (b,), 1 / math.sqrt(a)))
            self.maps.append(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.maps[:-1]:
            x = torch.relu(linear(x))
            if self.training and self.dropout > 0:
                keep = 1 - self.dropout
                x = x * torch.empty(x.shape).bernoulli_(keep, generator=self.generator) / keep
        return self.maps[-1](x)


# --- The probes ---------------------------------------------------------------------------------


class Probe(nn.Module):
    """What every probe has: its input, its own parameters, the root vector of the kinds that
    need one, and whether it is selected on its dev loss alone."""

    lower_is_better = False

    def __init__(self, input: LayerInput, root: str | None = None) -> None:
        super().__init__()
        self.input = input
        self.root: nn.Parameter | None = None
        if root is not None:  # "learned" (from zeros) or "zeros" (fixed)
            width = input.width
            self.root = nn.Parameter(torch.zeros(width), requires_grad=root == "learned")

    def parameter_groups(self, schedule: Schedule) -> list[dict]:
        """Adam's groups: the mix at ``mix_lr``; the probe's own parameters at ``lr``, with
        ``weight_decay`` on its maps (not on the root vector)."""
        mix = [] if self.input.mix is None else list(self.input.mix.parameters())
        own = [p for name, p in self.named_parameters() if not name.startswith(("input.", "root"))]
        groups = [
            {"params": mix, "lr": schedule.mix_lr, "weight_decay": 0.0},
            {"params": own, "lr": schedule.lr, "weight_decay": schedule.weight_decay},
        ]
        if self.root is not None and self.root.requires_grad:
            groups.append({"params": [self.root], "lr": schedule.lr, "weight_decay": 0.0})
        return [group for group in groups if group["params"]]


# --- Their data: minibatches, losses, scores ----------------------------------------------------


@dataclass
class Evaluation:
    score: float  # the metric (the structural probe: NaN, scored from its distances at the end)
    loss: float  # mean loss per item (token, word, sentence)
    predicted: list[torch.Tensor]  # labels, or heads, of the split; or each sentence's distances


class ProbeData(Protocol):
    """A kind's data, as :func:`fit` reads it."""

    def steps(self, probe: Probe, shuffle: torch.Generator) -> Iterator[tuple[torch.Tensor, int]]:
        """One epoch of the train split, in an order drawn from ``shuffle``: per minibatch, its
        mean loss and its items."""
        ...

    def evaluate(self, probe: Probe, role: str) -> Evaluation:
        """The probe on split ``role``."""
        ...


def epoch_order(
    items: int, batch_size: int, min_epoch_items: int, shuffle: torch.Generator
) -> list[torch.Tensor]:
    """One epoch's minibatches of item indices: shuffled passes over the ``items`` until at least
    ``min_epoch_items`` are drawn, each minibatch in ascending order (its mean loss does not see
    the order; its gather then reads memory forward)."""
    passes = max(1, -(-min_epoch_items // max(items, 1)))
    order = torch.cat([torch.randperm(items, generator=shuffle) for _ in range(passes)])
    return [batch.sort().values for batch in order.split(batch_size)]


# --- Training -----------------------------------------------------------------------------------


def made_progress(
    score: float, loss: float, mark: tuple[float, float], min_delta: float, loss_only: bool
) -> bool:
    """Whether a dev result is progress over ``mark`` (the last one that was): a score higher by
    more than ``min_delta``, or (the same score, or a probe selected on its loss) a loss lower by
    more than the share ``min_delta`` of the marked loss."""
    marked_score, marked_loss = mark
    lower_loss = loss < marked_loss * (1 - min_delta)
    if loss_only:
        return lower_loss
    return score > marked_score + min_delta or (score == marked_score and lower_loss)


@dataclass
class Stopping:
    """The early-stopping rule. After each epoch the probe scores dev; its best state is the
    epoch of the highest dev score, among equal scores the lowest dev loss (``loss_only``: the
    lowest dev loss). An epoch without progress (:func:`made_progress`) multiplies the learning
    rates by ``lr_decay``; ``patience`` of them in a row, or ``max_stalls`` in all, stop it."""

    patience: int
    max_stalls: float
    min_delta: float
    loss_only: bool
    best_key: tuple[float, ...] | None = None
    best_epoch: int = 0
    mark: tuple[float, float] | None = None  # (score, loss) of the last progress
    since: int = 0  # the epoch of the last progress
    stalls: int = 0  # epochs without progress so far
    stalled: bool = False  # the last epoch made no progress
    stopped: bool = False

    @classmethod
    def of(cls, schedule: Schedule, loss_only: bool) -> Stopping:
        return cls(schedule.patience, schedule.max_stalls, schedule.min_delta, loss_only)

    def record(self, epoch: int, score: float, loss: float) -> bool:
        """Take the dev score and loss after ``epoch``; whether that state is the best so far."""
        key = (-loss,) if self.loss_only else (score, -loss)
        improved = self.best_key is None or key > self.best_key
        if improved:
            self.best_key, self.best_epoch = key, epoch
        progress = self.mark is None or made_progress(
            score, loss, self.mark, self.min_delta, self.loss_only
        )
        self.stalled = not progress
        if progress:
            self.mark, self.since = (score, loss), epoch
        else:
            self.stalls += 1
            self.stopped = epoch - self.since >= self.patience or self.stalls >= self.max_stalls
        return improved


@dataclass
class Fit:
    history: list[tuple[float, float, float]]  # per epoch: train loss, dev score, dev loss
    best_epoch: int
    hit_epoch_cap: bool  # still making progress when max_epochs ran out


def fit(probe: Probe, data: ProbeData, schedule: Schedule, seed: int) -> Fit:
    """Train ``probe`` on ``data``'s train split until :class:`Stopping` stops it or
    ``max_epochs`` run out; leaves it in its best state. ``seed`` orders the minibatches. Each
    step's loss is the minibatch's mean loss plus the mix's penalty."""
    optimizer = torch.optim.Adam(probe.parameter_groups(schedule), betas=(0.9, 0.999), eps=1e-8)
    for group in optimizer.param_groups:  # a parameter no loss reached still takes its Adam step
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    shuffle = torch.Generator().manual_seed(seed)
    stopping = Stopping.of(schedule, probe.lower_is_better)
    best, history = copy.deepcopy(probe.state_dict()), []
    for epoch in range(1, schedule.max_epochs + 1):
        probe.train()
        loss_sum, items = 0.0, 0
        for loss, count in data.steps(probe, shuffle):
            loss = loss + probe.input.penalty()
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            optimizer.step()
            loss_sum, items = loss_sum + float(loss.detach()) * count, items + count
        probe.eval()
        with torch.no_grad():
            dev = data.evaluate(probe, "dev")
        selected = dev.loss if probe.lower_is_better else dev.score
        history.append((loss_sum / items, selected, dev.loss))
        if stopping.record(epoch, dev.score, dev.loss):
            best = copy.deepcopy(probe.state_dict())
        if stopping.stopped:
            break
        if stopping.stalled:
            for group in optimizer.param_groups:
                group["lr"] *= schedule.lr_decay
    probe.load_state_dict(best)
    probe.eval()
    return Fit(history, stopping.best_epoch, not stopping.stopped)
