"""Tree probes on frozen features: each word's head (``deparc``) and the structural probe.

Both probes read whole sentences, so a split keeps its sentence boundaries and training draws
padded batches of sentences of similar length (:func:`plan_batches`, :func:`padded_batches`).

* ``deparc``: a bilinear scorer picks each word's head among the root and the other words of its
  sentence; the metric is the unlabelled attachment score (UAS) of the argmax heads.
* The structural probe (Hewitt and Manning 2019): a linear map ``B`` under which squared
  distances between words approximate their distances in the dependency tree; the metrics are
  the undirected attachment score of the minimum spanning tree of the predicted distances
  (UUAS) and the distance Spearman correlation (DSpr), both as in H&M's reporter.

As in :mod:`elmolab.probing.train` a run is deterministic given its seed
(``torch.manual_seed(seed)`` for the initialisation and a generator seeded with ``seed`` for the
batch order), frozen mixes are computed once per split, and the best dev state scores test once.
"""

from __future__ import annotations

import copy
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from os import PathLike

import numpy as np
import torch
from scipy.stats import rankdata
from torch import nn
from torch.nn import functional as F

from elmolab.errors import ElmolabError
from elmolab.models.scalar_mix import FeatureMixer, FeatureMode, ScalarMix, build_feature_mixer
from elmolab.probing.probes import RootVector
from elmolab.probing.train import EpochRecord, ProbeResult, stack_sentences

EVAL_BATCH_TOKENS = 8192  # padded tokens per forward pass without gradients
PRECOMPUTE_CHUNK = 16384  # tokens per forward pass when mixing a split once
DSPR_LENGTHS = (5, 50)  # sentence lengths that DSpr averages over, as H&M's reporter


@dataclass(frozen=True)
class TreeDataset:
    """One split of a tree task in memory: each word's layers, its head and whether it is punct.

    Attributes
    ----------
    features : ``torch.Tensor``
        ``(num_layers, tokens, dim)``, float32, float16 or bfloat16 (batches become float32).
    sentence_lengths : ``tuple[int, ...]``
        Words per sentence, in order (they sum to ``tokens``; none is 0).
    heads : ``torch.Tensor``
        ``(tokens,)`` int64, each word's head as in CoNLL-U: its 1-based index within the
        sentence, 0 for the root.
    punct : ``torch.Tensor``
        ``(tokens,)`` bool, True at punctuation (left out of UUAS, as in H&M).
    """

    features: torch.Tensor
    sentence_lengths: tuple[int, ...]
    heads: torch.Tensor
    punct: torch.Tensor

    def __post_init__(self) -> None:
        if self.features.dim() != 3 or not self.features.is_floating_point():
            raise ValueError(
                f"features must be float (layers, tokens, dim), got {self.features.dtype}"
                f" {tuple(self.features.shape)}"
            )
        tokens = self.features.shape[1]
        if sum(self.sentence_lengths) != tokens or min(self.sentence_lengths, default=0) < 1:
            raise ValueError(
                f"{tokens} feature rows but sentences of {sum(self.sentence_lengths)} words"
                f" (shortest {min(self.sentence_lengths, default=0)})"
            )
        if self.heads.shape != (tokens,) or self.heads.dtype != torch.int64:
            raise ValueError(
                f"{tokens} tokens but heads {self.heads.dtype} {tuple(self.heads.shape)}"
            )
        if self.punct.shape != (tokens,) or self.punct.dtype != torch.bool:
            raise ValueError(
                f"{tokens} tokens but punct {self.punct.dtype} {tuple(self.punct.shape)}"
            )

    @classmethod
    def from_sentences(
        cls,
        features: Sequence[np.ndarray | torch.Tensor],
        heads: Sequence[Sequence[int]],
        punct: Sequence[Sequence[bool]],
        *,
        path: str | PathLike[str] | None = None,
    ) -> TreeDataset:
        """Concatenate per-sentence features ``(num_layers, n_i, dim)``, as in feature files.

        ``heads[i]`` holds the CoNLL-U heads of the ``n_i`` words of sentence ``i`` (1-based,
        0 = root) and ``punct[i]`` whether each word is punctuation. The heads must form a tree
        (every word reaches the root; several root words are allowed and then meet at the root).
        ``path`` (the feature file) names the source in the ElmolabError raised on bad input.
        """
        if not features:
            raise ElmolabError("no sentences", path)
        if not len(features) == len(heads) == len(punct):
            raise ElmolabError(
                f"{len(features)} sentences of features but {len(heads)} of heads and"
                f" {len(punct)} of punct",
                path,
            )
        stacked, lengths = stack_sentences(features, path, min_length=1)
        for i, n in enumerate(lengths):
            _check_heads(heads[i], len(punct[i]), n, i, path)
        return cls(
            features=stacked,
            sentence_lengths=lengths,
            heads=torch.from_numpy(np.concatenate([np.asarray(h, dtype=np.int64) for h in heads])),
            punct=torch.from_numpy(np.concatenate([np.asarray(p, dtype=bool) for p in punct])),
        )

    @property
    def num_layers(self) -> int:
        return self.features.shape[0]

    @property
    def dim(self) -> int:
        return self.features.shape[2]

    def sentence_heads(self) -> list[np.ndarray]:
        """Each sentence's heads ``(n_i,)`` (CoNLL-U, 1-based, 0 = root)."""
        return [h.numpy() for h in self.heads.split(self.sentence_lengths)]

    def sentence_punct(self) -> list[np.ndarray]:
        """Each sentence's punctuation mask ``(n_i,)`` bool."""
        return [p.numpy() for p in self.punct.split(self.sentence_lengths)]


