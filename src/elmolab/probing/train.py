"""Train one probe on frozen features: Adam, early stopping on dev, test evaluated once.

Token probes need no sentence structure, so a split is kept as one flat ``(layers, tokens, dim)``
tensor (the layer axis first, as in feature files, so that mixing is one matrix-vector product)
and training draws shuffled token minibatches from it; the pair probe finds each token's head by
its flat index. When the feature mixer learns nothing (single layers, ``mean``, ``concat``) the
mixed features are computed once per split and training touches only those.

A run is deterministic given its seed: ``torch.manual_seed(seed)`` for the initialisation and
dropout, and a generator seeded with ``seed`` for the shuffling.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from os import PathLike

import numpy as np
import torch
from torch.nn import functional as F

from elmolab.errors import ElmolabError
from elmolab.models.scalar_mix import FeatureMode, ScalarMix, build_feature_mixer
from elmolab.probing.metrics import LabelVocabulary, TaskMetric, task_score
from elmolab.probing.probes import ArcPair, ProbeKind, ProbeModel, RootVector, build_classifier

EVAL_CHUNK = 16384  # tokens per forward pass when precomputing or predicting (no gradients)


@dataclass(frozen=True)
class FeatureDataset:
    """One split of a probing task in memory: each token's layers and label, sentence by sentence.

    Attributes
    ----------
    features : ``torch.Tensor``
        ``(num_layers, tokens, dim)``, float32, float16 or bfloat16 (batches become float32).
    labels : ``torch.Tensor``
        ``(tokens,)`` int64 label ids.
    sentence_lengths : ``tuple[int, ...]``
        Tokens per sentence, in order (they sum to ``tokens``).
    heads : ``torch.Tensor``, optional
        ``(tokens,)`` int64, for the pair task: the flat index of each token's head, -1 for root.
    """

    features: torch.Tensor
    labels: torch.Tensor
    sentence_lengths: tuple[int, ...]
    heads: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.features.dim() != 3 or not self.features.is_floating_point():
            raise ValueError(
                f"features must be float (layers, tokens, dim), got {self.features.dtype}"
                f" {tuple(self.features.shape)}"
            )
        tokens = self.features.shape[1]
        if self.labels.shape != (tokens,) or sum(self.sentence_lengths) != tokens:
            raise ValueError(
                f"{tokens} feature rows, {self.labels.numel()} labels and"
                f" {sum(self.sentence_lengths)} tokens in sentences"
            )
        if self.heads is not None and self.heads.shape != (tokens,):
            raise ValueError(f"{tokens} tokens but {self.heads.numel()} heads")

    @classmethod
    def from_sentences(
        cls,
        features: Sequence[np.ndarray | torch.Tensor],
        labels: Sequence[Sequence[int]],
        heads: Sequence[Sequence[int]] | None = None,
        *,
        path: str | PathLike[str] | None = None,
    ) -> FeatureDataset:
        """Concatenate per-sentence features ``(num_layers, n_i, dim)``, as in feature files.

        ``labels[i]`` holds the ``n_i`` label ids of sentence ``i``; ``heads[i]``, for the pair
        task, the 1-based head of each word (0 = root), as in CoNLL-U. ``path`` (the feature file)
        names the source in the ElmolabError raised when counts disagree.
        """
        if not features:
            raise ElmolabError("no sentences", path)
        if len(features) != len(labels) or (heads is not None and len(heads) != len(features)):
            heads_count = "" if heads is None else f", {len(heads)} of heads"
            raise ElmolabError(
                f"{len(features)} sentences of features but {len(labels)} of labels{heads_count}",
                path,
            )
        stacked, lengths = stack_sentences(features, path)
        flat_heads: list[int] = []
        for i, n in enumerate(lengths):
            if len(labels[i]) != n:
                raise ElmolabError(
                    f"sentence {i}: {n} feature vectors but {len(labels[i])} labels", path
                )
            if heads is not None:
                flat_heads.extend(_flat_heads(heads[i], n, len(flat_heads), i, path))
        return cls(
            features=stacked,
            labels=torch.from_numpy(
                np.concatenate([np.asarray(sentence, dtype=np.int64) for sentence in labels])
            ),
            sentence_lengths=lengths,
            heads=None if heads is None else torch.tensor(flat_heads),
        )

    def subset(self, sentences: Sequence[int]) -> FeatureDataset:
        """The sentences ``sentences`` (indices, kept in the order given) of a token split."""
        if self.heads is not None:
            raise ValueError("subsets of pair splits are not supported (heads would move)")
        starts = np.concatenate([[0], np.cumsum(self.sentence_lengths)])
        rows = torch.from_numpy(
            np.concatenate(
                [np.arange(starts[i], starts[i + 1]) for i in sentences] or [np.zeros(0, int)]
            ).astype(np.int64)
        )
        return FeatureDataset(
            features=self.features.index_select(1, rows),
            labels=self.labels[rows],
            sentence_lengths=tuple(self.sentence_lengths[i] for i in sentences),
        )

    @property
    def num_layers(self) -> int:
        return self.features.shape[0]

    @property
    def dim(self) -> int:
        return self.features.shape[2]


def stack_sentences(
    features: Sequence[np.ndarray | torch.Tensor],
    path: str | PathLike[str] | None = None,
    *,
    min_length: int = 0,
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Per-sentence features ``(num_layers, n_i, dim)``, as in feature files, concatenated to
    ``(num_layers, tokens, dim)``, and the ``n_i``. A sentence of another number of layers or
    width, or of fewer than ``min_length`` tokens, is an ElmolabError naming ``path``."""
    first_shape = tuple(torch.as_tensor(features[0]).shape)
    sentences = []
    for i, sentence in enumerate(features):
        layers = torch.as_tensor(sentence)  # (num_layers, n_i, dim)
        if layers.dim() != 3 or layers.shape[::2] != first_shape[::2]:
            raise ElmolabError(
                f"sentence {i}: features of shape {tuple(layers.shape)}, expected"
                f" (num_layers, n_tokens, dim) with the layers and dim of {first_shape}",
                path,
            )
        if layers.shape[1] < min_length:
            raise ElmolabError(
                f"sentence {i}: {layers.shape[1]} tokens, at least {min_length} expected", path
            )
        sentences.append(layers)
    return torch.cat(sentences, dim=1), tuple(layers.shape[1] for layers in sentences)


