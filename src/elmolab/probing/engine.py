"""The probe engine: every probe of a task on one encoder trained together, as independent heads.

A *head* is one probe run: a feature mode and a seed. For one task, one encoder and one training
set, every head reads the same frozen features, so one model holds them all: each step gathers the
features of the step's tokens once (one minibatch per seed: a seed fixes its head's initialisation
and the order it visits the training data), every head mixes them with its own mix and classifies
them with its own parameters, stacked along a leading head axis (``bmm``; token heads instead fold
their first map onto the layers side by side and share one product per minibatch, see
:meth:`TokenProbes._folded_logits`), and the loss is the sum of the heads' losses. Nothing
couples two heads: a head's gradient is that of its own loss, the optimizer (:class:`HeadAdam`)
works element by element with a learning rate per head, and each head draws its initialisation
and dropout from a generator of its own. A head thus trains exactly as it would alone, up to
rounding (``tests/probing/test_probes.py`` and ``tests/probing/test_trees.py`` check it), at a
fraction of the per-step overhead of separate runs.

Every trained probe kind runs through :func:`fit_heads`, one loop with one early-stopping rule:

- token (a label per token: UPOS, chunks, NER) and pair (a label per word and gold head:
  dependency labels), linear or MLP classifiers (:class:`TokenProbes`);
- sentence (a label per sentence: sentiment), the token probes on one item per sentence, its
  tokens' layers mean-pooled (``elmolab.probing.datasets.pool_sentences``). Pooling and every
  mode's mix are both linear maps of the layers, so pooling each layer first and then mixing is
  exactly mixing each token and then pooling: ``mean_t sum_j gamma s_j h_jt = sum_j gamma s_j
  mean_t h_jt`` (a concatenation pools block by block), and the heads, their learned mixes
  included, train on the pooled layers as token heads do, with the token schedule. The layers are
  pooled once per split and standardized as pooled items (``probe.standardize``, an affine map
  per dimension that a head's first map absorbs, as for tokens);
- arc (``deparc``: each word's head among the root and the sentence's words, a bilinear
  scorer, :class:`ArcProbes`) and structural (Hewitt and Manning's distance probe,
  :class:`StructuralProbes`), which read whole sentences in padded batches
  (:mod:`elmolab.probing.trees`).

Early stopping, per head: after each epoch the head scores dev. Its best state is the epoch of
the highest dev score, and among equal scores the lowest dev loss (a score that stays tied, e.g. a
span F1 of 0 in the first epochs, then selects on the loss instead of keeping epoch 1); the
structural probe selects on its dev loss alone, as Hewitt and Manning. An epoch makes *progress*
when the score rises by more than ``min_delta`` over the last progress (or, the score unchanged
or for the structural probe, the loss falls by more than the share ``min_delta``): dev differences
smaller than that are noise, and counting them kept heads crawling for dozens of epochs. An epoch
without progress multiplies the head's learning rate by ``lr_decay``; ``patience`` of them in a
row, or ``max_stalls`` in all, stop the head, whose best state then scores test once. A head
still making progress at ``max_epochs`` is reported with ``hit_epoch_cap``. Training ends when
every head has stopped; stopped heads take no more compute.

The learned scalar mix (``w``, ``gamma``) has its own learning rate (``probe.mix_lr``) and the L2
penalty ``l2_lambda * |w|^2`` in the loss, as the task model's part it is in ELMo.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from elmolab.core.schema import EVAL_ROLES, ProbeSettings
from elmolab.io.results import FeatureMode
from elmolab.models.scalar_mix import ScalarMix, normalize_layers
from elmolab.probing.datasets import FeatureDataset, TreeDataset
from elmolab.probing.metrics import LabelVocabulary, TaskMetric, task_score
from elmolab.probing.probes import (
    BASELINE_LAYER,
    EVAL_TOKENS,
    Head,
    Stopping,
    distance_losses,
    epoch_order,
    invalid_arcs,
    token_losses,
    uniform,
)
from elmolab.probing.settings import TOKEN_KINDS, Schedule, probe_dtype
from elmolab.probing.trees import GoldTrees, SentenceBatch, plan_batches, tree_distances

PAIR_TABLE_TOKENS = 8192  # tokens per piece when a split's pair table is made
LEARNED = -1  # a block of a pair head's input mixed by the head's learned mix
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8

PADDING_LABEL = -100  # the target of a padded slot: no loss

# A parameter (head axis first), its learning rate, weight decay, and its rows' head numbers.
ParamGroup = tuple[nn.Parameter, float, float, torch.Tensor]


def _float32() -> torch.autocast:
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


# --- Optimisation -------------------------------------------------------------------------------


class HeadAdam:
    """Adam (as ``torch.optim.Adam``, L2 weight decay added to the gradient) over parameters whose
    axis 0 is the head, with a learning rate per head: ``base_lr * scale[head]``.

    ``groups`` gives each parameter its base learning rate, weight decay, and the head numbers of
    its rows. A head whose scale is 0 does not move (its moments still update, which nothing
    reads).
    """

    def __init__(self, groups: Sequence[ParamGroup], heads: int) -> None:
        self.groups = [group for group in groups if group[0].requires_grad]
        self.scale = torch.ones(heads)
        self.steps = 0
        self.params = [p for p, *_ in self.groups]
        self.first = [torch.zeros_like(p) for p in self.params]  # Adam's moments, per parameter
        self.second = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p, *_ in self.groups:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        beta1, beta2 = ADAM_BETAS
        correction1 = 1 - beta1**self.steps
        correction2 = 1 - beta2**self.steps
        grads, steps = [], []
        for p, lr, wd, rows in self.groups:
            # No gradient counts as a zero one (the moments decay), as for a head whose loss did
            # not reach the parameter while another head's did: a head's steps never depend on
            # which other heads share its fit.
            grad = torch.zeros_like(p) if p.grad is None else p.grad
            grads.append(grad if wd == 0 else grad + wd * p)
            steps.append((lr / correction1) * self.scale[rows].view(-1, *[1] * (p.dim() - 1)))
        # Each update as one op over every parameter (the same arithmetic as a loop of them)
        torch._foreach_lerp_(self.first, grads, 1 - beta1)
        torch._foreach_mul_(self.second, beta2)
        torch._foreach_addcmul_(self.second, grads, grads, value=1 - beta2)
        denominators = torch._foreach_div(self.second, correction2)
        torch._foreach_sqrt_(denominators)
        torch._foreach_add_(denominators, ADAM_EPS)
        updates = torch._foreach_mul(self.first, steps)
        torch._foreach_addcdiv_(self.params, updates, denominators, value=-1.0)


# --- Batched building blocks --------------------------------------------------------------------


def _uniform(generators: Sequence[torch.Generator], shape: tuple[int, ...], bound: float):
    """``(heads, *shape)``: head ``h`` drawn from ``generators[h]`` as :func:`uniform` draws."""
    return torch.stack([uniform(g, shape, bound) for g in generators])


def _take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
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
        self.weight = nn.Parameter(_uniform(generators, (d_out, d_in), bound))
        self.bias = nn.Parameter(_uniform(generators, (d_out,), bound))

    def forward(self, x: Blocks, heads: torch.Tensor) -> torch.Tensor:
        blocks = [x] if isinstance(x, torch.Tensor) else list(x)
        weight, bias = _take(self.weight, heads), _take(self.bias, heads)
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
        weight, bias = _take(self.weight, heads), _take(self.bias, heads)
        h, d_out, width = weight.shape
        blocks = layers.shape[1]
        with _float32():
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


class _Root(nn.Module):
    """The vector standing for the root, per head: learned from zeros, or fixed zeros."""

    def __init__(self, heads: int, width: int, learned: bool) -> None:
        super().__init__()
        self.vector = nn.Parameter(torch.zeros(heads, width), requires_grad=learned)


class _Part(nn.Module):
    """The heads of one input width: scalar mixes (one layer wide) or concatenations."""

    def __init__(
        self,
        index: list[int],
        mix: ScalarMix | None,
        probe: nn.Module,
        root: _Root | None,
        baseline: bool = False,
    ) -> None:
        super().__init__()
        self.register_buffer("index", torch.tensor(index), persistent=False)  # (h,) in the fit
        self.mix = mix
        self.probe = probe
        self.root = root
        self.baseline = baseline  # layer 0 beside the mix: [layer0; mix]


@dataclass
class Evaluation:
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
            root_vector = _Root(len(index), width, settings.root == "learned") if root else None
            self.parts.append(_Part(index, mix, probe, root_vector, baseline))

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
    def members(part: _Part, active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The part's heads where ``active`` ``(H,)``: positions in the part, numbers in the fit."""
        local = torch.nonzero(active[part.index]).flatten()
        return local, part.index[local]

    def inputs(
        self,
        part: _Part,
        x: torch.Tensor,
        groups: torch.Tensor,
        local: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The heads' inputs from layers ``x`` ``(num_layers, G, *N, dim)`` as blocks
        ``(h, *N, d_k)`` that side by side are the input: each layer of a concatenation, layer 0
        and the mix of a conditional head, or the mix alone."""
        if part.mix is None:
            return [_take(layer, groups) for layer in x]
        if self.layer_norm:
            x = normalize_layers(x, mask)
        mixed = part.mix(x, groups, local)
        return [_take(x[BASELINE_LAYER], groups), mixed] if part.baseline else [mixed]

    def layer_coefficients(self, part: _Part, local: torch.Tensor) -> torch.Tensor:
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
    def penalty(part: _Part, local: torch.Tensor) -> torch.Tensor:
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

    def evaluate(self, role: str, active: torch.Tensor, **options: bool) -> Evaluation:
        raise NotImplementedError

    def results(self, fit: FitTrace) -> list[ProbeResult]:
        raise NotImplementedError

    def final_evaluations(self, **options: bool) -> tuple[Evaluation, Evaluation]:
        """Every head, in its best state, on dev and test."""
        everyone = torch.ones(len(self.heads), dtype=torch.bool)
        with torch.no_grad(), self.autocast():
            return (
                self.evaluate("dev", everyone, **options),
                self.evaluate("test", everyone, **options),
            )


def _scatter(heads: int, pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
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


def train_step(
    probes: HeadProbes, optimizer: HeadAdam, step: object, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step of the ``active`` heads on ``step`` (a minibatch per seed): each head's
    mean loss and items ``(H,)``."""
    with probes.autocast():
        total, losses, counts = probes.step_loss(step, active)
    optimizer.zero_grad()
    total.backward()
    optimizer.step()
    return losses, counts


def fit_heads(probes: HeadProbes, schedule: Schedule) -> FitTrace:
    """Train every head of ``probes`` until it stops (see the module docstring); leaves each head
    in its best state."""
    started = time.perf_counter()
    heads = len(probes.heads)
    optimizer = HeadAdam(probes.parameter_groups(schedule), heads)
    shuffles = [torch.Generator().manual_seed(seed) for seed in probes.seeds]
    active = torch.ones(heads, dtype=torch.bool)
    best = {name: value.detach().clone() for name, value in probes.state_dict().items()}
    stopping = [Stopping.of(schedule, probes.lower_is_better) for _ in range(heads)]
    histories: list[list[EpochRecord]] = [[] for _ in range(heads)]
    for epoch in range(1, schedule.max_epochs + 1):
        probes.train()
        loss_sum = torch.zeros(heads, dtype=torch.float64)
        items = torch.zeros(heads, dtype=torch.float64)
        for step in probes.epoch_steps(shuffles):
            losses, counts = train_step(probes, optimizer, step, active)
            loss_sum += losses * counts
            items += counts
        probes.eval()
        with torch.no_grad(), probes.autocast():
            dev = probes.evaluate("dev", active)
        improved = torch.zeros(heads, dtype=torch.bool)
        for h in torch.nonzero(active).flatten().tolist():
            score, loss = float(dev.scores[h]), float(dev.losses[h])
            selected = loss if probes.lower_is_better else score
            histories[h].append(EpochRecord(epoch, float(loss_sum[h] / items[h]), selected, loss))
            improved[h] = stopping[h].record(epoch, score, loss)
            if stopping[h].stopped:
                active[h] = False
                optimizer.scale[h] = 0.0
            elif stopping[h].stalled:
                optimizer.scale[h] *= schedule.lr_decay
        probes.keep_best(best, improved)
        if not active.any():
            break
    probes.load_state_dict(best)
    probes.eval()
    best_epochs = [head.best_epoch for head in stopping]
    return FitTrace(histories, best_epochs, active.tolist(), time.perf_counter() - started)


def _result(
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


def _per_sentence_sums(values: torch.Tensor, sentence_lengths: Sequence[int]) -> list[int]:
    return [int(part.sum()) for part in values.long().split(list(sentence_lengths))]


# --- Token and pair tasks -----------------------------------------------------------------------


class TokenProbes(HeadProbes):
    """Token probes (a label per token) and, when the splits have ``heads``, pair probes (the
    label of each word's arc to its gold head, from ``[x_dep; x_head; x_dep * x_head]``, a root
    vector standing in for the head of root words): linear or MLP, per head."""

    def __init__(
        self,
        heads: Sequence[Head],
        splits: dict[str, FeatureDataset],
        vocabulary: LabelVocabulary,
        metric: TaskMetric | str,
        settings: ProbeSettings,
        *,
        bits: bool = False,
    ) -> None:
        """``bits``: the results also give the cross-entropy in bits (``dev_bits``, ``test_bits``
        per token, and each test sentence's sum), what information measures compare."""
        train = splits["train"]
        _check_token_splits(splits, vocabulary)
        self.pair = train.heads is not None
        labels = vocabulary.num_train_labels

        def build(generators: Sequence[torch.Generator], width: int) -> nn.Module:
            d_in = 3 * width if self.pair else width
            kind, hidden, dropout = settings.kind, settings.hidden_dim, settings.dropout
            return HeadClassifier(generators, d_in, labels, kind, hidden, dropout)

        super().__init__(heads, train.num_layers, train.dim, settings, build, root=self.pair)
        self.splits = splits
        self.vocabulary = vocabulary
        self.metric = TaskMetric(metric)
        self.batch_size = settings.batch_size
        self.min_epoch_tokens = settings.min_epoch_tokens
        self.bits = bits
        # Linear token heads take logits, loss and evaluation from one product per minibatch in
        # the (tokens, heads, labels) layout (:meth:`_linear_step_loss`)
        self.fused = not self.pair and not self.layer_norm and settings.kind == "linear"
        # Token probes read each token's layers side by side (:meth:`_folded_logits`), from one
        # copy of each split in that layout and the probes' type: a minibatch's gather is then
        # one contiguous row per token.
        self.side_by_side = {}
        if not self.pair:
            for role, split in splits.items():
                rows = torch.empty(len(split.labels), split.num_layers, split.dim, dtype=self.dtype)
                rows.copy_(split.features.transpose(0, 1))
                self.side_by_side[role] = rows.view(len(rows), -1)
        # Pair heads read their inputs from a table of each split (:meth:`_pair_table`), made
        # once: per layer mix ``c`` of ``pair_mixes`` (each fixed mix and concatenated layer of a
        # head, each layer for learned mixes) and token, ``[dep_c; head_c; dep_c * head_c]``. A
        # step then gathers its minibatch's rows once, and a fixed input takes no mixing and no
        # products of features; a learned mix mixes the layers' rows. Not with ``layer_norm``,
        # whose statistics are the minibatch's (:meth:`_pair_logits` then mixes the features).
        # ``table_blocks``: per part, per head, the mixes side by side in its input (LEARNED: the
        # head's own mix).
        self.pair_mixes: list[tuple[float, ...]] = []
        self.table_blocks: list[list[list[int]]] = []
        self.pair_tables: dict[str, torch.Tensor] = {}
        if self.pair and not self.layer_norm:
            for part in self.parts:
                if part.mix is not None and bool(part.mix.learned.any()):
                    blocks = [LEARNED]
                    if part.baseline:
                        blocks.insert(0, self._pair_mix(_one_hot(BASELINE_LAYER, self.num_layers)))
                    self.table_blocks.append([blocks] * len(part.index))
                    continue
                coefficients = self.layer_coefficients(part, torch.arange(len(part.index)))
                self.table_blocks.append(
                    [[self._pair_mix(tuple(block.tolist())) for block in h] for h in coefficients]
                )
            if any(LEARNED in blocks for part in self.table_blocks for blocks in part):
                self.layer_mixes = torch.tensor(
                    [self._pair_mix(_one_hot(k, self.num_layers)) for k in range(self.num_layers)]
                )

    def _pair_mix(self, mix: tuple[float, ...]) -> int:
        """The number of a layer mix in ``pair_mixes``, added if new."""
        if mix not in self.pair_mixes:
            self.pair_mixes.append(mix)
        return self.pair_mixes.index(mix)

    def epoch_steps(self, shuffles: Sequence[torch.Generator]) -> Iterator[list[torch.Tensor]]:
        tokens = len(self.splits["train"].labels)
        orders = [epoch_order(tokens, self.batch_size, self.min_epoch_tokens, g) for g in shuffles]
        return (list(step) for step in zip(*orders, strict=True))

    def _part_logits(
        self,
        role: str,
        batches: Sequence[torch.Tensor],
        groups: torch.Tensor,
        active: torch.Tensor,
    ) -> list[tuple[_Part, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The ``active`` heads on minibatches ``batches`` of split ``role`` (head ``h`` reads
        ``batches[groups[h]]``): per part with active heads, its heads' positions in the part and
        numbers in the fit, and their logits ``(h, N, labels)``."""
        if not self.pair:
            rows = self.side_by_side[role].index_select(0, torch.cat(list(batches)))
            return self._folded_logits(rows.view(len(batches), -1, rows.shape[-1]), groups, active)
        split = self.splits[role]
        assert split.heads is not None
        outputs = []
        if self.table_blocks:
            table = self._pair_table(role)
            rows = [_table_rows(table, batch) for batch in batches]  # (mixes, B, 3 * dim) each
            roots = [torch.nonzero(split.heads[batch] < 0).flatten() for batch in batches]
            for part, blocks in zip(self.parts, self.table_blocks, strict=True):
                local, numbers = self.members(part, active)
                if len(local):
                    logits = self._table_logits(part, rows, roots, blocks, groups[numbers], local)
                    outputs.append((part, local, numbers, logits))
            return outputs
        layers, is_root = self._pair_rows(split, batches)
        for part in self.parts:
            local, numbers = self.members(part, active)
            if len(local):
                logits = self._pair_logits(part, layers, is_root, groups[numbers], local)
                outputs.append((part, local, numbers, logits))
        return outputs

    def _folded_logits(
        self, x: torch.Tensor, groups: torch.Tensor, active: torch.Tensor
    ) -> list[tuple[_Part, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Token probes on ``x`` ``(G, N, num_layers * dim)``, as :meth:`_part_logits`.

        A token head's input is a mix of the layers (a concatenation: several), so its first map
        folds onto the layers side by side (:meth:`HeadLinear.folded`), and every head reading
        one minibatch takes one product together: one wide product, where mixing each head's
        input and multiplying it alone took a dozen narrow ones and the copies between them."""
        inputs = {False: x}
        if self.layer_norm:  # the mixes read normalized layers, as ``inputs`` gives them
            layers = x.view(*x.shape[:2], self.num_layers, -1).permute(2, 0, 1, 3)
            normalized = normalize_layers(layers, None).permute(1, 2, 0, 3).reshape(x.shape)
            inputs[True] = normalized.to(self.dtype)
        members, weight, bias = self._folded_maps(active)
        if not members:
            return []
        keys = [
            groups[numbers] * 2 + int(self.layer_norm and part.mix is not None)
            for part, _, numbers in members
        ]
        key = torch.cat(keys)
        outputs, order = [], []
        for k in key.unique().tolist():
            index = torch.nonzero(key == k).flatten()
            rows = inputs[bool(k % 2)][k // 2]  # (N, num_layers * dim)
            product = _head_products(rows, weight[index], bias[index])
            outputs.append(product.transpose(0, 1))  # (k, N, d)
            order.append(index)
        y = torch.cat(outputs).index_select(0, torch.argsort(torch.cat(order)))
        pieces = y.split([len(local) for _, local, _ in members])
        return [
            (part, local, numbers, part.probe.rest(piece, local))
            for (part, local, numbers), piece in zip(members, pieces, strict=True)
        ]

    def _folded_maps(
        self, active: torch.Tensor
    ) -> tuple[list[tuple[_Part, torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
        """The ``active`` heads' first maps folded onto the layers side by side
        (:meth:`HeadLinear.folded`): per part with active heads, the heads' positions in the part
        and numbers in the fit; the weights ``(h, d_out, num_layers * dim)`` and biases
        ``(h, d_out)`` of those heads, part after part."""
        members, weights, biases = [], [], []
        for part in self.parts:
            local, numbers = self.members(part, active)
            if not len(local):
                continue
            weight, bias = part.probe.first.folded(self.layer_coefficients(part, local), local)
            members.append((part, local, numbers))
            weights.append(weight)
            biases.append(bias)
        if not members:
            return [], torch.empty(0), torch.empty(0)
        return members, torch.cat(weights), torch.cat(biases)

    def _linear_step_loss(self, step: list[torch.Tensor], active: torch.Tensor) -> StepLoss:
        """:meth:`step_loss` of linear token heads without ``layer_norm``: each minibatch's one
        product (:meth:`_folded_logits`) gives its heads' logits token by token ``(N, h,
        labels)``, the layout the loss's softmax and its gradient run along, so the logits are
        never reordered head by head (a copy and its gradient's copy back)."""
        rows = self.side_by_side["train"].index_select(0, torch.cat(list(step)))
        x = rows.view(len(step), -1, rows.shape[-1])  # (G, N, num_layers * dim)
        members, weight, bias = self._folded_maps(active)
        numbers = torch.cat([numbers for _, _, numbers in members])
        penalty = torch.cat([self.penalty(part, local) for part, local, _ in members])
        labels = self.splits["train"].labels
        groups = self.seed_group[numbers]
        total, pieces = torch.zeros(()), []
        for group in groups.unique().tolist():
            index = torch.nonzero(groups == group).flatten()
            logits = _head_products(x[group], weight[index], bias[index]).float()  # (N, h, labels)
            gold = labels[step[group]].view(-1, 1, 1).expand(-1, len(index), 1)
            picked = torch.log_softmax(logits, dim=-1).gather(2, gold)  # (N, h, 1)
            losses = penalty[index] - picked.mean(dim=0).flatten()  # (h,)
            total = total + losses.sum()
            pieces.append((numbers[index], losses))
        counts = torch.full((len(self.heads),), float(len(step[0])), dtype=torch.float64)
        return total, _scatter(len(self.heads), pieces), counts

    def _pair_table(self, role: str) -> torch.Tensor:
        """``(tokens, mixes, 3 * dim)`` in the probes' type, made on first use: per token of
        split ``role`` and layer mix ``c`` of ``pair_mixes``, ``[dep_c; head_c; dep_c * head_c]``,
        mixed as :class:`ScalarMix` mixes, with zeros for the head of a word headed by the root
        (whose terms :meth:`_table_logits` adds per head, from the head's root vector)."""
        if role not in self.pair_tables:
            split = self.splits[role]
            assert split.heads is not None
            mixes = torch.tensor(self.pair_mixes)  # (mixes, num_layers)
            table = torch.empty(len(split.labels), len(mixes), 3 * split.dim, dtype=self.dtype)
            for chunk in torch.arange(len(split.labels)).split(PAIR_TABLE_TOKENS):
                heads = split.heads[chunk]
                x = _rows(split.features, torch.cat([chunk, heads.clamp(min=0)]), 1, self.dtype)
                with self.autocast():
                    mixed = (mixes @ x.view(len(x), -1)).to(self.dtype)  # (mixes, 2n * dim)
                deps, head = mixed.view(len(mixes), 2, len(chunk), -1).unbind(1)
                head = head.masked_fill((heads < 0)[None, :, None], 0.0)
                start, stop = int(chunk[0]), int(chunk[-1]) + 1
                table[start:stop] = torch.cat([deps, head, deps * head], dim=-1).transpose(0, 1)
            self.pair_tables[role] = table
        return self.pair_tables[role]

    def _table_logits(
        self,
        part: _Part,
        rows: Sequence[torch.Tensor],
        roots: Sequence[torch.Tensor],
        blocks: Sequence[Sequence[int]],
        groups: torch.Tensor,
        local: torch.Tensor,
    ) -> torch.Tensor:
        """The pair logits ``(h, B, labels)`` of a part's heads ``local`` from the pair table:
        head ``i`` reads ``rows[groups[i]]`` ``(mixes, B, 3 * dim)``, its minibatch's rows of the
        table, whose blocks ``blocks[local[i]]`` side by side (a learned mix: the table's layers
        mixed) make its input; ``roots[g]``: the rows of minibatch ``g`` headed by the root.

        The first map ``W [dep; head; dep * head]`` of an input of ``k`` blocks is the sum of
        ``k`` maps of the blocks' ``[dep_c; head_c; dep_c * head_c]``, one product for all the
        heads' blocks; on the rows headed by the root, whose table rows hold a zero head, it adds
        ``W_head r + W_product (dep * r)`` (``r`` the head's root vector), as
        :meth:`_pair_logits` computes with ``r`` in place of the head."""
        assert part.root is not None
        first = part.probe.first
        outputs, order = [], []
        for group in groups.unique().tolist():
            which = torch.nonzero(groups == group).flatten()
            heads = local[which]
            x = self._table_inputs(part, rows[group], [blocks[i] for i in heads.tolist()], heads)
            weight = _take(first.weight, heads)  # (h, d_out, 3 * width)
            h, d_out, k = len(heads), weight.shape[1], len(blocks[0])
            dim = x.shape[-1] // 3
            # per head and block, the columns of its [dep_c; head_c; dep_c * head_c]
            pieces = weight.view(h, d_out, 3, k, dim).transpose(1, 3).transpose(2, 3)
            pieces = pieces.reshape(h * k, d_out, 3 * dim)
            # (h * k, d_out, B): the outputs along the rows, whose weight gradient (output
            # gradient times input) then runs in the product's fast layout; the input's
            # gradient (a learned mix) wants the other
            y = torch.bmm(x, pieces.mT).mT if x.requires_grad else torch.bmm(pieces, x.mT)
            root_rows = roots[group]
            if part.root.vector.requires_grad and len(root_rows):
                r = _take(part.root.vector, heads).to(x.dtype).view(h * k, 1, dim)
                deps = x[:, root_rows, :dim]  # (h * k, roots, dim)
                head_side = torch.cat([r.expand_as(deps), deps * r], dim=-1)
                y = y.index_add(2, root_rows, torch.bmm(pieces[:, :, dim:], head_side.mT))
            y = y.view(h, k, *y.shape[1:]).sum(dim=1) if k > 1 else y
            outputs.append(y + _take(first.bias, heads).to(y.dtype)[:, :, None])
            order.append(which)
        y = outputs[0] if len(outputs) == 1 else torch.cat(outputs)[torch.argsort(torch.cat(order))]
        return part.probe.rest(y.mT, local)

    def _table_inputs(
        self,
        part: _Part,
        rows: torch.Tensor,
        blocks: Sequence[Sequence[int]],
        heads: torch.Tensor,
    ) -> torch.Tensor:
        """The blocks of heads ``heads`` (positions in ``part``) reading the table rows ``rows``
        ``(mixes, B, 3 * dim)``: ``(h * k, B, 3 * dim)``, head by head, ``k`` blocks each."""
        fixed = [mix for head in blocks for mix in head if mix != LEARNED]
        if len(fixed) == sum(len(head) for head in blocks):
            return _take(rows, torch.tensor(fixed))
        assert part.mix is not None
        s = part.mix.coefficients(heads)  # (h, num_layers)
        layers = _take(rows, self.layer_mixes)[..., : 2 * rows.shape[-1] // 3]  # [dep; head]
        with _float32():  # a product over a few layers runs faster in float32 than in bf16
            dep_head = s @ layers.float().reshape(len(layers), -1)
        deps, head = dep_head.to(rows.dtype).view(len(heads), *layers.shape[1:]).chunk(2, dim=-1)
        mixed = torch.cat([deps, head, deps * head], dim=-1)  # (h, B, 3 * dim)
        if not fixed:
            return mixed
        baseline = _take(rows, torch.tensor(fixed))  # (h, B, 3 * dim)
        return torch.stack([baseline, mixed], dim=1).flatten(0, 1)

    def _pair_rows(
        self, split: FeatureDataset, batches: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers ``(num_layers, G, 2B, dim)`` of the minibatches' dependents, then their heads,
        in the probes' type, and whether each head is the root ``(G, B)``."""
        assert split.heads is not None
        head_rows = [split.heads[batch] for batch in batches]
        rows = torch.cat(
            [torch.cat([b, h.clamp(min=0)]) for b, h in zip(batches, head_rows, strict=True)]
        )
        return _rows(split.features, rows, len(batches), self.dtype), torch.stack(head_rows) < 0

    def _pair_logits(
        self,
        part: _Part,
        x: torch.Tensor,
        is_root: torch.Tensor,
        groups: torch.Tensor,
        local: torch.Tensor,
    ) -> torch.Tensor:
        # The heads' inputs as blocks (h, N, d_k), e.g. a concatenation's layers.
        blocks = self.inputs(part, x, groups, local)
        assert part.root is not None
        # [dep; head; dep * head], each as wide as the heads' input
        deps, heads = zip(*(block.chunk(2, dim=1) for block in blocks), strict=True)
        roots = part.root.vector[local].to(blocks[0].dtype)
        roots = roots.split([block.shape[-1] for block in blocks], dim=-1)
        # An MLP's dropout in training draws one mask per row and pass: two passes would give the
        # root rows a second mask (and move the head's generator), so it classifies once.
        classifier = part.probe
        dropout = classifier.training and classifier.hidden is not None and classifier.dropout > 0
        if (
            not (roots[0].requires_grad and torch.is_grad_enabled())
            or blocks[0].requires_grad
            or dropout
        ):
            root_rows = is_root[groups][..., None]  # (h, B, 1)
            heads = tuple(
                torch.where(root_rows, root[:, None, :], head)
                for root, head in zip(roots, heads, strict=True)
            )
            return part.probe(_pair_blocks(deps, heads), local)
        # Only the root rows (a few per cent) carry a gradient to the inputs, to the learned root
        # vector: every row is classified with the features' head (no input gradient, so the
        # backward pass skips a third of its work), then the root rows again, with the root.
        logits = part.probe(_pair_blocks(deps, heads), local)
        # Minibatch by minibatch, so that no product's shape depends on another seed's batch
        # (which would change its rounding, and Adam turns rounding into steps).
        for group, mask in enumerate(is_root):
            rows = torch.nonzero(mask).flatten()  # (r,)
            members = torch.nonzero(groups == group).flatten()  # (g,) the group's heads here
            if not len(rows) or not len(members):
                continue
            dep_rows = [dep[members][:, rows] for dep in deps]  # (g, r, dim) each
            root_rows = [
                root[members][:, None, :].expand_as(dep)
                for root, dep in zip(roots, dep_rows, strict=True)
            ]
            root_logits = part.probe(_pair_blocks(dep_rows, root_rows), local[members])
            logits = logits.index_put((members[:, None], rows[None, :]), root_logits)
        return logits

    def step_loss(self, step: list[torch.Tensor], active: torch.Tensor) -> StepLoss:
        if self.fused:
            return self._linear_step_loss(step, active)
        train = self.splits["train"]
        labels = torch.stack([train.labels[batch] for batch in step])  # (G, B)
        total, pieces = torch.zeros(()), []
        parts = self._part_logits("train", step, self.seed_group, active)
        for part, local, numbers, logits in parts:
            gold = labels[self.seed_group[numbers]]  # (h, B)
            losses = F.cross_entropy(logits.float().transpose(1, 2), gold, reduction="none")
            losses = losses.mean(dim=1) + self.penalty(part, local)  # (h,)
            total = total + losses.sum()
            pieces.append((numbers, losses))
        counts = torch.full((len(self.heads),), float(len(step[0])), dtype=torch.float64)
        return total, _scatter(len(self.heads), pieces), counts

    def evaluate(self, role: str, active: torch.Tensor, item_losses: bool = False) -> Evaluation:
        """The ``active`` heads on split ``role``; ``item_losses``: each token's loss too."""
        split = self.splits[role]
        heads = len(self.heads)
        predicted = torch.zeros(heads, len(split.labels), dtype=torch.long)
        loss_sum = torch.zeros(heads, dtype=torch.float64)
        per_item = torch.zeros(heads, len(split.labels)) if item_losses else None
        one_group = torch.zeros(heads, dtype=torch.long)  # every head reads the chunk
        linear = None
        if self.fused:
            members, weight, bias = self._folded_maps(active)  # every head reads each chunk
            linear = torch.cat([numbers for _, _, numbers in members])
        for chunk in torch.arange(len(split.labels)).split(EVAL_TOKENS):
            gold = split.labels[chunk]
            span = slice(chunk[0], chunk[-1] + 1)
            if linear is not None:  # one product for every head (as _linear_step_loss), read
                # token by token (n, h, labels): never reordered head by head
                rows = self.side_by_side[role][span]
                logits = _head_products(rows, weight, bias).float()
                predicted[linear, span] = logits.argmax(dim=-1).t()
                losses = token_losses(logits, gold[:, None]).t().contiguous()
                outputs = [(linear, losses)]
            else:
                outputs = []
                for _, _, numbers, logits in self._part_logits(role, [chunk], one_group, active):
                    logits = logits.float()  # (h, n, labels)
                    predicted[numbers, span] = logits.argmax(dim=-1)
                    outputs.append((numbers, token_losses(logits, gold)))
            for numbers, losses in outputs:
                loss_sum[numbers] += losses.sum(dim=1).double()
                if per_item is not None:
                    per_item[numbers, span] = losses
        scores = torch.full((heads,), float("nan"), dtype=torch.float64)
        for h in torch.nonzero(active).flatten().tolist():
            scores[h] = self._score(predicted[h], split)
        return Evaluation(scores, loss_sum / len(split.labels), list(predicted), per_item)

    def code_lengths(self, role: str) -> list[float]:
        """Every head's code length of the labels of split ``role`` in bits: the sum of
        ``-log2 p(label)`` under the head's probe (online code, Voita and Titov 2020)."""
        everyone = torch.ones(len(self.heads), dtype=torch.bool)
        with torch.no_grad(), self.autocast():
            evaluation = self.evaluate(role, everyone, item_losses=True)
        assert evaluation.item_losses is not None
        return (evaluation.item_losses.double().sum(dim=1) / math.log(2)).tolist()

    def _score(self, predicted: torch.Tensor, split: FeatureDataset) -> float:
        return task_score(
            self.metric, predicted, split.labels, split.sentence_lengths, self.vocabulary
        )

    def results(self, fit: FitTrace) -> list[ProbeResult]:
        dev, test = self.final_evaluations(item_losses=self.bits)
        split = self.splits["test"]
        results = []
        for h in range(len(self.heads)):
            extra: dict[str, Any] = {}
            if self.metric is TaskMetric.SPAN_F1:
                extra = {
                    f"{role}_untyped_f1": self._untyped(evaluation.predicted[h], self.splits[role])
                    for role, evaluation in (("dev", dev), ("test", test))
                }
            if self.bits:
                extra.update(_bits(dev, test, h, split.sentence_lengths))
            predicted = test.predicted[h]
            results.append(
                _result(
                    self,
                    fit,
                    h,
                    self.metric.value,
                    float(dev.scores[h]),
                    float(test.scores[h]),
                    self.vocabulary.decode_in_data_scheme(predicted, split.sentence_lengths),
                    {
                        "correct": _per_sentence_sums(
                            predicted == split.labels, split.sentence_lengths
                        ),
                        "total": list(split.sentence_lengths),
                    },
                    extra,
                )
            )
        return results

    def _untyped(self, predicted: torch.Tensor, split: FeatureDataset) -> float:
        return task_score(
            TaskMetric.SPAN_F1,
            predicted,
            split.labels,
            split.sentence_lengths,
            self.vocabulary,
            untyped=True,
        )


def _head_products(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Heads' maps of the same ``rows`` ``(N, d)`` token by token ``(N, h, d_out)``, from their
    weights ``(h, d_out, d)`` and biases ``(h, d_out)``: one product."""
    product = torch.addmm(bias.flatten(), rows, weight.flatten(0, 1).t())  # (N, h * d_out)
    return product.view(len(rows), len(weight), -1)


def _pair_blocks(deps: Sequence[torch.Tensor], heads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A pair probe's input ``[dep; head; dep * head]`` as blocks (each side itself in blocks)."""
    return [*deps, *heads, *(dep * head for dep, head in zip(deps, heads, strict=True))]


def _table_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The pair table's ``rows`` ``(mixes, B, 3 * dim)``: a gather of whole rows (an evaluation's
    consecutive chunk: a slice), laid out mix by mix for the products."""
    return _take(table, rows).transpose(0, 1).contiguous()


def _one_hot(layer: int, num_layers: int) -> tuple[float, ...]:
    return tuple(float(k == layer) for k in range(num_layers))


def _rows(
    features: torch.Tensor, rows: torch.Tensor, groups: int, dtype: torch.dtype
) -> torch.Tensor:
    """``features[:, rows]`` as ``dtype`` ``(num_layers, groups, len(rows) // groups, dim)``."""
    gathered = features.index_select(1, rows).to(dtype)  # (num_layers, rows, dim)
    return gathered.view(gathered.shape[0], groups, -1, gathered.shape[-1])


def _bits(
    dev: Evaluation, test: Evaluation, h: int, test_sentence_lengths: Sequence[int]
) -> dict[str, Any]:
    """Head ``h``'s cross-entropy in bits per token on dev and test, and each test sentence's
    summed bits (the report's paired bootstrap)."""
    assert dev.item_losses is not None and test.item_losses is not None
    to_bits = 1 / math.log(2)
    sentences = test.item_losses[h].double().split(list(test_sentence_lengths))
    return {
        "dev_bits": float(dev.item_losses[h].double().mean()) * to_bits,
        "test_bits": float(test.item_losses[h].double().mean()) * to_bits,
        "per_sentence_test_bits": [round(float(s.sum()) * to_bits, 4) for s in sentences],
    }


def _check_widths(splits: dict[str, FeatureDataset] | dict[str, TreeDataset]) -> None:
    train = splits["train"]
    for name in EVAL_ROLES:
        split = splits[name]
        if (split.num_layers, split.dim) != (train.num_layers, train.dim):
            raise ValueError(
                f"{name} features are ({split.num_layers}, tokens, {split.dim}),"
                f" train's ({train.num_layers}, tokens, {train.dim})"
            )


def _check_token_splits(splits: dict[str, FeatureDataset], vocabulary: LabelVocabulary) -> None:
    train = splits["train"]
    if int(train.labels.max()) >= vocabulary.num_train_labels:
        raise ValueError(
            f"train label id {int(train.labels.max())} is not one of the"
            f" {vocabulary.num_train_labels} train labels of the vocabulary"
        )
    _check_widths(splits)
    for name in EVAL_ROLES:
        split = splits[name]
        if (split.heads is None) != (train.heads is None):
            raise ValueError(f"heads in only one of train and {name}")


# --- Tree tasks ---------------------------------------------------------------------------------


class HeadBilinear(nn.Module):
    """Per head ``score(i, j) = m_i^T W m_j + b^T m_j`` over the candidates ``j`` (the root's vector
    first, then the words), computed as ``(m_i^T W + b^T) m_j``. ``W`` starts small and random
    (standard deviation ``1 / width``: a zero start is a saddle where every head is alike), ``b``
    at zero."""

    def __init__(self, generators: Sequence[torch.Generator], width: int) -> None:
        super().__init__()
        weights = [torch.randn((width, width), generator=g) / width for g in generators]
        self.weight = nn.Parameter(torch.stack(weights))
        self.bias = nn.Parameter(torch.zeros(len(generators), width))

    def forward(
        self, mixed: torch.Tensor, root: torch.Tensor, invalid: torch.Tensor, heads: torch.Tensor
    ) -> torch.Tensor:
        """``mixed`` ``(h, b, n, width)``, ``root`` ``(h, width)``, ``invalid`` ``(b, n, 1 + n)``
        (:func:`invalid_arcs`) -> ``(h, b, n, 1 + n)``, ``-inf`` where ``invalid``."""
        h, b, n, width = mixed.shape
        root = root.to(mixed.dtype)[:, None, None, :].expand(h, b, 1, width)
        candidates = torch.cat([root, mixed], dim=2)
        # (m_i^T W + b^T) m_j: the prior b^T m_j rides along in the bilinear product
        flat = mixed.reshape(h, b * n, width)
        left = torch.baddbmm(_take(self.bias, heads)[:, None, :], flat, _take(self.weight, heads))
        scores = (left.view(h, b, n, width) @ candidates.transpose(2, 3)).float()  # (h, b, n, 1+n)
        return scores.masked_fill(invalid, float("-inf"))


class HeadProjection(nn.Module):
    """Per head the structural probe's ``d(i, j) = |B (m_i - m_j)|^2``; ``B`` ``(rank, width)``
    uniform in (-0.05, 0.05) as in Hewitt and Manning."""

    def __init__(self, generators: Sequence[torch.Generator], width: int, rank: int) -> None:
        super().__init__()
        self.proj = nn.Parameter(_uniform(generators, (rank, width), 0.05))

    def forward(self, mixed: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """``(h, b, n, width)`` -> squared distances ``(h, b, n, n)``."""
        h, b, n, width = mixed.shape
        projected = torch.bmm(mixed.reshape(h, b * n, width), _take(self.proj, heads).mT)
        # the distances in float32: |a|^2 + |b|^2 - 2 a.b cancels what bf16 would round away
        projected = projected.float().view(h, b, n, -1)  # (h, b, n, rank)
        with _float32():
            norms = (projected**2).sum(dim=-1)  # (h, b, n)
            gram = projected @ projected.transpose(2, 3)  # (h, b, n, n)
        return (norms[..., :, None] + norms[..., None, :] - 2 * gram).clamp(min=0)


class _TreeProbes(HeadProbes):
    """Whole sentences in padded batches: a fixed plan of batches of similar length
    (:func:`plan_batches`), which each seed visits in its own order."""

    def __init__(
        self,
        heads: Sequence[Head],
        splits: dict[str, TreeDataset],
        settings: ProbeSettings,
        build: Callable[[Sequence[torch.Generator], int], nn.Module],
        *,
        root: bool = False,
    ) -> None:
        train = splits["train"]
        _check_widths(splits)
        super().__init__(heads, train.num_layers, train.dim, settings, build, root=root)
        self.splits = splits
        # Each split's features in the probes' type, converted once (by the runner, before its
        # workers fork: then this is the same array): a batch's gather then reads half the bytes
        # in bf16, and no step converts its batch (a millisecond of a 15-20 ms step).
        self.features = {role: split.features.to(self.dtype) for role, split in splits.items()}
        self.plans = {
            "train": plan_batches(train.sentence_lengths, settings.tree.batch_tokens),
            "dev": plan_batches(splits["dev"].sentence_lengths, EVAL_TOKENS),
            "test": plan_batches(splits["test"].sentence_lengths, EVAL_TOKENS),
        }

    def epoch_steps(self, shuffles: Sequence[torch.Generator]) -> Iterator[list[int]]:
        batches = len(self.plans["train"])
        orders = [torch.randperm(batches, generator=g).tolist() for g in shuffles]
        return (list(step) for step in zip(*orders, strict=True))

    def _batches(self, role: str, numbers: Sequence[int] | None = None):
        """``(number, batch, layers (num_layers, 1, b, n, dim))`` of the role's plan."""
        plan = self.plans[role]
        features = self.features[role]
        for number in range(len(plan)) if numbers is None else numbers:
            batch = plan[number]
            layers = features.index_select(1, batch.tokens.flatten())
            yield number, batch, layers.view(layers.shape[0], 1, *batch.tokens.shape, -1)

    def _mixed(self, part: _Part, layers: torch.Tensor, batch: SentenceBatch, local: torch.Tensor):
        groups = torch.zeros(len(local), dtype=torch.long)
        blocks = self.inputs(part, layers, groups, local, batch.mask[None])
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)  # (h, b, n, width)

    def step_loss(self, step: list[int], active: torch.Tensor) -> StepLoss:
        heads = len(self.heads)
        total, pieces = torch.zeros(()), []
        counts = torch.zeros(heads, dtype=torch.float64)
        for group, number in enumerate(step):
            _, batch, layers = next(self._batches("train", [number]))
            in_group = active & (self.seed_group == group)
            for part in self.parts:
                local, numbers = self.members(part, in_group)
                if not len(local):
                    continue
                mixed = self._mixed(part, layers, batch, local)
                losses, items = self._batch_losses(part, mixed, batch, number, local)
                losses = losses + self.penalty(part, local)
                total = total + losses.sum()
                pieces.append((numbers, losses))
                counts[numbers] = float(items)
        return total, _scatter(heads, pieces), counts

    def _batch_losses(
        self, part: _Part, mixed: torch.Tensor, batch: SentenceBatch, number: int, local
    ) -> tuple[torch.Tensor, int]:
        raise NotImplementedError


class ArcProbes(_TreeProbes):
    """``deparc``: each word's head among the root and the sentence's words, the argmax of a
    bilinear score (no tree decoding); cross-entropy with the gold head; UAS over every word,
    punctuation included."""

    def __init__(
        self, heads: Sequence[Head], splits: dict[str, TreeDataset], settings: ProbeSettings
    ) -> None:
        super().__init__(heads, splits, settings, HeadBilinear, root=True)
        # per role and batch of its plan, :func:`invalid_arcs`
        self.invalid = {
            role: [invalid_arcs(batch.mask) for batch in plan] for role, plan in self.plans.items()
        }

    def _scores(self, part: _Part, mixed, role: str, number: int, local) -> torch.Tensor:
        """The scores of the part's heads ``local`` on batch ``number`` of split ``role``:
        ``(h, b, n, 1 + n)``."""
        assert part.root is not None
        root = _take(part.root.vector, local)
        return part.probe(mixed, root, self.invalid[role][number], local)

    def _batch_losses(self, part, mixed, batch, number, local) -> tuple[torch.Tensor, int]:
        scores = self._scores(part, mixed, "train", number, local)  # (h, b, n, 1 + n)
        gold = _slot_heads(self.splits["train"], batch)
        losses = self._word_losses(scores, gold)  # (h, b * n)
        words = int(batch.mask.sum())
        return losses.sum(dim=1) / words, words

    @staticmethod
    def _word_losses(scores: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        """Each slot's cross-entropy with its gold head (``gold``, :func:`_slot_heads`)
        ``(h, b * n)``, 0 at padding (the padded slots are left out by the loss, not cut out of
        the scores first: no copy of the scores and its scatter back in the backward pass). The
        softmax runs along the candidates, the scores' last axis (every slot has the root's
        finite score)."""
        log_probs = torch.log_softmax(scores.flatten(1, 2), dim=-1)  # (h, b * n, 1 + n)
        padded = gold == PADDING_LABEL  # (b * n,)
        slots = gold.masked_fill(padded, 0).expand(len(log_probs), -1)
        picked = log_probs.gather(2, slots[..., None])[..., 0]  # (h, b * n)
        return -picked.masked_fill(padded, 0.0)

    def evaluate(self, role: str, active: torch.Tensor) -> Evaluation:
        split = self.splits[role]
        heads, tokens = len(self.heads), len(split.heads)
        predicted = torch.zeros(heads, tokens, dtype=torch.long)
        loss_sum = torch.zeros(heads, dtype=torch.float64)
        for number, batch, layers in self._batches(role):
            words = batch.tokens[batch.mask]  # (words,)
            gold = _slot_heads(split, batch)
            for part in self.parts:
                local, numbers = self.members(part, active)
                if not len(local):
                    continue
                mixed = self._mixed(part, layers, batch, local)
                scores = self._scores(part, mixed, role, number, local)  # (h, b, n, 1 + n)
                best = scores.argmax(dim=-1)[:, batch.mask]  # (h, words)
                predicted[numbers[:, None], words[None, :]] = best
                losses = self._word_losses(scores, gold)
                loss_sum[numbers] += losses.sum(dim=1).double()
        correct = (predicted == split.heads).double()  # (heads, tokens)
        scores = torch.where(active, correct.mean(dim=1), float("nan"))
        return Evaluation(scores, loss_sum / tokens, list(predicted))

    def results(self, fit: FitTrace) -> list[ProbeResult]:
        dev, test = self.final_evaluations()
        split = self.splits["test"]
        results = []
        for h in range(len(self.heads)):
            predicted = test.predicted[h]
            results.append(
                _result(
                    self,
                    fit,
                    h,
                    "uas",
                    float(dev.scores[h]),
                    float(test.scores[h]),
                    [
                        [str(head) for head in sentence.tolist()]
                        for sentence in predicted.split(list(split.sentence_lengths))
                    ],
                    {
                        "correct": _per_sentence_sums(
                            predicted == split.heads, split.sentence_lengths
                        ),
                        "total": list(split.sentence_lengths),
                    },
                    {},
                )
            )
        return results


def _slot_heads(split: TreeDataset, batch: SentenceBatch) -> torch.Tensor:
    """Each slot's gold head ``(b * n,)``, ``PADDING_LABEL`` at padding."""
    return torch.where(batch.mask, split.heads[batch.tokens], PADDING_LABEL).flatten()


class StructuralProbes(_TreeProbes):
    """Hewitt and Manning's structural probe: squared distances under ``B`` fit the tree distances
    (L1 per sentence over all word pairs, divided by ``n^2``, averaged over sentences); selected on
    the dev loss; scored as UUAS of the minimum spanning tree of the predicted distances
    (punctuation left out) and distance Spearman."""

    lower_is_better = True

    def __init__(
        self,
        heads: Sequence[Head],
        splits: dict[str, TreeDataset],
        settings: ProbeSettings,
        gold: StructuralGold | None = None,
    ) -> None:
        rank = settings.tree.rank

        def build(generators: Sequence[torch.Generator], width: int) -> nn.Module:
            return HeadProjection(generators, width, rank)

        super().__init__(heads, splits, settings, build)
        if gold is None:
            gold = StructuralGold.of(splits)
        gold.check(splits)
        self.targets = {
            role: _padded_distances(gold.distances[role], self.plans[role]) for role in splits
        }
        self.scorers = gold.scorers

    def _batch_losses(self, part, mixed, batch, number, local) -> tuple[torch.Tensor, int]:
        predicted = part.probe(mixed, local)  # (h, b, n, n)
        losses = distance_losses(predicted, self.targets["train"][number], batch.mask)
        return losses.mean(dim=1), len(batch.sentences)

    def evaluate(self, role: str, active: torch.Tensor, distances: bool = False) -> Evaluation:
        heads = len(self.heads)
        sentences = len(self.splits[role].sentence_lengths)
        loss_sum = torch.zeros(heads, dtype=torch.float64)
        predicted: list = [[np.empty(0)] * sentences if distances else None for _ in range(heads)]
        for number, batch, layers in self._batches(role):
            for part in self.parts:
                local, numbers = self.members(part, active)
                if not len(local):
                    continue
                mixed = self._mixed(part, layers, batch, local)
                squared = part.probe(mixed, local)  # (h, b, n, n)
                losses = distance_losses(squared, self.targets[role][number], batch.mask)
                loss_sum[numbers] += losses.sum(dim=1).double()
                if distances:
                    lengths = batch.mask.sum(dim=1).tolist()
                    array = squared.numpy()
                    for row, h in enumerate(numbers.tolist()):
                        for slot, (s, n) in enumerate(
                            zip(batch.sentences.tolist(), lengths, strict=True)
                        ):
                            predicted[h][s] = array[row, slot, :n, :n]
        losses = torch.where(active, loss_sum / sentences, float("nan"))
        return Evaluation(torch.full((heads,), float("nan")), losses, predicted)

    def results(self, fit: FitTrace) -> list[ProbeResult]:
        dev, test = self.final_evaluations(distances=True)
        results = []
        for h in range(len(self.heads)):
            dev_uuas = self.scorers["dev"].uuas(dev.predicted[h])
            test_uuas = self.scorers["test"].uuas(test.predicted[h])
            results.append(
                _result(
                    self,
                    fit,
                    h,
                    "uuas",
                    dev_uuas.score,
                    test_uuas.score,
                    [[f"{i + 1}-{j + 1}" for i, j in edges] for edges in test_uuas.predicted_edges],
                    {"correct": test_uuas.correct, "total": test_uuas.total},
                    {
                        "dev_dspr": self.scorers["dev"].spearman(dev.predicted[h]),
                        "test_dspr": self.scorers["test"].spearman(test.predicted[h]),
                    },
                )
            )
        return results


@dataclass(frozen=True)
class StructuralGold:
    """The gold side of the structural probe's splits: each sentence's tree distances, and for
    dev and test what scoring every head needs of the gold trees (:class:`GoldTrees`, its
    spanning trees and distance ranks computed). It depends on the trees alone, not on the
    features: a cell makes it once for every encoder and job, before its workers fork (on EWT
    about a second, which each of the cell's 18 jobs used to spend)."""

    distances: dict[str, list[np.ndarray]]  # role -> per sentence (n, n)
    scorers: dict[str, GoldTrees]  # dev and test

    @classmethod
    def of(cls, splits: dict[str, TreeDataset]) -> StructuralGold:
        distances = {
            role: [tree_distances(h) for h in split.sentence_heads()]
            for role, split in splits.items()
        }
        scorers = {
            role: GoldTrees(distances[role], splits[role].sentence_punct()).prepared()
            for role in EVAL_ROLES
        }
        return cls(distances, scorers)

    def check(self, splits: dict[str, TreeDataset]) -> None:
        """That these are the gold trees of ``splits``: every role's, as many sentences, each of
        its length (a gold side made for other splits would score against the wrong trees)."""
        for role, split in splits.items():
            lengths = [len(matrix) for matrix in self.distances.get(role, [])]
            if lengths != list(split.sentence_lengths):
                raise ValueError(f"the gold distances of {role} are not of its sentences")


def _padded_distances(
    gold: Sequence[np.ndarray], plan: Sequence[SentenceBatch]
) -> list[torch.Tensor]:
    """The gold distances of each batch of ``plan``, ``(b, n_max, n_max)`` float32, 0-padded."""
    targets = []
    for batch in plan:
        n_max = batch.mask.shape[1]
        padded = np.zeros((len(batch.sentences), n_max, n_max), dtype=np.float32)
        for slot, sentence in enumerate(batch.sentences.tolist()):
            n = len(gold[sentence])
            padded[slot, :n, :n] = gold[sentence]
        targets.append(torch.from_numpy(padded))
    return targets


# --- Entry point --------------------------------------------------------------------------------


def train_heads(
    heads: Sequence[Head],
    splits: dict[str, FeatureDataset] | dict[str, TreeDataset],
    settings: ProbeSettings,
    *,
    kind: str,
    metric: TaskMetric | str | None = None,
    vocabulary: LabelVocabulary | None = None,
    bits: bool = False,
    gold: StructuralGold | None = None,
) -> list[ProbeResult]:
    """Train every head on ``splits`` (train, dev, test) together and score each; ``kind`` is
    ``token``, ``pair`` or ``sentence`` (splits of pooled sentences, one item each; then
    ``metric`` and ``vocabulary`` are needed; ``bits``: the results give the cross-entropy in bits
    too), ``arc`` or ``structural`` (``gold``: the splits' gold side made once for many fits, else
    made here). Results come in the order of ``heads``."""
    if any(head.baseline for head in heads) and kind not in ("token", "pair"):
        raise ValueError("conditional heads (layer 0 beside a mode) are for token and pair probes")
    probes: HeadProbes
    if kind == "sentence" and any(split.heads is not None for split in splits.values()):
        raise ValueError("sentence splits hold pooled sentences, without heads")
    if kind in TOKEN_KINDS:
        assert metric is not None and vocabulary is not None
        probes = TokenProbes(
            heads,
            splits,  # type: ignore[arg-type]
            vocabulary,
            metric,
            settings,
            bits=bits,
        )
    elif kind == "arc":
        probes = ArcProbes(heads, splits, settings)  # type: ignore[arg-type]
    elif kind == "structural":
        probes = StructuralProbes(heads, splits, settings, gold)  # type: ignore[arg-type]
    else:
        raise ValueError(f"unknown probe kind {kind!r}")
    fit = fit_heads(probes, Schedule.of(settings, kind))
    return probes.results(fit)


def online_code_block(
    heads: Sequence[Head],
    splits: dict[str, FeatureDataset],
    settings: ProbeSettings,
    *,
    metric: TaskMetric | str,
    vocabulary: LabelVocabulary,
) -> list[float]:
    """One block of the online code (Voita and Titov 2020): train every head on
    ``splits["train"]`` (the blocks so far; early stopping on dev, as any probe) and return, per
    head, the code length in bits of the labels of ``splits["block"]`` (the next block) under its
    best state."""
    probes = TokenProbes(heads, splits, vocabulary, metric, settings)
    fit_heads(probes, Schedule.of(settings, "token"))
    return probes.code_lengths("block")
