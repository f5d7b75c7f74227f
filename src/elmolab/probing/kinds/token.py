"""Token probes: a label per token (UPOS, chunks, NER), and per sentence (sentiment).

A sentence probe is the token probe on one item per sentence, its tokens' layers mean-pooled
(``elmolab.probing.datasets.pool_sentences``), with the token schedule: pooling and every mode's
mix are both linear maps of the layers, so pooling each layer first and then mixing is exactly
mixing each token and then pooling, ``mean_t sum_j gamma s_j h_jt = sum_j gamma s_j mean_t h_jt``
(a concatenation pools block by block), and the heads, their learned mixes included, train on the
pooled layers as token heads do. The layers are pooled once per split and standardized as pooled
items (``probe.standardize``, an affine map per dimension that a head's first map absorbs, as for
tokens). Both kinds are thus one module: the reference probe (:class:`TokenProbe`, its data
:class:`TokenData`), the batched heads (:class:`TokenProbes`) and their registration.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from elmolab.core.schema import EVAL_ROLES, ProbeSettings, TaskKind
from elmolab.data.labels import LabelVocabulary, TaskMetric
from elmolab.models.scalar_mix import normalize_layers
from elmolab.probing.datasets import FeatureDataset
from elmolab.probing.heads import (
    FitTrace,
    HeadClassifier,
    HeadEvaluation,
    HeadProbes,
    Part,
    ProbeResult,
    StepLoss,
    check_widths,
    per_sentence_sums,
    probe_result,
    scatter_heads,
)
from elmolab.probing.kinds.kind import ProbeKind, ProbeTask
from elmolab.probing.metrics import sentence_span_counts, task_score
from elmolab.probing.probes import (
    EVAL_TOKENS,
    Classifier,
    Evaluation,
    Head,
    LayerInput,
    Probe,
    epoch_order,
)
from elmolab.probing.settings import Schedule

# --- The reference ------------------------------------------------------------------------------


class LabelProbe(Probe):
    """A probe labelling the items of a :class:`FeatureDataset` (tokens, pooled sentences, words
    with their heads), as :class:`TokenData` trains it."""

    def split_logits(self, split: FeatureDataset, rows: torch.Tensor) -> torch.Tensor:
        """The logits ``(N, labels)`` of the items ``rows`` ``(N,)`` of ``split``."""
        raise NotImplementedError


class TokenProbe(LabelProbe):
    """A label per token: layers ``(L, N, dim)`` -> logits ``(N, labels)``."""

    def __init__(self, input: LayerInput, labels: int, generator: torch.Generator, **mlp) -> None:
        super().__init__(input)
        self.classifier = Classifier(generator, input.width, labels, **mlp)

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.input(layers))

    def split_logits(self, split: FeatureDataset, rows: torch.Tensor) -> torch.Tensor:
        return self(split.features[:, rows].float())


class SentenceProbe(TokenProbe):
    """A label per sentence: the token probe on each layer pooled over the sentence's tokens,
    ``(L, S, dim)`` (``elmolab.probing.datasets.pool_sentences`` pools a split once)."""


def classifier_options(settings: ProbeSettings) -> dict[str, Any]:
    """A :class:`Classifier`'s options as ``probe`` sets them: linear or MLP, hidden width,
    dropout."""
    return {"kind": settings.kind, "hidden_dim": settings.hidden_dim, "dropout": settings.dropout}


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

    def steps(
        self, probe: LabelProbe, shuffle: torch.Generator
    ) -> Iterator[tuple[torch.Tensor, int]]:
        """One epoch: per minibatch, its mean loss and its items."""
        train = self.splits["train"]
        for rows in epoch_order(len(train.labels), self.batch_size, self.min_epoch_tokens, shuffle):
            logits = probe.split_logits(train, rows)
            yield F.cross_entropy(logits, train.labels[rows]), len(rows)

    def evaluate(self, probe: LabelProbe, role: str) -> Evaluation:
        split = self.splits[role]
        chunks = torch.arange(len(split.labels)).split(EVAL_TOKENS)
        logits = [probe.split_logits(split, rows) for rows in chunks]
        pairs = zip(logits, chunks, strict=True)
        loss = sum(float(token_losses(x, split.labels[rows]).sum()) for x, rows in pairs)
        predicted = torch.cat([x.argmax(dim=-1) for x in logits])
        score = task_score(
            self.metric, predicted, split.labels, split.sentence_lengths, self.vocabulary
        )
        return Evaluation(score, loss / len(split.labels), [predicted])


def token_data(task: ProbeTask) -> TokenData:
    """The reference data of a labelling task, minibatched as its settings say."""
    assert task.vocabulary is not None and task.metric is not None
    settings = task.settings
    return TokenData(
        task.splits, task.vocabulary, task.metric, settings.batch_size, settings.min_epoch_tokens
    )


# --- The batched heads --------------------------------------------------------------------------


class TokenProbes(HeadProbes):
    """Token probes (a label per token; a sentence probe's items are pooled sentences): linear or
    MLP, per head. The pair probes (``elmolab.probing.kinds.pair``) are these on pairs of words."""

    pair = False  # the pair probes: each item a word and its gold head

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
        if (train.heads is not None) != self.pair:
            raise ValueError(
                "pair probes read each word's head"
                if self.pair
                else "splits with each word's head are for pair probes"
            )
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
        self._prepare_inputs()

    def _prepare_inputs(self) -> None:
        """What the heads read their inputs from, made once for the fit."""
        # Token probes read each token's layers side by side (:meth:`_folded_logits`), from one
        # copy of each split in that layout and the probes' type: a minibatch's gather is then
        # one contiguous row per token.
        self.side_by_side = {}
        for role, split in self.splits.items():
            rows = torch.empty(len(split.labels), split.num_layers, split.dim, dtype=self.dtype)
            rows.copy_(split.features.transpose(0, 1))
            self.side_by_side[role] = rows.view(len(rows), -1)

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
    ) -> list[tuple[Part, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The ``active`` heads on minibatches ``batches`` of split ``role`` (head ``h`` reads
        ``batches[groups[h]]``): per part with active heads, its heads' positions in the part and
        numbers in the fit, and their logits ``(h, N, labels)``."""
        rows = self.side_by_side[role].index_select(0, torch.cat(list(batches)))
        return self._folded_logits(rows.view(len(batches), -1, rows.shape[-1]), groups, active)

    def _folded_logits(
        self, x: torch.Tensor, groups: torch.Tensor, active: torch.Tensor
    ) -> list[tuple[Part, torch.Tensor, torch.Tensor, torch.Tensor]]:
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
    ) -> tuple[list[tuple[Part, torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
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
        return total, scatter_heads(len(self.heads), pieces), counts

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
        return total, scatter_heads(len(self.heads), pieces), counts

    def evaluate(
        self, role: str, active: torch.Tensor, item_losses: bool = False
    ) -> HeadEvaluation:
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
        return HeadEvaluation(scores, loss_sum / len(split.labels), list(predicted), per_item)

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
            predicted = test.predicted[h]
            if self.metric is TaskMetric.SPAN_F1:
                extra = {
                    f"{role}_untyped_f1": self._untyped(evaluation.predicted[h], self.splits[role])
                    for role, evaluation in (("dev", dev), ("test", test))
                }
                extra["per_sentence_test_spans"] = sentence_span_counts(
                    predicted, split.labels, split.sentence_lengths, self.vocabulary
                )
            if self.bits:
                extra.update(_bits(dev, test, h, split.sentence_lengths))
            results.append(
                probe_result(
                    self,
                    fit,
                    h,
                    self.metric.value,
                    float(dev.scores[h]),
                    float(test.scores[h]),
                    self.vocabulary.decode_in_data_scheme(predicted, split.sentence_lengths),
                    {
                        "correct": per_sentence_sums(
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


def _bits(
    dev: HeadEvaluation, test: HeadEvaluation, h: int, test_sentence_lengths: Sequence[int]
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


def _check_token_splits(splits: dict[str, FeatureDataset], vocabulary: LabelVocabulary) -> None:
    train = splits["train"]
    if int(train.labels.max()) >= vocabulary.num_train_labels:
        raise ValueError(
            f"train label id {int(train.labels.max())} is not one of the"
            f" {vocabulary.num_train_labels} train labels of the vocabulary"
        )
    check_widths(splits)
    for name in EVAL_ROLES:
        split = splits[name]
        if (split.heads is None) != (train.heads is None):
            raise ValueError(f"heads in only one of train and {name}")


# --- The kinds ----------------------------------------------------------------------------------


def _reference(probe_class: type[TokenProbe]):
    """The reference builder (:class:`ProbeKind`) of ``probe_class``."""

    def build(input: LayerInput, generator: torch.Generator, task: ProbeTask):
        assert task.vocabulary is not None
        labels = task.vocabulary.num_train_labels
        options = classifier_options(task.settings)
        return probe_class(input, labels, generator, **options), token_data(task)

    return build


def labelling_probes(probes_class: type[TokenProbes]):
    """The batched builder (:class:`ProbeKind`) of ``probes_class``, :class:`TokenProbes` or a
    subclass: it reads the task's vocabulary and metric, and ``bits``."""

    def build(heads: Sequence[Head], task: ProbeTask, *, bits: bool, shared: None = None):
        assert task.vocabulary is not None and task.metric is not None
        settings = task.settings
        return probes_class(heads, task.splits, task.vocabulary, task.metric, settings, bits=bits)

    return build


def _sentence_probes(heads: Sequence[Head], task: ProbeTask, **options) -> TokenProbes:
    if any(split.heads is not None for split in task.splits.values()):
        raise ValueError("sentence splits hold pooled sentences, without heads")
    return labelling_probes(TokenProbes)(heads, task, **options)


KINDS = (
    ProbeKind(
        TaskKind.TOKEN,
        TokenProbe,
        TokenProbes,
        _reference(TokenProbe),
        labelling_probes(TokenProbes),
        lambda settings: Schedule.of_probe(settings, settings.lr),
        labelled=True,
        conditional=True,
        learning_curve=True,
    ),
    ProbeKind(
        TaskKind.SENTENCE,
        SentenceProbe,
        TokenProbes,
        _reference(SentenceProbe),
        _sentence_probes,
        lambda settings: Schedule.of_probe(settings, settings.lr),
        labelled=True,
    ),
)
