"""The probe engine: every probe of a task on one encoder trained together, as independent heads.

A *head* is one probe run: a feature mode and a seed. For one task, one encoder and one training
set, every head reads the same frozen features, so one model holds them all: each step gathers the
features of the step's tokens once (one minibatch per seed: a seed fixes its head's initialisation
and the order it visits the training data), every head mixes them with its own mix and classifies
them with its own parameters, stacked along a leading head axis (``bmm``; token heads instead fold
their first map onto the layers side by side and share one product per minibatch, see
``TokenProbes._folded_logits`` in ``kinds.token``), and the loss is the sum of the heads' losses.
Nothing couples two heads: a head's gradient is that of its own loss, the optimizer
(:class:`HeadAdam`) works element by element with a learning rate per head, and each head draws
its initialisation and dropout from a generator of its own. A head thus trains exactly as it would
alone, up to rounding (``tests/probing/test_probes.py`` and ``tests/probing/test_trees.py`` check
it), at a fraction of the per-step overhead of separate runs.

Every trained probe kind runs through :func:`fit_heads`, one loop with one early-stopping rule; the
kinds, each in its module of ``elmolab.probing.kinds`` beside its reference probe, define the steps
of an epoch, the loss of a step and the evaluation of a split (:class:`HeadProbes`):

- token (a label per token: UPOS, chunks, NER) and sentence (a label per sentence: sentiment, the
  token probes on each sentence's layers mean-pooled), linear or MLP classifiers
  (``kinds.token``); pair (a label per word and gold head: dependency labels, ``kinds.pair``);
- arc (``deparc``: each word's head among the root and the sentence's words, a bilinear scorer,
  ``kinds.arc``) and structural (Hewitt and Manning's distance probe, ``kinds.structural``),
  which read whole sentences in padded batches (``kinds.padded``).

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

import time
from collections.abc import Sequence

import torch

from elmolab.core.schema import ProbeSettings, TaskKind
from elmolab.data.labels import LabelVocabulary, TaskMetric
from elmolab.probing.datasets import FeatureDataset, TreeDataset
from elmolab.probing.heads import EpochRecord, FitTrace, HeadProbes, ParamGroup, ProbeResult
from elmolab.probing.kinds import KINDS, ProbeTask, probe_kind
from elmolab.probing.kinds.token import TokenProbes
from elmolab.probing.probes import Head, Stopping
from elmolab.probing.settings import Schedule

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


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
    shared: object = None,
) -> list[ProbeResult]:
    """Train every head on ``splits`` (train, dev, test) together and score each; ``kind`` is a
    kind of ``elmolab.probing.kinds.KINDS``: ``token``, ``pair`` or ``sentence`` (splits of pooled
    sentences, one item each; then ``metric`` and ``vocabulary`` are needed; ``bits``: the
    results give the cross-entropy in bits too), ``arc`` or ``structural`` (``shared``: what the
    kind's ``shared`` made of the splits once for many fits, the structural probe's gold side,
    else made here). Results come in the order of ``heads``."""
    probes_kind = probe_kind(kind)
    if any(head.baseline for head in heads) and not probes_kind.conditional:
        conditional = " and ".join(k.task_kind.value for k in KINDS.values() if k.conditional)
        raise ValueError(f"conditional heads (layer 0 beside a mode) are for {conditional} probes")
    task = ProbeTask(splits, settings, vocabulary, metric)
    probes = probes_kind.build_batched(heads, task, bits=bits, shared=shared)
    fit = fit_heads(probes, probes_kind.schedule(settings))
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
    fit_heads(probes, KINDS[TaskKind.TOKEN].schedule(settings))
    return probes.code_lengths("block")
