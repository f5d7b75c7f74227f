"""The probes, one plain module per kind, and the one loop that trains them: read this first.

A probe reads the frozen layers ``h_0 .. h_{L-1}`` of the biLM (layer 0 the char CNN's token
vector, then one per LSTM layer), turns them into one input (:class:`LayerInput`: a single layer,
their mean, a learned scalar mix ``gamma * sum_j softmax(w)_j h_j``, the layers side by side, or
layer 0 beside a mix) and maps that input to what the task predicts:

- :class:`TokenProbe`: a label per token (UPOS, chunks, NER), a linear map or an MLP;
- :class:`SentenceProbe`: a label per sentence (sentiment), the token probe on each layer
  mean-pooled over the sentence's tokens (pooling and mixing are both linear, so pooling first is
  mixing first);
- :class:`PairProbe`: the label of each word's arc to its gold head (dependency labels), the token
  probe on ``[dep; head; dep * head]``, a root vector standing for the head of the root word;
- :class:`ArcProbe`: each word's head among the root and the sentence's words, a bilinear score;
- :class:`StructuralProbe`: Hewitt and Manning's distance probe, ``|B (m_i - m_j)|^2`` fitting the
  words' distances in the tree.

:func:`fit` trains one probe with Adam and one early-stopping rule (:class:`Stopping`), and leaves
it in its best state. This module is the reference: it runs one probe at a time, in float32. The
probe stage trains a task's probes many at a time (``elmolab.probing.engine``: every feature mode
and seed of an encoder as heads of one model, in bf16 where the CPU has it); tests check that each
head of the engine trains as :func:`fit` trains it here, epoch for epoch. To add a probe kind,
write its module and data here, then register its kind in the engine.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from elmolab.core.schema import ProbeSettings
from elmolab.io.results import FeatureMode, conditional_features
from elmolab.models.scalar_mix import ScalarMix, normalize_layers
from elmolab.probing.datasets import FeatureDataset, TreeDataset
from elmolab.probing.metrics import LabelVocabulary, TaskMetric, task_score
from elmolab.probing.settings import TOKEN_KINDS, Schedule
from elmolab.probing.trees import SentenceBatch, plan_batches, tree_distances

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


def invalid_arcs(mask: torch.Tensor) -> torch.Tensor:
    """Where a batch's arc scores ``(b, n, 1 + n)`` (the root, then the words, as candidate
    heads) must be ``-inf``: a word heading itself, or a padded slot heading; ``mask`` ``(b, n)``
    the batch's words."""
    n = mask.shape[1]
    self_arc = F.pad(torch.eye(n, dtype=torch.bool), (1, 0))  # (n, 1 + n)
    padding = F.pad(~mask, (1, 0))  # (b, 1 + n)
    return self_arc | padding[:, None, :]


def distance_losses(
    predicted: torch.Tensor, gold: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """H&M's L1 loss per sentence, ``sum_{i,j} |d - tree| / n^2``: distances ``(..., b, n, n)``
    (a head axis or none), gold ``(b, n, n)``, mask ``(b, n)`` -> ``(..., b)``."""
    pairs = mask[:, :, None] & mask[:, None, :]  # (b, n, n)
    lengths = mask.sum(dim=1).float()  # (b,)
    errors = torch.where(pairs, (predicted - gold).abs(), 0.0)  # (..., b, n, n)
    return errors.sum(dim=(-2, -1)) / lengths**2


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


class TokenProbe(Probe):
    """A label per token: layers ``(L, N, dim)`` -> logits ``(N, labels)``."""

    def __init__(self, input: LayerInput, labels: int, generator: torch.Generator, **mlp) -> None:
        super().__init__(input)
        self.classifier = Classifier(generator, input.width, labels, **mlp)

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.input(layers))


class SentenceProbe(TokenProbe):
    """A label per sentence: the token probe on each layer pooled over the sentence's tokens,
    ``(L, S, dim)`` (``elmolab.probing.datasets.pool_sentences`` pools a split once)."""


