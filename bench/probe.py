"""What the probe stage costs, task by task, from cached features (target: 20 minutes on 2 cores).

The stage runs, per task, *jobs* (``elmolab.probing.jobs.plan_jobs``): an encoder and a training
set (the full split, or a learning-curve share for token tasks, or the blocks before one of the
online code's blocks for tasks with ``mdl``), each one fit of the probe engine with every feature
mode and seed as heads (pair and tree tasks: a job per seed and part, the concatenation apart).
For every task of the grid this measures, on one encoder's real features, one thread, as a worker
runs them:

1. loading: the task's data and labels, and one encoder's three splits;
2. per job kind (each training set and number of heads): the time of a training step with every
   head active (the median over ``--steps`` steps), times the steps of an epoch, plus one dev
   evaluation;
3. wsd (1-NN, nothing trained): its whole cell on that one encoder.

Predicted stage time: per task, the cell's start-up (a subprocess importing the stage's modules),
loading (data once, features once per encoder) and the jobs, ``probe.workers`` at a time in the
runner's order, each its epochs and its end (the final scoring of every head). A job
lasts until its last head stops, and a stopped head takes no more compute: with the epochs each
head ran in a previous probe stage (its ``metrics.json`` files, ``--probes``, default
``artifacts/probes``), epoch ``e`` costs the share of heads still training then; without records,
every head runs ``--epochs``. The closing line compares with the measured stage when
``--measured`` (seconds) is given.

``--precision 32-true bf16-mixed`` predicts the stage in each ``probe.precision`` side by side
(bf16-mixed only pays where the CPU has native bf16 instructions).

Arithmetic: the same steps, the dev evaluation and the job's end once more under PyTorch's FLOP
counter (its matrix products, forward and backward), summed over the stage's jobs and epochs as
their time is, and divided by the fastest rate of a few products of the probes' shapes timed here
(one thread, the probes' type) on ``probe.workers`` cores kept busy throughout: the time the
stage's products would take at that rate, a floor under any engine that computes the same
products. What the prediction spends above it goes to everything else (gathers, copies,
elementwise work, Adam, each operation's dispatch).

Run: .venv/bin/python bench/probe.py [OVERRIDE ...] [--features DIR] [--encoder trained]
[--tasks upos ...], e.g. ``bench/probe.py experiment=accuracy`` for the grid without the
information measures (Hydra overrides of ``conf/``, as ``bench/probe_stage.py`` takes them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from elmolab.core.config import feature_modes, section
from elmolab.core.hardware import cpu_model
from elmolab.core.params import compose_params
from elmolab.core.schema import (
    PRECISIONS,
    ControlsConfig,
    ExtractConfig,
    GridConfig,
    ProbeSettings,
    TaskConfig,
    TaskKind,
)
from elmolab.data.catalogue import data_catalog
from elmolab.probing.cell_data import load_cell
from elmolab.probing.engine import HeadAdam, train_step
from elmolab.probing.heads import FitTrace
from elmolab.probing.jobs import layer0_twins, online_code_blocks, plan_jobs
from elmolab.probing.kinds import KINDS, ProbeTask
from elmolab.probing.modes import CellModes
from elmolab.probing.settings import probe_dtype, probe_precision
from elmolab.stages.probe import probe_cell

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def previous_epochs(probes: Path) -> dict[tuple[str, str, float, int], list[int]]:
    """(task, encoder, fraction, seed) -> the epochs each head of those ran, from metrics.json."""
    epochs: dict[tuple[str, str, float, int], list[int]] = defaultdict(list)
    for path in probes.glob("*/*/*/seed*/**/metrics.json"):
        run = json.loads(path.read_text())
        if run.get("same_features_as"):
            continue  # a copy of another encoder's run, not trained
        fraction = float(run.get("train_fraction", 1.0))
        epochs[(run["task"], run["encoder"], fraction, int(run["seed"]))].append(int(run["epochs"]))
    return epochs


def head_epochs(epochs: list[int]) -> float:
    """A job's length in epochs of every head: a stopped head takes no more compute, so epoch e
    costs the share of heads still training then (steps scale about with the active heads)."""
    longest = max(epochs)
    return sum(sum(e >= epoch for e in epochs) / len(epochs) for epoch in range(1, longest + 1))


@dataclass
class Products:
    """Matrix products: their FLOPs and the seconds they ran."""

    flops: float = 0.0
    seconds: float = 0.0

    def __add__(self, other: Products) -> Products:
        return Products(self.flops + other.flops, self.seconds + other.seconds)

    def __mul__(self, times: float) -> Products:
        return Products(self.flops * times, self.seconds * times)


class CountProducts(TorchDispatchMode):
    """The matrix products run inside it, forward and backward (:class:`Products`: the FLOP
    formulas of PyTorch's FlopCounterMode, and each product timed as it runs), without that mode's
    module hooks, which fail on evaluations under ``no_grad``."""

    def __init__(self) -> None:
        super().__init__()
        self.products = Products()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formula = flop_registry.get(func._overloadpacket)
        if formula is None:
            return func(*args, **kwargs)
        started = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - started
        self.products += Products(formula(*args, **kwargs, out_val=out), seconds)
        return out


@dataclass
class JobCost:
    """One job's epoch and end: their seconds, and their matrix products."""

    step: float  # seconds of a training step, every head active (the median of those timed)
    steps: int  # steps per epoch
    dev: float  # seconds of a dev evaluation
    end: float  # seconds of the end: every head scored on dev and test, results assembled
    step_products: Products  # of a training step (the mean over those timed), with its backward
    dev_products: Products
    end_products: Products

    @property
    def epoch(self) -> float:
        return self.step * self.steps + self.dev

    @property
    def epoch_products(self) -> Products:
        return self.step_products * self.steps + self.dev_products


def job_cost(kind: TaskKind, splits, labels, task, settings, heads, steps: int) -> JobCost:
    """One epoch of a job (a training step, the steps of an epoch, a dev evaluation) and its end
    (every head scored on dev and test and its results assembled), timed, then counted."""
    probe_kind = KINDS[kind]
    vocabulary = None if labels is None else labels.vocabulary
    metric = task.metric if probe_kind.labelled else None
    fit_task = ProbeTask(splits, settings, vocabulary, metric)
    probes = probe_kind.build_batched(heads, fit_task, bits=False)
    optimizer = HeadAdam(probes.parameter_groups(probe_kind.schedule(settings)), len(heads))
    shuffles = [torch.Generator().manual_seed(seed) for seed in probes.seeds]
    active = torch.ones(len(heads), dtype=torch.bool)
    epoch = list(probes.epoch_steps(shuffles))
    times = []
    probes.train()
    # Twice over the same steps, timing the second pass: the first meets each batch shape for the
    # first time (oneDNN builds its kernels per shape, which bf16 tree batches pay in epoch 1
    # only; a job runs about ten epochs over the same shapes).
    for step in epoch[:steps]:
        train_step(probes, optimizer, step, active)
    for step in epoch[:steps]:
        started = time.perf_counter()
        train_step(probes, optimizer, step, active)
        times.append(time.perf_counter() - started)
    probes.eval()
    for _ in range(2):  # the second, as every epoch's evaluation after the first
        started = time.perf_counter()
        with torch.no_grad(), probes.autocast():
            probes.evaluate("dev", active)
        dev = time.perf_counter() - started
    started = time.perf_counter()
    empty = [[] for _ in heads]
    trace = FitTrace(empty, [0] * len(heads), [False] * len(heads), 0.0)
    probes.results(trace)
    end = time.perf_counter() - started
    # the same work once more, counted (the counter slows what it counts)
    probes.train()
    with CountProducts() as counted:
        for step in epoch[:steps]:
            train_step(probes, optimizer, step, active)
    step_products = counted.products * (1 / len(epoch[:steps]))
    probes.eval()
    with CountProducts() as counted, torch.no_grad(), probes.autocast():
        probes.evaluate("dev", active)
    dev_products = counted.products
    with CountProducts() as counted:
        probes.results(trace)
    return JobCost(
        statistics.median(times),
        len(epoch),
        dev,
        end,
        step_products,
        dev_products,
        counted.products,
    )


# (rows, inner, columns) of products like the probes': a minibatch through a wide bilinear map, a
# layer-wide one, and a classifier over the labels, side by side for a dozen heads
RATE_SHAPES = ((1024, 768, 768), (1024, 256, 256), (1024, 768, 600))


def product_rate(dtype: torch.dtype, repeats: int = 20) -> tuple[float, tuple[int, int, int]]:
    """The fastest of :data:`RATE_SHAPES` in ``dtype`` on this thread: (FLOP/s, its shape)."""
    best = (0.0, RATE_SHAPES[0])
    for shape in RATE_SHAPES:
        rows, inner, columns = shape
        a, b = torch.randn(rows, inner).to(dtype), torch.randn(inner, columns).to(dtype)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - started)
        rate = 2 * rows * inner * columns / min(times)
        best = max(best, (rate, shape))
    return best