def _check_heads(
    heads: Sequence[int],
    punct_count: int,
    n: int,
    sentence: int,
    path: str | PathLike[str] | None,
) -> None:
    if len(heads) != n or punct_count != n:
        raise ElmolabError(
            f"sentence {sentence}: {n} feature vectors but {len(heads)} heads and"
            f" {punct_count} punct flags",
            path,
        )
    array = np.asarray(heads, dtype=np.int64)  # (n,)
    outside = np.flatnonzero((array < 0) | (array > n))
    if len(outside):
        raise ElmolabError(
            f"sentence {sentence}: head {array[outside[0]]} of word {outside[0] + 1}"
            f" outside 0..{n}",
            path,
        )
    # Pointer doubling: after ceil(log2 n) + 1 squarings each word points 2^k >= n steps up,
    # which is the root (index n, its own parent) unless the word is caught in a cycle.
    up = np.append(np.where(array == 0, n, array - 1), n)  # (n + 1,)
    for _ in range(math.ceil(math.log2(n)) + 1):
        up = up[up]
    stuck = np.flatnonzero(up[:n] != n)
    if len(stuck):
        raise ElmolabError(
            f"sentence {sentence}: the heads do not form a tree (word {stuck[0] + 1} never"
            " reaches the root)",
            path,
        )