class PairProbe(Probe):
    """The label of each word's arc to its gold head: the layers of the words and of their heads,
    ``(L, N, dim)`` each, and ``is_root`` ``(N,)`` -> logits ``(N, labels)`` of
    ``[dep; head; dep * head]``, the root vector standing for the head of a root word. With
    ``layer_norm``, words and heads are normalized together (a root word's head slot holds any
    row; the root vector replaces it)."""

    def __init__(
        self, input: LayerInput, labels: int, generator: torch.Generator, root: str, **mlp
    ) -> None:
        super().__init__(input, root)
        self.classifier = Classifier(generator, 3 * input.width, labels, **mlp)

    def forward(self, deps: torch.Tensor, heads: torch.Tensor, is_root: torch.Tensor):
        dep, head = self.input(torch.cat([deps, heads], dim=1)).chunk(2, dim=0)
        head = torch.where(is_root[:, None], self.root, head)
        return self.classifier(torch.cat([dep, head, dep * head], dim=-1))


class ArcProbe(Probe):
    """Each word's head: layers ``(L, b, n, dim)`` of padded sentences, ``mask`` ``(b, n)`` ->
    scores ``(b, n, 1 + n)`` over the candidates (the root, then the words),
    ``score(i, j) = m_i^T W m_j + b^T m_j``, ``-inf`` for a word heading itself or a padded slot.
    ``W`` starts random with standard deviation ``1 / width`` (zero is a saddle), ``b`` at zero."""

    def __init__(self, input: LayerInput, generator: torch.Generator, root: str) -> None:
        super().__init__(input, root)
        width = input.width
        self.weight = nn.Parameter(torch.randn((width, width), generator=generator) / width)
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = self.input(layers, mask)  # (b, n, width)
        b, _, width = m.shape
        candidates = torch.cat([self.root.expand(b, 1, width), m], dim=1)  # (b, 1 + n, width)
        scores = (m @ self.weight + self.bias) @ candidates.mT
        return scores.masked_fill(invalid_arcs(mask), float("-inf"))