def makespan(durations: list[float], workers: int) -> float:
    """When the last of ``durations`` ends, each taken in order by the first free worker."""
    free = [0.0] * workers
    for duration in durations:
        free[free.index(min(free))] += duration
    return max(free)


def startup_seconds() -> float:
    """A cell process's start: the interpreter and the probe stage's imports."""
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import elmolab.probing.runner, elmolab.core.tracking, torchmetrics",
        ],
        check=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=accuracy")
    parser.add_argument("--features", default=str(ROOT / "artifacts" / "features"))
    parser.add_argument("--encoder", default="trained")
    parser.add_argument("--tasks", nargs="*", help="default: grid.tasks")
    parser.add_argument("--probes", default=str(ROOT / "artifacts" / "probes"))
    parser.add_argument("--epochs", type=int, default=8, help="epochs of a job without records")
    parser.add_argument("--steps", type=int, default=10, help="training steps timed per job")
    parser.add_argument("--measured", type=float, help="the measured stage, seconds")
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=PRECISIONS,
        help="probe.precision, each predicted in turn (side by side: 32-true bf16-mixed);"
        " default: the composed probe.precision",
    )
    args = parser.parse_intermixed_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cfg = OmegaConf.create(compose_params(CONF, args.overrides))
    OmegaConf.update(cfg, "probe.features_dir", args.features)
    grid = section(cfg, "grid", GridConfig)
    settings = section(cfg, "probe", ProbeSettings)
    one = section(cfg, "probe", ProbeSettings)
    one.encoders = [args.encoder]
    catalog = data_catalog(section(cfg, "extract", ExtractConfig))
    modes = feature_modes(CONF, grid.features)
    records = previous_epochs(Path(args.probes))
    print(
        f"CPU: {cpu_model()}, {os.cpu_count()} cores;"
        f" one thread per job, workers {settings.workers}; overrides: {args.overrides or 'none'}"
    )
    print(f"epochs per job: {'from ' + args.probes if records else f'--epochs {args.epochs}'}")
    startup = startup_seconds()
    print(f"cell start-up (interpreter and imports): {startup:.1f} s")
    totals = {}
    precisions = args.precision or [settings.precision]
    for precision in precisions:
        settings.precision = one.precision = precision
        chosen = probe_precision(settings)
        print(f"probe.precision {precision}: {chosen.precision} ({chosen.reason})")
        rate, shape = product_rate(probe_dtype(settings))
        print(
            f"product rate ({chosen.precision}, one thread): {rate / 1e9:.0f} GFLOP/s,"
            f" the fastest of {len(RATE_SHAPES)} shapes ({' x '.join(map(str, shape))})"
        )
        seconds, products = predict_stage(
            args, cfg, settings, one, catalog, modes, records, startup, rate
        )
        totals[precision] = seconds
        print(f"predicted probe stage ({chosen.precision}): {seconds / 60:.1f} min")
        print(
            f"its products on {settings.workers} cores busy throughout (the rest: everything else):"
        )
        print(products_summary(products, rate, settings.workers, seconds, minutes=True))
    if len(totals) > 1:
        first, *rest = precisions
        for other in rest:
            print(f"{other} / {first}: {totals[other] / totals[first]:.2f} of the time")
    if args.measured:
        total = totals[precisions[0]]
        print(
            f"measured: {args.measured / 60:.1f} min;"
            f" predicted ({precisions[0]}) / measured = {total / args.measured:.2f}"
        )