def _flat_heads(
    heads: Sequence[int], n: int, offset: int, sentence: int, path: str | PathLike[str] | None
) -> list[int]:
    if len(heads) != n:
        raise ElmolabError(f"sentence {sentence}: {n} feature vectors but {len(heads)} heads", path)
    flat = []
    for head in heads:
        if not 0 <= head <= n:
            raise ElmolabError(f"sentence {sentence}: head {head} outside 0..{n}", path)
        flat.append(offset + head - 1 if head > 0 else -1)
    return flat


@dataclass(frozen=True)
class ProbeConfig:
    """Hyperparameters of one probe run; the defaults keep a run to seconds on 2 CPU cores."""

    probe: ProbeKind = "linear"  # the standard probe (Liu et al. 2019); "mlp" for capacity
    hidden_dim: int = 256  # MLP only
    dropout: float = 0.2  # MLP only
    root: RootVector = "learned"  # pair task: the head vector of words attached to the root
    lr: float = 3e-3  # with batch_size 1024: dev accuracy peaks after 2-4 epochs
    weight_decay: float = 0.0  # on the classifier only; the mix has its own l2_lambda
    batch_size: int = 1024  # tokens; ~200 steps per epoch of 200k tokens converge fast
    max_epochs: int = 20
    patience: int = 2  # epochs without a better dev score before stopping
    layer_norm: bool = False  # normalize each layer before mixing (statistics per batch)
    l2_lambda: float = 0.0  # L2 penalty on the learned scalar-mix logits w
    # An epoch takes at least this many training tokens, cycling through a small training set
    # (learning curves) several times, so that 1% of a task still gets enough steps and no more
    # dev evaluations than the full set. 0: one pass.
    min_epoch_tokens: int = 0


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    train_loss: float  # mean over the epoch's tokens, with the mix penalty
    dev_metric: float