class StructuralProbe(Probe):
    """Squared distances ``|B (m_i - m_j)|^2`` ``(b, n, n)`` of the words of padded sentences,
    layers ``(L, b, n, dim)``; ``B`` ``(rank, width)`` uniform in (-0.05, 0.05), as Hewitt and
    Manning's. Selected on its dev loss."""

    lower_is_better = True

    def __init__(self, input: LayerInput, generator: torch.Generator, rank: int) -> None:
        super().__init__(input)
        self.proj = nn.Parameter(uniform(generator, (rank, input.width), 0.05))

    def forward(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        p = self.input(layers, mask) @ self.proj.T  # (b, n, rank)
        return ((p[:, :, None, :] - p[:, None, :, :]) ** 2).sum(dim=-1)


# --- Their data: minibatches, losses, scores ----------------------------------------------------


@dataclass
class Evaluation:
    score: float  # the metric (the structural probe: NaN, scored from its distances at the end)
    loss: float  # mean loss per item (token, word, sentence)
    predicted: list[torch.Tensor]  # labels, or heads, of the split; or each sentence's distances


def token_losses(logits: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``logits`` ``(..., labels)`` with ``gold``, which broadcasts to
    ``logits.shape[:-1]``, in nats; a gold label the probe has no output for (kept but unseen in
    train) counts as the loss of the least likely label."""
    log_probs = torch.log_softmax(logits, dim=-1)
    known = gold < logits.shape[-1]
    index = gold.clamp(max=logits.shape[-1] - 1).expand(logits.shape[:-1])
    picked = log_probs.gather(-1, index[..., None])[..., 0]
    if bool(known.all()):
        return -picked
    return -torch.where(known, picked, log_probs.min(dim=-1).values)


def epoch_order(
    items: int, batch_size: int, min_epoch_items: int, shuffle: torch.Generator
) -> list[torch.Tensor]:
    """One epoch's minibatches of item indices: shuffled passes over the ``items`` until at least
    ``min_epoch_items`` are drawn, each minibatch in ascending order (its mean loss does not see
    the order; its gather then reads memory forward)."""
    passes = max(1, -(-min_epoch_items // max(items, 1)))
    order = torch.cat([torch.randperm(items, generator=shuffle) for _ in range(passes)])
    return [batch.sort().values for batch in order.split(batch_size)]


class TokenData:
    """The splits of a token, sentence or pair task (:class:`FeatureDataset`, train, dev and
    test) and how they are scored."""

    def __init__(
        self,
        splits: dict[str, FeatureDataset],
        vocabulary: LabelVocabulary,
        metric: TaskMetric | str,
        batch_size: int,
        min_epoch_tokens: int,
    ) -> None:
        self.splits, self.vocabulary, self.metric = splits, vocabulary, TaskMetric(metric)
        self.batch_size, self.min_epoch_tokens = batch_size, min_epoch_tokens

    def _logits(self, probe: Probe, split: FeatureDataset, rows: torch.Tensor) -> torch.Tensor:
        layers = split.features[:, rows].float()
        if not isinstance(probe, PairProbe):
            return probe(layers)
        assert split.heads is not None
        heads = split.heads[rows]
        return probe(layers, split.features[:, heads.clamp(min=0)].float(), heads < 0)

    def steps(self, probe: Probe, shuffle: torch.Generator) -> Iterator[tuple[torch.Tensor, int]]:
        """One epoch: per minibatch, its mean loss and its items."""
        train = self.splits["train"]
        for rows in epoch_order(len(train.labels), self.batch_size, self.min_epoch_tokens, shuffle):
            logits = self._logits(probe, train, rows)
            yield F.cross_entropy(logits, train.labels[rows]), len(rows)

    def evaluate(self, probe: Probe, role: str) -> Evaluation:
        split = self.splits[role]
        chunks = torch.arange(len(split.labels)).split(EVAL_TOKENS)
        logits = [self._logits(probe, split, rows) for rows in chunks]
        pairs = zip(logits, chunks, strict=True)
        loss = sum(float(token_losses(x, split.labels[rows]).sum()) for x, rows in pairs)
        predicted = torch.cat([x.argmax(dim=-1) for x in logits])
        score = task_score(
            self.metric, predicted, split.labels, split.sentence_lengths, self.vocabulary
        )
        return Evaluation(score, loss / len(split.labels), [predicted])


class TreeData:
    """The splits of a tree task (:class:`TreeDataset`) in padded batches of whole sentences
    (:func:`plan_batches`): the train plan's batches visited in a shuffled order each epoch."""

    def __init__(self, splits: dict[str, TreeDataset], batch_tokens: int) -> None:
        self.splits = splits
        sizes = {"train": batch_tokens, "dev": EVAL_TOKENS, "test": EVAL_TOKENS}
        self.plans = {
            role: plan_batches(split.sentence_lengths, sizes[role])
            for role, split in splits.items()
        }

    @functools.cached_property
    def distances(self) -> dict[str, list]:
        """Each sentence's tree distances per role: the structural probe's targets."""
        return {
            role: [tree_distances(heads) for heads in split.sentence_heads()]
            for role, split in self.splits.items()
        }

    def _batch_loss(self, probe: Probe, role: str, batch: SentenceBatch):
        """The batch's output, its summed loss and its items (words, or sentences)."""
        split = self.splits[role]
        layers = split.features[:, batch.tokens].float()  # (L, b, n, dim)
        output = probe(layers, batch.mask)
        if isinstance(probe, ArcProbe):  # cross-entropy of each word's gold head
            gold = torch.where(batch.mask, split.heads[batch.tokens], 0)
            losses = -torch.log_softmax(output, dim=-1).gather(-1, gold[..., None])[..., 0]
            return output, losses[batch.mask].sum(), int(batch.mask.sum())
        # structural: per sentence, sum_{i,j} |d_ij - tree_ij| / n^2
        gold = torch.zeros_like(output)
        for slot, sentence in enumerate(batch.sentences.tolist()):
            n = split.sentence_lengths[sentence]
            gold[slot, :n, :n] = torch.from_numpy(self.distances[role][sentence])
        losses = distance_losses(output, gold, batch.mask)  # (b,)
        return output, losses.sum(), len(batch.sentences)

    def steps(self, probe: Probe, shuffle: torch.Generator) -> Iterator[tuple[torch.Tensor, int]]:
        plan = self.plans["train"]
        for number in torch.randperm(len(plan), generator=shuffle).tolist():
            _, loss, items = self._batch_loss(probe, "train", plan[number])
            yield loss / items, items

    def evaluate(self, probe: Probe, role: str) -> Evaluation:
        total, outputs = 0.0, []
        for batch in self.plans[role]:
            output, loss, _ = self._batch_loss(probe, role, batch)
            total += float(loss)
            outputs.append(output.argmax(dim=-1) if isinstance(probe, ArcProbe) else output)
        split = self.splits[role]
        if isinstance(probe, StructuralProbe):  # each sentence's (n, n) distances
            sentences = [torch.empty(0)] * len(split.sentence_lengths)
            for batch, output in zip(self.plans[role], outputs, strict=True):
                lengths = batch.mask.sum(dim=1).tolist()
                for slot, (s, n) in enumerate(zip(batch.sentences.tolist(), lengths, strict=True)):
                    sentences[s] = output[slot, :n, :n]
            return Evaluation(float("nan"), total / len(sentences), sentences)
        heads = torch.zeros_like(split.heads)
        for batch, best in zip(self.plans[role], outputs, strict=True):
            heads[batch.tokens[batch.mask]] = best[batch.mask]
        uas = float((heads == split.heads).double().mean())
        return Evaluation(uas, total / len(heads), [heads])


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


def fit(probe: Probe, data: TokenData | TreeData, schedule: Schedule, seed: int) -> Fit:
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


def build(
    kind: str,
    head: Head,
    splits: dict[str, FeatureDataset] | dict[str, TreeDataset],
    settings: ProbeSettings,
    vocabulary: LabelVocabulary | None = None,
    metric: TaskMetric | str | None = None,
) -> tuple[Probe, TokenData | TreeData]:
    """The probe of ``kind`` for ``head``, as ``settings`` (the ``probe`` section) make it, and
    its data: ``token``, ``sentence``, ``pair`` (give ``vocabulary`` and ``metric``), ``arc``,
    ``structural``. The probe draws its parameters from a generator seeded with the head's seed,
    which :func:`fit` also orders the data with."""
    train = splits["train"]
    input = LayerInput(
        head.mode,
        train.num_layers,
        train.dim,
        l2_lambda=settings.l2_lambda,
        layer_norm=settings.layer_norm,
        baseline=head.baseline,
    )
    generator = torch.Generator().manual_seed(head.seed)
    if kind == "arc":
        return ArcProbe(input, generator, settings.root), TreeData(
            splits, settings.tree.batch_tokens
        )
    if kind == "structural":
        probe = StructuralProbe(input, generator, settings.tree.rank)
        return probe, TreeData(splits, settings.tree.batch_tokens)
    if kind not in TOKEN_KINDS:
        raise ValueError(f"unknown probe kind {kind!r}")
    assert vocabulary is not None and metric is not None
    labels = vocabulary.num_train_labels
    mlp = {"kind": settings.kind, "hidden_dim": settings.hidden_dim, "dropout": settings.dropout}
    if kind == "pair":
        probe = PairProbe(input, labels, generator, settings.root, **mlp)
    else:
        probe = (SentenceProbe if kind == "sentence" else TokenProbe)(
            input, labels, generator, **mlp
        )
    data = TokenData(splits, vocabulary, metric, settings.batch_size, settings.min_epoch_tokens)
    return probe, data
