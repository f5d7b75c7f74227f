"""The batched probes' shared parts: every head of a fit stacked along a leading head axis.

:class:`HeadProbes` holds a fit's heads grouped by input width (:class:`Part`), each part with its
heads' mixes and its kind's stacked probe, built from a generator per head (its seed) so that a
head draws its parameters as it would alone; the kinds (``elmolab.probing.kinds``) subclass it
with the steps of an epoch, the loss of a step and the evaluation of a split.
:class:`HeadLinear` and :class:`HeadClassifier` are the stacked maps token and pair heads share;
:class:`ProbeResult` is what each head reports, and :func:`probe_result` assembles it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from elmolab.core.schema import EVAL_ROLES, ProbeSettings
from elmolab.io.results import FeatureMode
from elmolab.models.scalar_mix import ScalarMix, normalize_layers
from elmolab.probing.datasets import FeatureDataset, TreeDataset
from elmolab.probing.probes import BASELINE_LAYER, Head, uniform
from elmolab.probing.settings import Schedule, probe_dtype

# A parameter (head axis first), its learning rate, weight decay, and its rows' head numbers.
ParamGroup = tuple[nn.Parameter, float, float, torch.Tensor]


def float32_region() -> torch.autocast:
    """A region computed in float32 inside a bf16 autocast region."""
    return torch.autocast("cpu", enabled=False)


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    train_loss: (
        float  # mean over the epoch's items (tokens, words, sentences), mix penalty included
    )
    dev_metric: float  # the score that selects (the structural probe: its dev loss)
    dev_loss: float  # mean over dev items (the structural probe: the same loss)


@dataclass(frozen=True)
class ProbeResult:
    """What one head reports; the names are keys of a probe run's ``metrics.json``."""

    features: str  # the feature mode
    metric: str
    seed: int
    dev: float  # the dev metric of the best epoch
    test: float  # the test metric, evaluated once, with the best dev state
    best_epoch: int  # 1-based
    epochs: int  # epochs run
    hit_epoch_cap: bool  # still improving within patience when max_epochs ran out
    mix_weights: list[float] | None  # the scalar mix's normalized weights; None for concat
    gamma: float | None  # None for concat
    wall_seconds: float  # the fit's wall time shared out over its heads
    history: list[EpochRecord] = field(repr=False)
    test_predictions: list[list[str]] = field(repr=False)  # per test sentence
    # Correct and all items per test sentence, for paired bootstrap tests.
    per_sentence_test: dict[str, list[int]] = field(repr=False)
    # Further scores of the best state, written to metrics.json as they are (the structural
    # probe's distance Spearman, NER's untyped span F1, the cross-entropy in bits, ...).
    extra: dict[str, Any] = field(default_factory=dict)


# --- Batched building blocks --------------------------------------------------------------------


def uniform_heads(generators: Sequence[torch.Generator], shape: tuple[int, ...], bound: float):
    """``(heads, *shape)``: head ``h`` drawn from ``generators[h]`` as :func:`uniform` draws."""
    return torch.stack([uniform(g, shape, bound) for g in generators])