@dataclass(frozen=True)
class ProbeResult:
    """What one probe run reports; ``dataclasses.asdict`` makes it JSON-ready.

    The names are the keys of a probe run's ``metrics.json`` that the report reads.
    """

    features: str  # the feature mode
    metric: str
    seed: int
    dev: float  # the dev metric of the best epoch
    test: float  # the test metric, evaluated once, with the best dev state
    best_epoch: int  # 1-based
    epochs: int  # epochs run
    mix_weights: list[float] | None  # the scalar mix's normalized weights; None for concat
    gamma: float | None  # None for concat
    wall_seconds: float
    history: list[EpochRecord] = field(repr=False)
    test_predictions: list[list[str]] = field(repr=False)  # predicted label per test token
    # Correctly labelled and all tokens per test sentence, for paired bootstrap tests.
    per_sentence_test: dict[str, list[int]] = field(repr=False)
    # Further scores of the best state, written to metrics.json as they are (e.g. the structural
    # probe's distance Spearman: {"dev_dspr": ..., "test_dspr": ...}).
    extra: dict[str, float] = field(default_factory=dict)


def train_probe(
    train: FeatureDataset,
    dev: FeatureDataset,
    test: FeatureDataset,
    vocabulary: LabelVocabulary,
    *,
    mode: FeatureMode | str,
    metric: TaskMetric | str,
    seed: int,
    config: ProbeConfig = ProbeConfig(),
) -> ProbeResult:
    """Train a probe (and its scalar mix) on ``train``, select the epoch on ``dev``, score ``test``.

    The splits hold label ids of ``vocabulary``; the probe has one output per train label. With
    ``heads`` in the splits the probe is a pair probe (dependency labels). Each epoch shuffles the
    training tokens, takes Adam steps on minibatches of ``config.batch_size`` tokens, and scores
    dev; training stops after ``config.patience`` epochs without a better dev score (or after
    ``config.max_epochs``), and the best dev state scores test.
    """
    started = time.perf_counter()
    mode, metric = FeatureMode.parse(mode), TaskMetric(metric)
    _check_compatible(train, dev, test, vocabulary)
    torch.manual_seed(seed)
    shuffle = torch.Generator().manual_seed(seed)

    mixer = build_feature_mixer(
        mode, train.num_layers, layer_norm=config.layer_norm, l2_lambda=config.l2_lambda
    )
    mixed_dim = mixer.output_dim(train.dim)
    arc_pair = None if train.heads is None else ArcPair(mixed_dim, config.root)
    classifier = build_classifier(
        config.probe,
        mixed_dim if arc_pair is None else 3 * mixed_dim,
        vocabulary.num_train_labels,
        config.hidden_dim,
        config.dropout,
    )
    model = ProbeModel(mixer, classifier, arc_pair)
    optimizer = torch.optim.Adam(
        [
            {"params": _trainable(mixer), "weight_decay": 0.0},
            {
                "params": _trainable(classifier) + _trainable(arc_pair),
                "weight_decay": config.weight_decay,
            },
        ],
        lr=config.lr,
    )
    precomputed = mixer.precomputable
    train_rows, dev_rows, test_rows = (
        _precompute(model, split.features) if precomputed else split.features
        for split in (train, dev, test)
    )

    history: list[EpochRecord] = []
    best_metric, best_epoch, best_state = float("-inf"), 0, copy.deepcopy(model.state_dict())
    for epoch in range(1, config.max_epochs + 1):
        model.train()
        total_loss = 0.0
        for batch in _epoch_batches(len(train.labels), config, shuffle):
            logits = _logits(model, train_rows, train.heads, batch, precomputed)  # (batch, labels)
            loss = F.cross_entropy(logits, train.labels[batch]) + mixer.regularization()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(batch)
        dev_metric = _score(model, dev, dev_rows, precomputed, metric, vocabulary)[0]
        seen = max(len(train.labels), config.min_epoch_tokens)
        history.append(EpochRecord(epoch, total_loss / seen, dev_metric))
        if dev_metric > best_metric:
            best_metric, best_epoch = dev_metric, epoch
            best_state = copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= config.patience:
            break

    model.load_state_dict(best_state)
    test_metric, test_predicted = _score(model, test, test_rows, precomputed, metric, vocabulary)
    return ProbeResult(
        features=mode.value,
        metric=metric.value,
        seed=seed,
        dev=best_metric,
        test=test_metric,
        best_epoch=best_epoch,
        epochs=len(history),
        mix_weights=mixer.weights() if isinstance(mixer, ScalarMix) else None,
        gamma=mixer.gamma_value() if isinstance(mixer, ScalarMix) else None,
        wall_seconds=time.perf_counter() - started,
        history=history,
        test_predictions=vocabulary.decode_sentences(test_predicted, test.sentence_lengths),
        per_sentence_test={
            "correct": _per_sentence_sums(test_predicted == test.labels, test.sentence_lengths),
            "total": list(test.sentence_lengths),
        },
    )


