"""Scheduling a probing cell: its jobs (an encoder, a training set and the heads trained together
on it), their order, and running them on ``probe.workers`` forked processes."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmolab.core.errors import ElmolabError
from elmolab.core.schema import ProbeSettings, TaskKind
from elmolab.io.features import summary_path
from elmolab.io.results import CONDITIONAL_MODES, FeatureMode
from elmolab.probing.kinds import KINDS
from elmolab.probing.modes import CellModes
from elmolab.probing.probes import Head


@dataclass(frozen=True)
class Job:
    """One fit of the engine: an encoder, a training set and the heads (modes x seeds) on it.

    An online-code job (``block`` set) trains on the first ``fraction`` of the training sentences,
    the blocks before ``block``, and measures the code length of block ``block``'s labels."""

    encoder: str
    fraction: float  # 1.0: the full training split
    heads: tuple[Head, ...]
    block: int | None = None  # online code: the index in probe.online_code_fractions it codes
    # the training sentences it fits on, in corpus order (None: all of them)
    train: tuple[int, ...] | None = None
    coded: tuple[int, ...] = ()  # online code: the sentences of block ``block``


def plan_jobs(
    kind: TaskKind,
    modes: CellModes,
    seeds: Sequence[int],
    settings: ProbeSettings,
    twins: Mapping[str, str],
    *,
    conditional: bool = False,
    online_blocks: Sequence[Sequence[int]] | None = None,
    num_layers: int,
    train_sentences: int,
) -> list[Job]:
    """The jobs of a cell, the big ones first: per training set (token tasks: the full one and
    each learning-curve share) and encoder, one fit of every seed and of the encoder's modes on
    that set (``modes``; but ``layer0`` of an encoder in ``twins``, :func:`layer0_twins`: its
    runs are copied).

    ``conditional`` adds to each full fit the heads on layer 0 beside each mode of
    ``CONDITIONAL_MODES`` among the encoder's; ``online_blocks`` (a task measuring the online code,
    ``mdl``: :func:`online_code_blocks`) adds the online code's jobs, one per block after the
    first and encoder, with the full fits' modes and seeds. Each job carries the training
    sentences it fits on (of ``train_sentences``): a learning-curve share's
    (:func:`training_subset`), or the blocks before its own and its block's sentences (online
    code).

    A cell without learning-curve jobs (pair and tree tasks) splits each fit by seed, and each
    seed's heads into the concatenation's and the others' (each part of a fit computes apart from
    the others, so the split changes no result), and orders the jobs by their arithmetic, the
    largest first: three encoders' fits on two workers would leave one worker idle for a third of
    the cell, nine fits of a seed each for a ninth (the last alone), eighteen unequal ones end
    within a fraction of the smallest. In a token cell the small learning-curve fits fill the
    gaps instead, and its bigger fits amortize a step's overhead over more heads (its heads share
    one product, so they stay together)."""
    fractions = [1.0, *settings.train_fractions] if KINDS[kind].learning_curve else [1.0]
    for fraction in fractions:
        if not 0.0 < fraction <= 1.0:
            raise ElmolabError(f"probe.train_fractions: {fraction} is not in (0, 1]")
    by_seed = set(fractions) == {1.0} and online_blocks is None and settings.workers > 1

    def heads_of(encoder: str, shard: Sequence[int], fraction: float) -> tuple[Head, ...]:
        return tuple(
            Head(FeatureMode(mode), seed)
            for mode in modes.modes(encoder, fraction)
            if not (mode == FeatureMode.LAYER0.value and encoder in twins)
            for seed in shard
        )

    def conditioned(encoder: str) -> list[str]:
        full = modes.full[encoder]
        return [mode for mode in CONDITIONAL_MODES if mode in full] if conditional else []

    jobs = []
    for fraction in sorted(set(fractions), reverse=True):
        train = (
            None if fraction == 1.0 else tuple(training_subset(train_sentences, fraction, settings))
        )
        for encoder in settings.encoders:
            for shard in [[seed] for seed in seeds] if by_seed else [list(seeds)]:
                heads = heads_of(encoder, shard, fraction)
                if fraction == 1.0:
                    heads += tuple(
                        Head(FeatureMode(mode), seed, baseline=True)
                        for mode in conditioned(encoder)
                        for seed in shard
                    )
                # split by seed: the concatenation's heads apart from the others'
                groups = (
                    [
                        tuple(h for h in heads if (h.mode is FeatureMode.CONCAT) is concat)
                        for concat in (True, False)
                    ]
                    if by_seed
                    else [heads]
                )
                jobs += [Job(encoder, fraction, group, train=train) for group in groups if group]
    if online_blocks is not None:
        shares = settings.online_code_fractions
        for block in range(1, len(shares)):
            before = tuple(sorted(i for b in online_blocks[:block] for i in b))
            for encoder in settings.encoders:
                if heads := heads_of(encoder, list(seeds), 1.0):
                    coded = tuple(online_blocks[block])
                    jobs.append(Job(encoder, shares[block - 1], heads, block, before, coded))
    if by_seed:
        return sorted(jobs, key=lambda job: -job_arithmetic(kind, job, num_layers))  # stable
    return sorted(jobs, key=lambda job: -job.fraction)  # stable: the order above within a size