def take_rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` along axis 0; a view (no copy) when ``index`` is consecutive rows in
    order, as when every head of a part is active."""
    start = int(index[0]) if len(index) else 0
    if torch.equal(index, torch.arange(start, start + len(index))):
        return values[start : start + len(index)]
    return values.index_select(0, index)


# A head's input: one tensor ``(h, N, d)``, or blocks ``(h, N, d_k)`` that side by side are it.
Blocks = torch.Tensor | Sequence[torch.Tensor]


class HeadLinear(nn.Module):
    """A linear map per head, initialised as ``nn.Linear``: ``(h, N, d_in) -> (h, N, d_out)``.

    The input may come as blocks (its columns in pieces, e.g. each layer of a concatenation),
    joined for one product: one large product and its one weight gradient run faster than a
    product per block."""

    def __init__(self, generators: Sequence[torch.Generator], d_in: int, d_out: int) -> None:
        super().__init__()
        bound = 1 / math.sqrt(d_in)
        self.weight = nn.Parameter(uniform_heads(generators, (d_out, d_in), bound))
        self.bias = nn.Parameter(uniform_heads(generators, (d_out,), bound))

    def forward(self, x: Blocks, heads: torch.Tensor) -> torch.Tensor:
        blocks = [x] if isinstance(x, torch.Tensor) else list(x)
        weight, bias = take_rows(self.weight, heads), take_rows(self.bias, heads)
        if sum(block.shape[-1] for block in blocks) != weight.shape[-1]:
            raise ValueError(f"inputs of width {weight.shape[-1]} expected")
        x = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)
        return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))  # (h, N, d_out)

    def folded(
        self, layers: torch.Tensor, heads: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The heads' maps as maps of the layers side by side, for inputs that are mixes of the
        layers: ``layers`` ``(h, blocks, num_layers)`` holds each input block's weights of the
        layers (one-hot for a layer, the identity for a concatenation). Returns the weight
        ``(h, d_out, num_layers * dim)`` and bias ``(h, d_out)`` with
        ``W [mix_1; ...; mix_blocks] = W_folded [layer_0; ...; layer_L-1]``, in float32."""
        weight, bias = take_rows(self.weight, heads), take_rows(self.bias, heads)
        h, d_out, width = weight.shape
        blocks = layers.shape[1]
        with float32_region():
            by_block = weight.view(h, d_out, blocks, width // blocks)
            folded = torch.einsum("hobd,hbl->hold", by_block, layers.float())
        return folded.reshape(h, d_out, -1), bias


class HeadClassifier(nn.Module):
    """Per head a linear probe, or an MLP (one hidden layer, ReLU, dropout drawn from the head's
    generator): ``(h, N, d_in) -> (h, N, labels)``."""

    def __init__(
        self,
        generators: Sequence[torch.Generator],
        d_in: int,
        labels: int,
        kind: str,
        hidden_dim: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.generators = list(generators)
        self.dropout = dropout
        self.hidden = None
        if kind == "mlp":
            self.hidden = HeadLinear(generators, d_in, hidden_dim)
            d_in = hidden_dim
        self.output = HeadLinear(generators, d_in, labels)

    @property
    def first(self) -> HeadLinear:
        """The map applied to the input (the hidden layer of an MLP, else the output layer)."""
        return self.output if self.hidden is None else self.hidden

    def forward(self, x: Blocks, heads: torch.Tensor) -> torch.Tensor:
        return self.rest(self.first(x, heads), heads)

    def rest(self, x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """The classifier after its first map, from that map's output ``(h, N, d)``."""
        if self.hidden is not None:
            x = torch.relu(x)  # (h, N, hidden)
            if self.training and self.dropout > 0:
                keep = 1 - self.dropout
                masks = [
                    torch.empty(x.shape[1:]).bernoulli_(keep, generator=self.generators[h])
                    for h in heads.tolist()
                ]
                x = x * torch.stack(masks) / keep
            x = self.output(x, heads)
        return x


class RootVector(nn.Module):
    """The vector standing for the root, per head: learned from zeros, or fixed zeros."""

    def __init__(self, heads: int, width: int, learned: bool) -> None:
        super().__init__()
        self.vector = nn.Parameter(torch.zeros(heads, width), requires_grad=learned)


class Part(nn.Module):
    """The heads of one input width: scalar mixes (one layer wide) or concatenations."""

    def __init__(
        self,
        index: list[int],
        mix: ScalarMix | None,
        probe: nn.Module,
        root: RootVector | None,
        baseline: bool = False,
    ) -> None:
        super().__init__()
        self.register_buffer("index", torch.tensor(index), persistent=False)  # (h,) in the fit
        self.mix = mix
        self.probe = probe
        self.root = root
        self.baseline = baseline  # layer 0 beside the mix: [layer0; mix]


@dataclass
class HeadEvaluation:
    """The heads' scores on a split (NaN where a head was not evaluated) and predictions."""

    scores: torch.Tensor  # (heads,) the metric (the structural probe: NaN until the end)
    losses: torch.Tensor  # (heads,) mean loss per item (token, word, sentence)
    predicted: list  # per head, what the probe kind predicts (None where not evaluated)
    # (heads, items) each item's loss, where asked for (token probes measuring information)
    item_losses: torch.Tensor | None = None


# A step's loss to differentiate, each head's mean loss (detached) and items: (H,), (H,).
StepLoss = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class HeadProbes(nn.Module):
    """What every probe kind shares: its heads grouped by input width, with their mixes.

    Subclasses define the steps of an epoch, the loss of a step and the evaluation of a split.
    """

    lower_is_better = False  # select on the dev loss alone (the structural probe)

    def __init__(
        self,
        heads: Sequence[Head],
        num_layers: int,
        dim: int,
        settings: ProbeSettings,
        build: Callable[[Sequence[torch.Generator], int], nn.Module],
        *,
        root: bool = False,
    ) -> None:
        super().__init__()
        if not heads:
            raise ValueError("no heads to train")
        self.heads = list(heads)
        self.num_layers = num_layers
        self.layer_norm = settings.layer_norm
        self.dtype = probe_dtype(settings)
        self.seeds = sorted({head.seed for head in heads})
        self.seed_group = torch.tensor([self.seeds.index(head.seed) for head in heads])
        self.parts = nn.ModuleList()
        # Parts: fixed mixes (no gradient reaches their inputs), learned mixes, concats, and the
        # two kinds of mix again with layer 0 beside them (conditional probing).
        kinds = {FeatureMode.SCALAR_MIX: 1, FeatureMode.CONCAT: 2}
        for kind, baseline in ((0, False), (1, False), (2, False), (0, True), (1, True)):
            index = [
                i
                for i, h in enumerate(heads)
                if kinds.get(h.mode, 0) == kind and h.baseline == baseline
            ]
            if not index:
                continue
            concat = kind == 2
            width = num_layers * dim if concat else dim * (2 if baseline else 1)
            # Each head draws its parameters (and dropout) from a generator of its own.
            generators = [torch.Generator().manual_seed(heads[i].seed) for i in index]
            mix = None
            if not concat:
                mix = ScalarMix.of_modes(
                    [heads[i].mode for i in index], num_layers, settings.l2_lambda
                )
            probe = build(generators, width)
            root_vector = (
                RootVector(len(index), width, settings.root == "learned") if root else None
            )
            self.parts.append(Part(index, mix, probe, root_vector, baseline))

    def autocast(self) -> torch.autocast:
        """The region of a step or an evaluation: with bf16-mixed, the features and the probes'
        matrix products in bf16 (parameters, optimizer state, logits, distances and losses in
        float32)."""
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16)

    def parameter_groups(self, schedule: Schedule) -> list[ParamGroup]:
        """Each parameter, its learning rate, weight decay and rows' heads (:class:`HeadAdam`)."""
        groups: list[ParamGroup] = []
        for part in self.parts:
            if part.mix is not None:
                for p in (part.mix.w, part.mix.gamma):
                    groups.append((p, schedule.mix_lr, 0.0, part.index))
            for p in part.probe.parameters():
                groups.append((p, schedule.lr, schedule.weight_decay, part.index))
            if part.root is not None:
                groups.append((part.root.vector, schedule.lr, 0.0, part.index))
        return groups

    @staticmethod
    def members(part: Part, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The part's heads where ``active`` ``(H,)``: positions in the part, numbers in the fit."""
        local = torch.nonzero(active[part.index]).flatten()
        return local, part.index[local]

    def inputs(
        self,
        part: Part,
        x: torch.Tensor,
        groups: torch.Tensor,
        local: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The heads' inputs from layers ``x`` ``(num_layers, G, *N, dim)`` as blocks
        ``(h, *N, d_k)`` that side by side are the input: each layer of a concatenation, layer 0
        and the mix of a conditional head, or the mix alone."""
        if part.mix is None:
            return [take_rows(layer, groups) for layer in x]
        if self.layer_norm:
            x = normalize_layers(x, mask)
        mixed = part.mix(x, groups, local)
        return [take_rows(x[BASELINE_LAYER], groups), mixed] if part.baseline else [mixed]

    def layer_coefficients(self, part: Part, local: torch.Tensor) -> torch.Tensor:
        """The heads' inputs as mixes of the layers: ``(h, blocks, num_layers)``, each input
        block's weights of the layers (the blocks of :meth:`inputs`)."""
        if part.mix is None:
            return torch.eye(self.num_layers).expand(len(local), -1, -1)
        s = part.mix.coefficients(local)  # (h, num_layers)
        if not part.baseline:
            return s[:, None, :]
        baseline = torch.zeros_like(s)
        baseline[:, BASELINE_LAYER] = 1.0
        return torch.stack([baseline, s], dim=1)

    @staticmethod
    def penalty(part: Part, local: torch.Tensor) -> torch.Tensor:
        """The mix penalty of the part's heads ``local``: ``(h,)``."""
        return part.mix.penalty(local) if part.mix is not None else torch.zeros(len(local))

    def mix_summary(self, head: int) -> tuple[list[float] | None, float | None]:
        for part in self.parts:
            where = torch.nonzero(part.index == head).flatten()
            if len(where) and part.mix is not None:
                return part.mix.summary(int(where[0]))
        return None, None

    def keep_best(self, best: dict[str, torch.Tensor], improved: torch.Tensor) -> None:
        """Copy the rows of the ``improved`` heads ``(H,)`` of every parameter into ``best``."""
        for number, part in enumerate(self.parts):
            rows = torch.nonzero(improved[part.index]).flatten()
            if len(rows):
                for name, value in part.state_dict().items():
                    best[f"parts.{number}.{name}"][rows] = value[rows]

    def epoch_steps(self, shuffles: Sequence[torch.Generator]) -> Iterator:
        """The steps of one epoch: per step, each seed's minibatch (``shuffles``: per seed)."""
        raise NotImplementedError

    def step_loss(self, step, active: torch.Tensor) -> StepLoss:
        raise NotImplementedError

    def evaluate(self, role: str, active: torch.Tensor, **options: bool) -> HeadEvaluation:
        raise NotImplementedError

    def results(self, fit: FitTrace) -> list[ProbeResult]:
        raise NotImplementedError

    def final_evaluations(self, **options: bool) -> tuple[HeadEvaluation, HeadEvaluation]:
        """Every head, in its best state, on dev and test."""
        everyone = torch.ones(len(self.heads), dtype=torch.bool)
        with torch.no_grad(), self.autocast():
            return (
                self.evaluate("dev", everyone, **options),
                self.evaluate("test", everyone, **options),
            )


def scatter_heads(heads: int, pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``(heads,)`` from ``(numbers, values)`` pieces; 0 elsewhere."""
    out = torch.zeros(heads, dtype=torch.float64)
    for numbers, values in pieces:
        out[numbers] = values.detach().double()
    return out


@dataclass
class FitTrace:
    """How each head trained: its epochs, best epoch, whether it hit the epoch cap; time."""

    histories: list[list[EpochRecord]]
    best_epochs: list[int]
    capped: list[bool]
    wall_seconds: float


def probe_result(
    probes: HeadProbes,
    fit: FitTrace,
    h: int,
    metric: str,
    dev: float,
    test: float,
    predictions: list[list[str]],
    per_sentence: dict[str, list[int]],
    extra: dict[str, float],
) -> ProbeResult:
    mix_weights, gamma = probes.mix_summary(h)
    return ProbeResult(
        features=probes.heads[h].features,
        metric=metric,
        seed=probes.heads[h].seed,
        dev=dev,
        test=test,
        best_epoch=fit.best_epochs[h],
        epochs=len(fit.histories[h]),
        hit_epoch_cap=fit.capped[h],
        mix_weights=mix_weights,
        gamma=gamma,
        wall_seconds=fit.wall_seconds / len(probes.heads),
        history=fit.histories[h],
        test_predictions=predictions,
        per_sentence_test=per_sentence,
        extra=extra,
    )


def per_sentence_sums(values: torch.Tensor, sentence_lengths: Sequence[int]) -> list[int]:
    return [int(part.sum()) for part in values.long().split(list(sentence_lengths))]


def check_widths(splits: dict[str, FeatureDataset] | dict[str, TreeDataset]) -> None:
    train = splits["train"]
    for name in EVAL_ROLES:
        split = splits[name]
        if (split.num_layers, split.dim) != (train.num_layers, train.dim):
            raise ValueError(
                f"{name} features are ({split.num_layers}, tokens, {split.dim}),"
                f" train's ({train.num_layers}, tokens, {train.dim})"
            )