@dataclass(frozen=True)
class TreeProbeConfig:
    """Hyperparameters of one tree-probe run; the defaults keep a run to seconds on 1 CPU thread."""

    lr: float = 2e-3  # Adam; near the best dev scores within ~5 epochs of 200k words
    batch_tokens: int = 1024  # padded words per batch: ~200 steps per epoch of 200k words
    max_epochs: int = 20
    patience: int = 2  # epochs without a better dev score (deparc) or loss (structural)
    # The lr is multiplied by this after each epoch without a better dev score, as in H&M: at a
    # fixed lr the structural probe's dev loss oscillates above its floor.
    lr_decay: float = 0.1
    layer_norm: bool = False  # normalize each layer before mixing (statistics per batch)
    l2_lambda: float = 0.0  # L2 penalty on the learned scalar-mix logits w
    rank: int = 128  # structural probe: rows of B (H&M probe ranks 64..128 suffice for syntax)
    root: RootVector = "learned"  # deparc: the root candidate's vector, learned or fixed zeros

    def __post_init__(self) -> None:
        if self.root not in ("learned", "zeros"):
            raise ValueError(f"unknown root vector {self.root!r} (expected 'learned' or 'zeros')")
        for name in ("batch_tokens", "max_epochs", "patience", "rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0 or not 0 < self.lr_decay <= 1:
            raise ValueError(f"need lr > 0 and 0 < lr_decay <= 1, got {self.lr}, {self.lr_decay}")


# --- Batches of whole sentences -----------------------------------------------------------------


@dataclass(frozen=True)
class SentenceBatch:
    """Sentences padded to a common length: where each slot's word sits in the split."""

    sentences: torch.Tensor  # (batch,) int64 indices of the sentences in the split
    tokens: torch.Tensor  # (batch, n_max) int64 flat token index of each slot, 0 at padding
    mask: torch.Tensor  # (batch, n_max) bool, True at real words


def plan_batches(sentence_lengths: Sequence[int], batch_tokens: int) -> list[SentenceBatch]:
    """Cut the sentences, sorted by length, into batches of at most ``batch_tokens`` padded words.

    Sorting (stable, so ties keep their order) keeps the padding small; a sentence longer than
    ``batch_tokens`` gets a batch of its own. The plan is fixed; :func:`padded_batches` shuffles
    the order in which its batches are visited.
    """
    lengths = np.asarray(sentence_lengths, dtype=np.int64)  # (sentences,)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])  # (sentences,)
    order = np.argsort(lengths, kind="stable")
    groups: list[list[int]] = [[]]
    for sentence in order.tolist():
        # Sorted ascending, so this sentence is the longest of its batch.
        if groups[-1] and (len(groups[-1]) + 1) * lengths[sentence] > batch_tokens:
            groups.append([])
        groups[-1].append(sentence)
    plan = []
    for group in groups:
        n_max = int(lengths[group].max())
        slots = np.arange(n_max)  # (n_max,)
        mask = slots[None, :] < lengths[group, None]  # (batch, n_max)
        tokens = np.where(mask, offsets[group, None] + slots[None, :], 0)  # (batch, n_max)
        plan.append(
            SentenceBatch(
                sentences=torch.tensor(group),
                tokens=torch.from_numpy(tokens),
                mask=torch.from_numpy(mask),
            )
        )
    return plan


def padded_batches(
    rows: torch.Tensor,
    plan: Sequence[SentenceBatch],
    generator: torch.Generator | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(batch number in plan, padded float32 features)`` for each batch of ``plan``.

    ``rows`` are a split's layers ``(num_layers, tokens, dim)``, giving
    ``(num_layers, batch, n_max, dim)``, or its mixed features ``(tokens, mixed_dim)``, giving
    ``(batch, n_max, mixed_dim)``. Padding slots hold the split's first word (finite, masked by
    ``plan[number].mask``). With a ``generator`` the batches come in a random order, else in plan
    order.
    """
    if rows.dim() not in (2, 3):
        raise ValueError(f"rows must be (layers, tokens, dim) or (tokens, dim), got {rows.shape}")
    token_axis = rows.dim() - 2
    order = (
        torch.randperm(len(plan), generator=generator).tolist()
        if generator is not None
        else range(len(plan))
    )
    for number in order:
        tokens = plan[number].tokens  # (batch, n_max)
        gathered = rows.index_select(token_axis, tokens.flatten()).float()  # (.., batch * n_max, d)
        yield number, gathered.unflatten(token_axis, tokens.shape)  # (.., batch, n_max, d)


def _mixed_batch(
    mixer: FeatureMixer, inputs: torch.Tensor, mask: torch.Tensor, precomputed: bool
) -> torch.Tensor:
    """``(batch, n_max, mixed_dim)`` from a padded batch of :func:`padded_batches`."""
    return inputs if precomputed else mixer(inputs, mask)


@torch.no_grad()
def _precompute(mixer: FeatureMixer, features: torch.Tensor) -> torch.Tensor:
    """A split's fixed mix: ``(num_layers, tokens, dim)`` -> ``(tokens, mixed_dim)`` float32."""
    return torch.cat([mixer(chunk.float()) for chunk in features.split(PRECOMPUTE_CHUNK, dim=1)])


def _check_compatible(train: TreeDataset, dev: TreeDataset, test: TreeDataset) -> None:
    for name, split in (("dev", dev), ("test", test)):
        if (split.num_layers, split.dim) != (train.num_layers, train.dim):
            raise ValueError(
                f"{name} features are ({split.num_layers}, tokens, {split.dim}),"
                f" train's ({train.num_layers}, tokens, {train.dim})"
            )


# A batch's mean loss and how many items (words, sentences) it averages.
LossAndCount = tuple[torch.Tensor, int]


@dataclass
class _Setup:
    """What both tree probes build before training: the mixer and the probe's head in one model,
    Adam over their trainable parameters, each split's rows (mixed once when the mix is frozen)
    and batch plan, and the shuffling generator."""

    mixer: FeatureMixer
    head: nn.Module
    model: nn.Module
    optimizer: torch.optim.Optimizer
    precomputed: bool
    shuffle: torch.Generator
    rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # train, dev, test
    plans: tuple[list[SentenceBatch], list[SentenceBatch], list[SentenceBatch]]


def _set_up(
    train: TreeDataset,
    dev: TreeDataset,
    test: TreeDataset,
    mode: FeatureMode,
    seed: int,
    config: TreeProbeConfig,
    build_head: Callable[[int], nn.Module],
) -> _Setup:
    """Seed, build and prepare a tree probe whose head ``build_head(mixed_dim)`` gives."""
    _check_compatible(train, dev, test)
    torch.manual_seed(seed)
    shuffle = torch.Generator().manual_seed(seed)
    mixer = build_feature_mixer(
        mode, train.num_layers, layer_norm=config.layer_norm, l2_lambda=config.l2_lambda
    )
    head = build_head(mixer.output_dim(train.dim))
    model = nn.ModuleDict({"mixer": mixer, "head": head})
    precomputed = mixer.precomputable
    rows = tuple(
        _precompute(mixer, split.features) if precomputed else split.features
        for split in (train, dev, test)
    )
    plans = (
        plan_batches(train.sentence_lengths, config.batch_tokens),
        plan_batches(dev.sentence_lengths, EVAL_BATCH_TOKENS),
        plan_batches(test.sentence_lengths, EVAL_BATCH_TOKENS),
    )
    optimizer = torch.optim.Adam(_trainable(model), lr=config.lr)
    return _Setup(mixer, head, model, optimizer, precomputed, shuffle, rows, plans)  # type: ignore[arg-type]


def _fit(
    setup: _Setup,
    config: TreeProbeConfig,
    batch_loss: Callable[[int, SentenceBatch, torch.Tensor], LossAndCount],
    dev_score: Callable[[], float],
    *,
    lower_is_better: bool,
) -> tuple[list[EpochRecord], float, int]:
    """The tree probes' training loop; leaves ``setup.model`` in its best dev state.

    Each epoch visits the training batches in a shuffled order, taking an Adam step on
    ``batch_loss(number, batch, mixed)`` (a loss and how many items it averages) plus the mix
    penalty, then scores dev: an epoch without a better dev score multiplies the lr by
    ``config.lr_decay``, ``config.patience`` of them in a row stop training (as does
    ``config.max_epochs``). Returns the history (train loss per item, dev score), the best dev
    score and its 1-based epoch.
    """
    sign = -1.0 if lower_is_better else 1.0
    train_rows, plan = setup.rows[0], setup.plans[0]
    history: list[EpochRecord] = []
    best, best_epoch, best_state = float("-inf"), 0, copy.deepcopy(setup.model.state_dict())
    for epoch in range(1, config.max_epochs + 1):
        setup.model.train()
        total_loss, items = 0.0, 0
        for number, inputs in padded_batches(train_rows, plan, setup.shuffle):
            batch = plan[number]
            mixed = _mixed_batch(setup.mixer, inputs, batch.mask, setup.precomputed)
            loss, count = batch_loss(number, batch, mixed)  # mixed: (batch, n, mixed_dim)
            loss = loss + setup.mixer.regularization()
            setup.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            setup.optimizer.step()
            total_loss += loss.item() * count
            items += count
        score = dev_score()
        history.append(EpochRecord(epoch, total_loss / items, score))
        if sign * score > best:
            best, best_epoch = sign * score, epoch
            best_state = copy.deepcopy(setup.model.state_dict())
        elif epoch - best_epoch >= config.patience:
            break
        else:
            _decay_lr(setup.optimizer, config.lr_decay)
    setup.model.load_state_dict(best_state)
    return history, sign * best, best_epoch


def _decay_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] *= factor


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _mix_summary(mixer: FeatureMixer) -> tuple[list[float] | None, float | None]:
    if isinstance(mixer, ScalarMix):
        return mixer.weights(), mixer.gamma_value()
    return None, None