def _epoch_batches(
    tokens: int, config: ProbeConfig, shuffle: torch.Generator
) -> list[torch.Tensor]:
    """One epoch's minibatches of token indices: shuffled passes over the ``tokens`` training
    tokens until at least ``config.min_epoch_tokens`` are drawn (one pass when there are more)."""
    passes = max(1, -(-config.min_epoch_tokens // max(tokens, 1)))
    order = torch.cat([torch.randperm(tokens, generator=shuffle) for _ in range(passes)])
    return list(order.split(config.batch_size))


def _check_compatible(
    train: FeatureDataset, dev: FeatureDataset, test: FeatureDataset, vocabulary: LabelVocabulary
) -> None:
    if int(train.labels.max()) >= vocabulary.num_train_labels:
        raise ValueError(
            f"train label id {int(train.labels.max())} is not one of the"
            f" {vocabulary.num_train_labels} train labels of the vocabulary"
        )
    for name, split in (("dev", dev), ("test", test)):
        if (split.num_layers, split.dim) != (train.num_layers, train.dim):
            raise ValueError(
                f"{name} features are ({split.num_layers}, tokens, {split.dim}),"
                f" train's ({train.num_layers}, tokens, {train.dim})"
            )
        if (split.heads is None) != (train.heads is None):
            raise ValueError(f"heads in only one of train and {name}")


def _per_sentence_sums(values: torch.Tensor, sentence_lengths: Sequence[int]) -> list[int]:
    sentence_of_token = torch.repeat_interleave(torch.tensor(sentence_lengths))  # (tokens,)
    sums = torch.zeros(len(sentence_lengths), dtype=torch.long)
    return sums.index_add_(0, sentence_of_token, values.long()).tolist()


def _trainable(module: torch.nn.Module | None) -> list[torch.nn.Parameter]:
    return [] if module is None else [p for p in module.parameters() if p.requires_grad]


@torch.no_grad()
def _precompute(model: ProbeModel, features: torch.Tensor) -> torch.Tensor:
    """A split's fixed mixed features: ``(num_layers, tokens, dim)`` -> ``(tokens, mixed_dim)``."""
    return torch.cat([model.mix(chunk.float()) for chunk in features.split(EVAL_CHUNK, dim=1)])


def _logits(
    model: ProbeModel,
    rows: torch.Tensor,
    heads: torch.Tensor | None,
    batch: torch.Tensor,
    precomputed: bool,
) -> torch.Tensor:
    """Logits ``(batch, labels)`` of the tokens ``batch`` (flat indices) of one split.

    ``rows`` are the split's layers ``(num_layers, tokens, dim)``, or its mixed features
    ``(tokens, mixed_dim)`` when ``precomputed``.
    """
    token_axis = 0 if precomputed else 1
    inputs = rows.index_select(token_axis, batch).float()  # (num_layers, batch, dim) or mixed
    head_inputs = is_root = None
    if heads is not None:
        head_index = heads[batch]  # (batch,)
        is_root = head_index < 0  # (batch,)
        head_inputs = rows.index_select(token_axis, head_index.clamp(min=0)).float()  # as inputs
    if precomputed:
        return model.classify(inputs, head_inputs, is_root)
    return model(inputs, head_inputs, is_root)


@torch.no_grad()
def _score(
    model: ProbeModel,
    split: FeatureDataset,
    rows: torch.Tensor,
    precomputed: bool,
    metric: TaskMetric,
    vocabulary: LabelVocabulary,
) -> tuple[float, torch.Tensor]:
    """The split's ``metric`` and the predicted label ids ``(tokens,)``."""
    model.eval()
    predicted = torch.cat(
        [
            _logits(model, rows, split.heads, chunk, precomputed).argmax(dim=-1)
            for chunk in torch.arange(len(split.labels)).split(EVAL_CHUNK)
        ]
    )  # (tokens,)
    score = task_score(metric, predicted, split.labels, split.sentence_lengths, vocabulary)
    return score, predicted