def job_arithmetic(kind: TaskKind, job: Job, num_layers: int) -> float:
    """A job's arithmetic per training token, in units of one layer-wide head: a head's products
    grow with its input's width (a concatenation: ``num_layers`` layers; layer 0 beside a mix:
    two), with the power the kind gives (the arc probe's bilinear map: its square)."""
    total = 0.0
    for head in job.heads:
        width = num_layers if head.mode is FeatureMode.CONCAT else 2 if head.baseline else 1
        total += width ** KINDS[kind].width_power
    return total


def online_code_blocks(sentences: int, settings: ProbeSettings) -> list[list[int]]:
    """The online code's blocks of training sentences: block ``i`` holds the sentences of the
    first ``probe.online_code_fractions[i]`` share (:func:`training_subset`, nested) that the
    share before it lacks."""
    blocks, before = [], set[int]()
    for fraction in settings.online_code_fractions:
        upto = training_subset(sentences, fraction, settings)
        blocks.append([i for i in upto if i not in before])
        before.update(upto)
    return blocks


def training_subset(sentences: int, fraction: float, settings: ProbeSettings) -> list[int]:
    """The training sentences of a learning-curve point: the first ``ceil(fraction * n)`` of a
    permutation fixed by ``probe.subset_seed``, in corpus order. The same for every encoder,
    feature mode and probe seed (so their scores pair up), and nested: 1% lies inside 10%."""
    if not 0.0 < fraction <= 1.0:
        raise ElmolabError(f"probe.train_fractions: {fraction} is not in (0, 1]")
    order = np.random.default_rng(settings.subset_seed).permutation(sentences)
    return sorted(order[: max(1, math.ceil(fraction * sentences))].tolist())


# The jobs of the running run_jobs call: forked workers inherit them, so only an index and the
# results cross the process boundary, never the features or the task data.
_JOBS: list[Callable[[], Any]] = []


def _run_job(index: int) -> Any:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    return _JOBS[index]()


def run_jobs(jobs: list[Callable[[], Any]], workers: int) -> list[Any]:
    """``[job() for job in jobs]``, with up to ``workers`` jobs at a time in forked processes.

    Each worker uses one torch thread and takes the next job when it finishes one. Results come
    back in the order of ``jobs``; the first failing job's exception is raised (an ElmolabError
    keeps its file and line).
    """
    if workers < 1:
        raise ElmolabError(f"probe.workers must be at least 1, got {workers}")
    if workers == 1 or len(jobs) < 2 or "fork" not in mp.get_all_start_methods():
        return [job() for job in jobs]
    _JOBS[:] = jobs
    try:
        context = mp.get_context("fork")
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            return list(pool.map(_run_job, range(len(jobs))))
    finally:
        _JOBS.clear()


def layer0_twins(
    settings: ProbeSettings, modes: CellModes, datasets: Sequence[str]
) -> dict[str, str]:
    """Encoder -> an earlier encoder with the same token layer, by the digests in the extract.json
    of each of ``datasets`` (the token-layer control and the trained biLM): their layer-0
    features are identical, so their layer-0 probes would be too, run for run, and are run once.
    Only encoders with ``layer0`` among their ``modes``, and only where the earlier one's layer-0
    runs include the encoder's (its learning curves too, where the encoder has them)."""
    layer0 = FeatureMode.LAYER0.value
    first_with: dict[tuple[str, ...], str] = {}
    twins = {}
    for encoder in settings.encoders:
        if layer0 not in modes.full[encoder]:
            continue
        digests = []
        for dataset in datasets:
            summary = summary_path(Path(settings.features_dir) / encoder, dataset)
            try:
                digests.append(
                    json.loads(summary.read_text(encoding="utf-8"))["token_layer_sha256"]
                )
            except (OSError, ValueError, KeyError):
                break  # features without a digest (older extractions) are probed as they are
        else:
            source = first_with.setdefault(tuple(digests), encoder)
            if source != encoder and (
                layer0 not in modes.curve[encoder] or layer0 in modes.curve[source]
            ):
                twins[encoder] = source
    return twins