# --- deparc: which word is each word's head -----------------------------------------------------


class ArcScorer(nn.Module):
    """``score(i, j) = m_i^T W m_j + b^T m_j``: how likely word ``j`` is word ``i``'s head.

    Candidate 0 is the root, represented by a vector ``r`` (learned from zeros with
    ``root="learned"``, fixed zeros with ``root="zeros"``, when its score is always 0); candidate
    ``j >= 1`` is word ``j``. A word cannot head itself, nor can padding head anything: those
    scores are ``-inf``. ``W``, ``b`` and ``r`` start at zero (all candidates equally likely);
    the loss is convex in ``W`` and ``b``.

    ``forward``: ``mixed (batch, n, dim)``, ``mask (batch, n)`` bool -> ``(batch, n, 1 + n)``.
    """

    def __init__(self, dim: int, root: RootVector = "learned") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.root = nn.Parameter(torch.zeros(dim), requires_grad=root == "learned")

    def forward(self, mixed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, n, dim = mixed.shape
        root = self.root.expand(batch, 1, dim)  # (batch, 1, dim)
        candidates = torch.cat([root, mixed], dim=1)  # (batch, 1 + n, dim)
        bilinear = (mixed @ self.weight) @ candidates.transpose(1, 2)  # (batch, n, 1 + n)
        prior = candidates @ self.bias  # (batch, 1 + n)
        scores = bilinear + prior[:, None, :]  # (batch, n, 1 + n)
        self_arc = F.pad(torch.eye(n, dtype=torch.bool), (1, 0))  # (n, 1 + n): [i, 1 + i]
        padding = F.pad(~mask, (1, 0))  # (batch, 1 + n): the root is never padding
        return scores.masked_fill(self_arc | padding[:, None, :], float("-inf"))


def train_arc_probe(
    train: TreeDataset,
    dev: TreeDataset,
    test: TreeDataset,
    *,
    mode: FeatureMode | str,
    seed: int,
    config: TreeProbeConfig = TreeProbeConfig(),
) -> ProbeResult:
    """Train the ``deparc`` probe (and its scalar mix) on ``train``, select on dev UAS, score test.

    Each word's head is the argmax of :class:`ArcScorer` over the root and the other words
    (no tree decoding); the loss is the cross-entropy with the gold head, averaged over the batch's
    words. UAS counts every word, punctuation included. Each epoch visits the batches of
    :func:`plan_batches` in a shuffled order and scores dev; an epoch without a better dev UAS
    multiplies the lr by ``config.lr_decay``, ``config.patience`` of them in a row stop training
    (as does ``config.max_epochs``), and the best dev state scores test.

    ``test_predictions`` holds each test word's predicted head as in CoNLL-U (``"0"`` = root);
    ``per_sentence_test`` the correct heads and the words of each test sentence.
    """
    started = time.perf_counter()
    mode = FeatureMode.parse(mode)
    setup = _set_up(train, dev, test, mode, seed, config, lambda dim: ArcScorer(dim, config.root))
    mixer, scorer, precomputed = setup.mixer, setup.head, setup.precomputed
    _, dev_rows, test_rows = setup.rows
    _, dev_plan, test_plan = setup.plans

    def batch_loss(
        number: int, batch: SentenceBatch, mixed: torch.Tensor
    ) -> tuple[torch.Tensor, int]:
        scores = scorer(mixed, batch.mask)[batch.mask]  # (words, 1 + n)
        gold = train.heads[batch.tokens[batch.mask]]  # (words,)
        return F.cross_entropy(scores, gold), len(gold)

    def dev_uas() -> float:
        return _uas(_predict_heads(mixer, scorer, dev_rows, dev_plan, precomputed), dev.heads)

    history, best_uas, best_epoch = _fit(setup, config, batch_loss, dev_uas, lower_is_better=False)
    predicted = _predict_heads(mixer, scorer, test_rows, test_plan, precomputed)  # (tokens,)
    correct = (predicted == test.heads).long()  # (tokens,)
    mix_weights, gamma = _mix_summary(mixer)
    return ProbeResult(
        features=mode.value,
        metric="uas",
        seed=seed,
        dev=best_uas,
        test=_uas(predicted, test.heads),
        best_epoch=best_epoch,
        epochs=len(history),
        mix_weights=mix_weights,
        gamma=gamma,
        wall_seconds=time.perf_counter() - started,
        history=history,
        test_predictions=[
            [str(head) for head in sentence.tolist()]
            for sentence in predicted.split(test.sentence_lengths)
        ],
        per_sentence_test={
            "correct": [int(c.sum()) for c in correct.split(test.sentence_lengths)],
            "total": list(test.sentence_lengths),
        },
    )


def _uas(predicted: torch.Tensor, gold: torch.Tensor) -> float:
    return (predicted == gold).double().mean().item()


@torch.no_grad()
def _predict_heads(
    mixer: FeatureMixer,
    scorer: ArcScorer,
    rows: torch.Tensor,
    plan: Sequence[SentenceBatch],
    precomputed: bool,
) -> torch.Tensor:
    """Each word's argmax head ``(tokens,)`` int64, as in CoNLL-U (0 = root)."""
    mixer.eval()
    scorer.eval()
    predicted = torch.empty(sum(int(b.mask.sum()) for b in plan), dtype=torch.int64)
    for number, inputs in padded_batches(rows, plan):
        batch = plan[number]
        mixed = _mixed_batch(mixer, inputs, batch.mask, precomputed)  # (batch, n, mixed_dim)
        heads = scorer(mixed, batch.mask).argmax(dim=-1)  # (batch, n)
        predicted[batch.tokens[batch.mask]] = heads[batch.mask]
    return predicted


# --- The structural probe: tree distances as squared distances ----------------------------------


class StructuralProbe(nn.Module):
    """``d(i, j) = ||B (m_i - m_j)||^2``: predicted tree distances (Hewitt and Manning 2019).

    ``B`` is ``(rank, dim)``, initialised uniform in (-0.05, 0.05) as in H&M. The squared norm is
    expanded as ``|t_i|^2 + |t_j|^2 - 2 t_i . t_j`` with ``t = B m`` (memory ``n^2`` per sentence
    rather than ``n^2 rank``) and clamped at 0 against rounding.

    ``forward``: ``mixed (batch, n, dim)`` -> ``(batch, n, n)``.
    """

    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.proj = nn.Parameter(torch.empty(rank, dim).uniform_(-0.05, 0.05))

    def forward(self, mixed: torch.Tensor) -> torch.Tensor:
        projected = mixed @ self.proj.T  # (batch, n, rank)
        norms = (projected**2).sum(dim=-1)  # (batch, n)
        gram = projected @ projected.transpose(1, 2)  # (batch, n, n)
        return (norms[:, :, None] + norms[:, None, :] - 2 * gram).clamp(min=0)  # (batch, n, n)


def train_structural_probe(
    train: TreeDataset,
    dev: TreeDataset,
    test: TreeDataset,
    *,
    mode: FeatureMode | str,
    seed: int,
    config: TreeProbeConfig = TreeProbeConfig(),
) -> ProbeResult:
    """Train H&M's structural probe (and its scalar mix) on ``train``; select on dev loss.

    The loss of a sentence of ``n`` words is ``sum_{i,j} |d(i, j) - tree(i, j)| / n^2`` over all
    word pairs (:class:`StructuralProbe`, :func:`tree_distances`), averaged over the batch's
    sentences (H&M's L1 loss). Each epoch visits the batches of :func:`plan_batches` in a shuffled
    order; an epoch without a lower dev loss multiplies the lr by ``config.lr_decay``,
    ``config.patience`` of them in a row stop training (as does ``config.max_epochs``).
    **``EpochRecord.dev_metric`` is that dev loss (mean over dev sentences; lower is better)**,
    and ``train_loss`` the mean over the epoch's sentences.

    The best state then scores dev and test: ``dev``/``test`` are UUAS (:func:`uuas`), and
    ``extra`` holds ``dev_dspr`` and ``test_dspr`` (:func:`distance_spearman`).
    ``test_predictions`` holds each test sentence's predicted spanning-tree edges as ``"i-j"``
    (1-based, ``i < j``, non-punctuation words); ``per_sentence_test`` the correct and gold edges.
    """
    started = time.perf_counter()
    mode = FeatureMode.parse(mode)
    setup = _set_up(
        train, dev, test, mode, seed, config, lambda dim: StructuralProbe(dim, config.rank)
    )
    mixer, probe, precomputed = setup.mixer, setup.head, setup.precomputed
    _, dev_rows, test_rows = setup.rows
    train_plan, dev_plan, test_plan = setup.plans
    train_gold, dev_gold, test_gold = (
        [tree_distances(heads) for heads in split.sentence_heads()] for split in (train, dev, test)
    )
    train_targets = _padded_distances(train_gold, train_plan)
    dev_targets = _padded_distances(dev_gold, dev_plan)

    def batch_loss(
        number: int, batch: SentenceBatch, mixed: torch.Tensor
    ) -> tuple[torch.Tensor, int]:
        losses = _sentence_losses(probe(mixed), train_targets[number], batch.mask)  # (batch,)
        return losses.mean(), len(losses)

    def dev_loss() -> float:
        return _dev_loss(mixer, probe, dev_rows, dev_plan, dev_targets, precomputed)

    history, _, best_epoch = _fit(setup, config, batch_loss, dev_loss, lower_is_better=True)
    dev_predicted = _predict_distances(mixer, probe, dev_rows, dev_plan, precomputed)
    test_predicted = _predict_distances(mixer, probe, test_rows, test_plan, precomputed)
    dev_uuas = uuas(dev_predicted, dev_gold, dev.sentence_punct())
    test_uuas = uuas(test_predicted, test_gold, test.sentence_punct())
    mix_weights, gamma = _mix_summary(mixer)
    return ProbeResult(
        features=mode.value,
        metric="uuas",
        seed=seed,
        dev=dev_uuas.score,
        test=test_uuas.score,
        best_epoch=best_epoch,
        epochs=len(history),
        mix_weights=mix_weights,
        gamma=gamma,
        wall_seconds=time.perf_counter() - started,
        history=history,
        test_predictions=[
            [f"{i + 1}-{j + 1}" for i, j in edges] for edges in test_uuas.predicted_edges
        ],
        per_sentence_test={"correct": test_uuas.correct, "total": test_uuas.total},
        extra={
            "dev_dspr": distance_spearman(dev_predicted, dev_gold),
            "test_dspr": distance_spearman(test_predicted, test_gold),
        },
    )


def _padded_distances(
    gold: Sequence[np.ndarray], plan: Sequence[SentenceBatch]
) -> list[torch.Tensor]:
    """The gold distances of each batch of ``plan``, ``(batch, n_max, n_max)`` float32, 0-padded."""
    targets = []
    for batch in plan:
        n_max = batch.mask.shape[1]
        padded = np.zeros((len(batch.sentences), n_max, n_max), dtype=np.float32)
        for slot, sentence in enumerate(batch.sentences.tolist()):
            n = len(gold[sentence])
            padded[slot, :n, :n] = gold[sentence]
        targets.append(torch.from_numpy(padded))
    return targets


def _sentence_losses(
    predicted: torch.Tensor, gold: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """H&M's L1 loss per sentence, ``sum_{i,j} |d - tree| / n^2``: ``(batch,)``."""
    pairs = mask[:, :, None] & mask[:, None, :]  # (batch, n_max, n_max)
    lengths = mask.sum(dim=1).float()  # (batch,)
    errors = torch.where(pairs, (predicted - gold).abs(), 0.0)  # (batch, n_max, n_max)
    return errors.sum(dim=(1, 2)) / lengths**2  # (batch,)


@torch.no_grad()
def _dev_loss(
    mixer: FeatureMixer,
    probe: StructuralProbe,
    rows: torch.Tensor,
    plan: Sequence[SentenceBatch],
    targets: Sequence[torch.Tensor],
    precomputed: bool,
) -> float:
    """The mean loss over a split's sentences (the mix penalty left out)."""
    mixer.eval()
    probe.eval()
    total, sentences = 0.0, 0
    for number, inputs in padded_batches(rows, plan):
        batch = plan[number]
        mixed = _mixed_batch(mixer, inputs, batch.mask, precomputed)  # (batch, n, mixed_dim)
        total += _sentence_losses(probe(mixed), targets[number], batch.mask).sum().item()
        sentences += len(batch.sentences)
    return total / sentences


@torch.no_grad()
def _predict_distances(
    mixer: FeatureMixer,
    probe: StructuralProbe,
    rows: torch.Tensor,
    plan: Sequence[SentenceBatch],
    precomputed: bool,
) -> list[np.ndarray]:
    """Each sentence's predicted squared distances ``(n_i, n_i)`` float32, in split order."""
    mixer.eval()
    probe.eval()
    predicted: list[np.ndarray] = [np.empty(0)] * sum(len(b.sentences) for b in plan)
    for number, inputs in padded_batches(rows, plan):
        batch = plan[number]
        mixed = _mixed_batch(mixer, inputs, batch.mask, precomputed)  # (batch, n, mixed_dim)
        distances = probe(mixed).numpy()  # (batch, n_max, n_max)
        for slot, (sentence, n) in enumerate(
            zip(batch.sentences.tolist(), batch.mask.sum(dim=1).tolist(), strict=True)
        ):
            predicted[sentence] = distances[slot, :n, :n]
    return predicted


# --- Trees, spanning trees and the structural probe's metrics -----------------------------------


def tree_distances(heads: Sequence[int] | np.ndarray) -> np.ndarray:
    """Path lengths between all words in the undirected dependency tree: ``(n, n)`` int64.

    ``heads`` are CoNLL-U heads ``(n,)`` (1-based, 0 = root). With the ancestors-or-self of
    each word as rows of a boolean matrix ``A``, ``depth = A 1`` and the depth of the lowest
    common ancestor of ``i`` and ``j`` is ``(A A^T)_{ij}``, so
    ``d(i, j) = depth_i + depth_j - 2 (A A^T)_{ij}``. Words under different root words meet at
    the root, as in H&M's code. Raises ValueError when the heads do not form a tree.
    """
    heads = np.asarray(heads, dtype=np.int64)  # (n,)
    n = len(heads)
    if ((heads < 0) | (heads > n)).any():
        raise ValueError(f"heads must lie in 0..{n}, got {heads.tolist()}")
    parent = heads - 1  # (n,) 0-based, -1 at root words
    ancestors = np.eye(n, dtype=np.float32)  # (n, n): [i, k] = 1 if k is i or above i
    words, above = np.arange(n), parent.copy()  # (n,), (n,): one ancestor per word per step
    for _ in range(n):
        climbing = above >= 0
        if not climbing.any():
            break
        ancestors[words[climbing], above[climbing]] = 1.0
        above[climbing] = parent[above[climbing]]
    if (above >= 0).any():
        raise ValueError(f"heads do not form a tree: {heads.tolist()}")
    depth = ancestors.sum(axis=1)  # (n,)
    common = ancestors @ ancestors.T  # (n, n)
    return (depth[:, None] + depth[None, :] - 2 * common).round().astype(np.int64)  # (n, n)


def minimum_spanning_tree(distances: np.ndarray) -> list[tuple[int, int]]:
    """Prim's minimum spanning tree of a complete graph: ``(n, n)`` -> ``n - 1`` edges ``(i, j)``.

    Edges are 0-based with ``i < j``, in the order Prim adds them. ``distances`` should be
    symmetric and finite; only its upper triangle is read. Ties go to the lowest index: the tree
    grows from word 0, adds the lowest-indexed of the nearest outside words, and links it to the
    lowest-indexed of its nearest tree words. ``O(n^2)``.
    """
    n = distances.shape[0]
    if distances.shape != (n, n) or not np.isfinite(distances).all():
        raise ValueError(f"expected a finite square matrix, got shape {distances.shape}")
    if n < 2:
        return []
    upper = np.triu(distances, 1)
    symmetric = (upper + upper.T).astype(np.float64)  # (n, n)
    in_tree = np.zeros(n, dtype=bool)  # (n,)
    in_tree[0] = True
    nearest = symmetric[0].copy()  # (n,) each word's distance to the tree
    link = np.zeros(n, dtype=np.int64)  # (n,) its nearest tree word
    edges = []
    for _ in range(n - 1):
        word = int(np.argmin(np.where(in_tree, np.inf, nearest)))
        edges.append((min(word, int(link[word])), max(word, int(link[word]))))
        in_tree[word] = True
        row = symmetric[word]  # (n,)
        closer = ~in_tree & ((row < nearest) | ((row == nearest) & (word < link)))  # (n,)
        nearest = np.where(closer, row, nearest)
        link = np.where(closer, word, link)
    return edges


def spanning_tree_edges(distances: np.ndarray, keep: np.ndarray) -> list[tuple[int, int]]:
    """The minimum spanning tree over the words where ``keep`` ``(n,)`` is True.

    Edges ``(i, j)`` index the whole sentence (0-based, ``i < j``); fewer than 2 kept words give
    no edges.
    """
    kept = np.flatnonzero(keep)  # (k,) ascending, so i < j survives the mapping
    return [
        (int(kept[i]), int(kept[j]))
        for i, j in minimum_spanning_tree(distances[np.ix_(kept, kept)])
    ]


@dataclass(frozen=True)
class UuasReport:
    """UUAS over a split and its parts."""

    score: float  # correct edges / gold edges over all sentences (micro); NaN without gold edges
    correct: list[int]  # per sentence: predicted edges that are gold edges
    total: list[int]  # per sentence: gold edges (non-punctuation words - 1, or 0)
    predicted_edges: list[list[tuple[int, int]]]  # per sentence, sorted, 0-based, i < j


def uuas(
    predicted: Sequence[np.ndarray],
    gold: Sequence[np.ndarray],
    punct: Sequence[np.ndarray],
) -> UuasReport:
    """Undirected unlabelled attachment score of the predicted distances, as H&M's reporter.

    Per sentence, among its non-punctuation words (``punct[s]`` ``(n,)`` False), the predicted
    edges are the minimum spanning tree of the predicted distances ``(n, n)`` and the gold edges
    that of the gold tree distances ``(n, n)`` (the gold arcs between those words when
    punctuation words are leaves); edges are undirected. Sentences with fewer than 2
    non-punctuation words have no edges.
    """
    if not len(predicted) == len(gold) == len(punct):
        raise ValueError(f"{len(predicted)} predicted, {len(gold)} gold, {len(punct)} punct")
    correct, total, predicted_edges = [], [], []
    for predicted_distances, gold_distances, is_punct in zip(predicted, gold, punct, strict=True):
        keep = ~np.asarray(is_punct, dtype=bool)  # (n,)
        edges = sorted(spanning_tree_edges(predicted_distances, keep))
        gold_edges = set(spanning_tree_edges(gold_distances, keep))
        correct.append(sum(edge in gold_edges for edge in edges))
        total.append(len(gold_edges))
        predicted_edges.append(edges)
    score = sum(correct) / sum(total) if sum(total) else float("nan")
    return UuasReport(score, correct, total, predicted_edges)


def distance_spearman(
    predicted: Sequence[np.ndarray],
    gold: Sequence[np.ndarray],
    lengths: tuple[int, int] = DSPR_LENGTHS,
) -> float:
    """DSpr, H&M's distance Spearman: a macro average over sentence lengths.

    For each sentence of ``lengths[0]..lengths[1]`` words (all words), each word's row of
    predicted distances ``(n,)`` is rank-correlated (Spearman, average ranks for ties) with its
    row of gold distances; these are averaged over the words of all sentences of one length, and
    the per-length means averaged over the lengths present. A constant predicted row, whose
    correlation is undefined, counts as 0. NaN when no sentence has a length in range.
    """
    by_length: dict[int, list[float]] = defaultdict(list)
    for predicted_distances, gold_distances in zip(predicted, gold, strict=True):
        n = len(gold_distances)
        if lengths[0] <= n <= lengths[1]:
            by_length[n].extend(_row_spearman(predicted_distances, gold_distances).tolist())
    if not by_length:
        return float("nan")
    return float(np.mean([np.mean(by_length[n]) for n in sorted(by_length)]))


def _row_spearman(predicted: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Spearman's rho between matching rows of two ``(n, n)`` matrices: ``(n,)``."""
    ranks = [rankdata(matrix, axis=1) for matrix in (predicted, gold)]  # (n, n) each
    centered = [r - r.mean(axis=1, keepdims=True) for r in ranks]  # (n, n) each
    covariance = (centered[0] * centered[1]).sum(axis=1)  # (n,)
    scale = np.sqrt((centered[0] ** 2).sum(axis=1) * (centered[1] ** 2).sum(axis=1))  # (n,)
    return np.divide(covariance, scale, out=np.zeros_like(covariance), where=scale > 0)