def products_summary(
    products: Products, rate: float, workers: int, seconds: float, minutes: bool = False
) -> str:
    """What ``products`` take on ``workers`` cores at ``rate`` (FLOP/s a core) and as fast as
    they ran in the steps, against ``seconds`` predicted."""
    unit, scale = ("min", 60) if minutes else ("s", 1)
    floor = products.flops / rate / workers
    ran = products.seconds / workers
    return (
        f"products {products.flops / 1e12:.1f} TFLOP: {floor / scale:.1f} {unit} at the rate"
        f" above ({floor / seconds:.0%}), {ran / scale:.1f} {unit} at the"
        f" {products.flops / products.seconds / 1e9:.0f} GFLOP/s they ran at ({ran / seconds:.0%})"
    )


def predict_stage(
    args, cfg, settings, one, catalog, modes, records, startup: float, rate: float
) -> tuple[float, Products]:
    """The probe stage's predicted seconds with ``settings`` (every task of ``args.tasks``), and
    its matrix products (``rate``: FLOP/s a core, for each task's floor)."""
    grid = section(cfg, "grid", GridConfig)
    encoders = list(settings.encoders)
    controls = section(cfg, "controls", ControlsConfig).instances()
    total = 0.0
    products = Products()
    for name in args.tasks or grid.tasks:
        if name in grid.tasks:
            task = grid.tasks[name]
        else:
            task_cfg = OmegaConf.load(CONF / "tasks" / f"{name}.yaml")
            task = section(OmegaConf.merge(cfg, {"task": task_cfg}), "task", TaskConfig)
        if settings.unseen is not None:
            task.unseen = settings.unseen
        kind = TaskKind(task.kind)
        if kind is TaskKind.WSD:
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                probe_cell(task, modes, grid.seeds, catalog, one, Path(tmp) / name)
            seconds = startup + (time.perf_counter() - started) * len(encoders)
            print(f"{name:13s} wsd 1-NN, every mode: {seconds:7.1f} s ({len(encoders)} encoders)")
            total += seconds
            continue
        started = time.perf_counter()
        data = load_cell(task, one, catalog)
        splits, labels = data.splits, data.labels
        load = time.perf_counter() - started
        data = splits[args.encoder]
        cell_modes = CellModes.resolve(
            modes, encoders, controls, settings.control_features, conditional=task.conditional
        )
        twins = layer0_twins(settings, cell_modes, task.datasets())
        jobs = plan_jobs(
            kind,
            cell_modes,
            grid.seeds,
            settings,
            twins,
            conditional=task.conditional,
            online_blocks=(
                online_code_blocks(len(data["train"].sentence_lengths), settings)
                if task.mdl
                else None
            ),
            num_layers=data["train"].num_layers,
            train_sentences=len(data["train"].sentence_lengths),
        )
        measured: dict[tuple[float, int], JobCost] = {}  # (fraction, heads) -> its cost
        durations = []
        lines = []
        task_products = Products()
        for job in jobs:  # the runner's jobs, in its order
            key = (job.fraction, len(job.heads))
            if key not in measured:  # the cost of a job: its training set and number of heads
                train = data["train"] if job.train is None else data["train"].subset(job.train)
                cost = job_cost(
                    kind, {**data, "train": train}, labels, task, settings, job.heads, args.steps
                )
                measured[key] = cost
                lines.append(
                    f"f={job.fraction:g}, {len(job.heads)} heads:"
                    f" step {cost.step * 1e3:.1f} ms x {cost.steps} + dev {cost.dev:.1f} s"
                    f" = {cost.epoch:.1f} s/epoch, end {cost.end:.1f} s;"
                    f" {cost.step_products.flops / 1e9:.2f} GFLOP a step"
                )
            cost = measured[key]
            recorded = [
                e
                for seed in sorted({head.seed for head in job.heads})
                for e in records.get((name, job.encoder, job.fraction, seed), [])
            ]
            epochs = head_epochs(recorded) if recorded else args.epochs
            durations.append(cost.epoch * epochs + cost.end)
            task_products += cost.epoch_products * epochs + cost.end_products
        seconds = startup + load * len(encoders) + makespan(durations, settings.workers)
        total += seconds
        products += task_products
        print(f"{name:13s} {kind.value:10s} {len(jobs)} jobs; " + "; ".join(lines))
        print(
            f"{'':13s} load {load:.1f} s x {len(encoders)} encoders; stage share {seconds:.0f} s;"
            f" {products_summary(task_products, rate, settings.workers, seconds)}"
        )
    return total, products


if __name__ == "__main__":
    main()
