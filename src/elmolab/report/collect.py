"""Read what the other stages wrote: pretraining metrics and curve, one JSON per probe run and
one per online code.

Every file is self-describing and validated; a missing key or a value of the wrong type is an
ElmolabError naming the file. A missing *input* (no random control yet, no WSD runs) is not an
error: :class:`Inputs` lists what is missing so the report can say so.

The files, their folders and columns are ``elmolab.io.results``'s (the contract with the
stages that write them); a probe run's ``task``, ``features``, ``encoder``, ``seed`` and
``train_fraction`` must agree with its path (files without ``train_fraction`` predate learning
curves: f = 1); so must an online code's ``task``, ``features``, ``encoder`` and ``seed``.

Conditional probes (features ``layer0+<mode>``) are kept apart from the other runs
(:attr:`Inputs.conditional`): they belong to the information section only, never to the per-layer
tables, figures and findings.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from omegaconf import DictConfig, OmegaConf

from elmolab.core.config import section
from elmolab.core.errors import ElmolabError
from elmolab.core.schema import EncoderRolesConfig, TaskKind
from elmolab.io.results import (
    CONDITIONAL_BASE,
    CURVE_FILE,
    CURVE_REQUIRED,
    FRACTION_PREFIX,
    METRICS_FILE,
    FeatureMode,
    conditional_features,
    learning_curve_paths,
    online_code_paths,
    probe_run_paths,
)

PPL_KEYS = ("ppl", "ppl_fwd", "ppl_bwd")
K = TypeVar("K", bound=tuple)  # (task, features, encoder, ...)

# What each encoder role is, in full and where space is tight (report.encoders names the encoder
# that plays each role; an encoder without a role is shown by its name).
ROLE_LABELS = {
    "main": ("trained biLM", "trained"),
    "random": ("random init", "random"),
    "token_layer": ("trained token layer + random LSTMs", "token layer"),
}
# The probing feature modes in the order the code defines them.
FEATURE_ORDER = tuple(mode.value for mode in FeatureMode)


@dataclass(frozen=True)
class Display:
    """How the report orders and names tasks, feature modes and encoders, and what it knows of
    each task, from ``conf/``: the tasks in ``grid.tasks``'s order, the encoders in
    ``probe.encoders``'s, the feature modes in the code's; names not listed follow, sorted.
    ``main`` is the pretrained biLM, every other encoder a baseline to it: ``random`` its random
    initialisation (what pretraining added at all), ``token_layer`` its token layer under random
    LSTMs (what pretraining the LSTMs added). ``kinds`` gives each task's kind (a TaskKind),
    ``controls`` each control task's task (``grid.tasks.<task>.control_of``); a task outside
    ``grid.tasks`` has neither. The default orders everything by name, gives no encoder a role
    and knows no task."""

    tasks: tuple[str, ...] = ()
    encoders: tuple[str, ...] = ()
    main: str | None = None
    random: str | None = None
    token_layer: str | None = None
    features: tuple[str, ...] = FEATURE_ORDER
    kinds: Mapping[str, str] = field(default_factory=dict)
    controls: Mapping[str, str] = field(default_factory=dict)  # control task -> its task
    # A control encoder's instance -> the control it belongs to (its first instance's name): the
    # report pools an instance's runs with the control's (``controls`` in conf/).
    instances: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: DictConfig, where: str | None = None) -> Display:
        """The display of the study ``cfg`` (a composed config): ``grid.tasks``'s order, kinds
        and control tasks, ``probe.encoders``'s order, the roles of ``report.encoders`` (errors
        name ``where``)."""
        roles = section(cfg, "report.encoders", EncoderRolesConfig, where)
        tasks = OmegaConf.select(cfg, "grid.tasks", default=None) or {}
        encoders = OmegaConf.select(cfg, "probe.encoders", default=None) or []
        return cls(
            tuple(tasks),
            tuple(encoders),
            roles.main,
            roles.random,
            roles.token_layer,
            kinds={name: task.kind for name, task in tasks.items() if "kind" in task},
            controls={
                name: task.control_of for name, task in tasks.items() if task.get("control_of")
            },
            instances=control_instances(OmegaConf.select(cfg, "controls", default=None) or {}),
        )

    def pooled(self, encoder: str) -> str:
        """The encoder whose cell ``encoder``'s runs join: its control, else itself."""
        return self.instances.get(encoder, encoder)

    def is_control(self, task: str) -> bool:
        """Whether ``task`` is a control task (random labels: neither family, no layer claim)."""
        return task in self.controls

    def control_task(self, task: str, among: Iterable[str]) -> str | None:
        """The first of ``among`` that is ``task``'s control task, or None."""
        return next((name for name in among if self.controls.get(name) == task), None)

    def of_kind(self, kind: TaskKind, names: Iterable[str]) -> list[str]:
        """Those of ``names`` whose tasks are of ``kind``, in their order."""
        return [name for name in names if self.kinds.get(name) == kind]

    def role(self, encoder: str) -> str | None:
        """The role ``encoder`` plays (main, random, token_layer), or None."""
        roles = {"main": self.main, "random": self.random, "token_layer": self.token_layer}
        return next((role for role, name in roles.items() if name == encoder), None)

    def label(self, encoder: str, short: bool = False) -> str:
        """How the report names ``encoder``: its role's label, else its name."""
        role = self.role(encoder)
        return encoder if role is None else ROLE_LABELS[role][1 if short else 0]

    def main_of(self, encoders: Sequence[str]) -> str:
        """The main encoder if among ``encoders`` (display order), else the first."""
        return self.main if self.main in encoders else encoders[0]

    def ordered_tasks(self, names: Iterable[str]) -> list[str]:
        return ordered(set(names), self.tasks)

    def ordered_features(self, names: Iterable[str]) -> list[str]:
        return ordered(set(names), self.features)

    def ordered_encoders(self, names: Iterable[str]) -> list[str]:
        return ordered(set(names), self.encoders)

    def sort(self, keys: Iterable[K]) -> list[K]:
        """Keys (task, features, encoder, then anything sortable) in display order."""
        keys = list(keys)
        orders = (self.tasks, self.features, self.encoders)
        ranks = [
            {name: rank for rank, name in enumerate(ordered({key[i] for key in keys}, order))}
            for i, order in enumerate(orders)
        ]
        return sorted(keys, key=lambda key: (*(r[key[i]] for i, r in enumerate(ranks)), *key[3:]))


SINGLE_LAYERS = ("layer0", "layer1", "layer2")
SCALAR_MIX = "scalar_mix"
# The layer panel: the upper biLSTM layer against the lower one (ELMo: syntax low, semantics high).
LAYER_PANEL = ("layer1", "layer2")
FAMILY_ORDER = ("syntactic", "semantic")  # the panel's groups; other families follow, sorted
CONDITIONAL_PREFIX = conditional_features("")  # "layer0+": layer 0 beside another mode
# A run's cross-entropy in bits per token, in ProbeRun.extra (tasks that measure information).
DEV_BITS = "dev_bits"
TEST_BITS = "test_bits"


def conditioned_mode(features: str) -> str | None:
    """The mode a conditional probe reads beside layer 0 (``layer0+layer1`` -> ``layer1``); None
    for every other feature mode."""
    mode = features.removeprefix(CONDITIONAL_PREFIX)
    return None if mode == features else mode


BY_NAME = Display()  # everything by name, no encoder in a role


@dataclass(frozen=True)
class Expected:
    """What the configuration asks the probe stage for, from ``conf/``: the tasks of
    ``grid.tasks``, the feature modes of ``grid.features``, the encoders of ``probe.encoders``, and
    learning curves (``probe.train_fractions`` set, and a token task to draw them on). A result is
    missing only if it is expected: what a preset leaves out on purpose (``experiment=smoke``: no
    layer 0, so no layer-0 run beside the conditional probes) is not."""

    tasks: tuple[str, ...]
    features: tuple[str, ...]
    encoders: tuple[str, ...]
    learning_curves: bool

    @classmethod
    def of(cls, cfg: DictConfig) -> Expected:
        """What the study ``cfg`` (a composed config) expects."""
        tasks = OmegaConf.select(cfg, "grid.tasks", default=None) or {}
        fractions = OmegaConf.select(cfg, "probe.train_fractions", default=None) or []
        return cls(
            tasks=tuple(tasks),
            features=tuple(OmegaConf.select(cfg, "grid.features", default=None) or []),
            encoders=tuple(OmegaConf.select(cfg, "probe.encoders", default=None) or []),
            learning_curves=bool(fractions)
            and any(task.get("kind") == TaskKind.TOKEN for task in tasks.values()),
        )


def control_instances(controls: Mapping[str, Mapping[str, int]]) -> dict[str, str]:
    """Each instance of ``controls`` (a control -> its instances' encoder names -> seeds) -> the
    control's first instance, which names the pooled runs."""
    return {
        instance: next(iter(instances)) for instances in controls.values() for instance in instances
    }


def ordered(names: set[str] | list[str], order: tuple[str, ...]) -> list[str]:
    """``names`` in ``order``, then the ones ``order`` lacks, sorted."""
    known = [name for name in order if name in names]
    return known + sorted(set(names) - set(order))


@dataclass(frozen=True)
class PerSentence:
    """Correct and total token counts per test sentence (for the paired bootstrap)."""

    correct: np.ndarray  # (sentences,) int
    total: np.ndarray  # (sentences,) int


@dataclass(frozen=True)
class SentenceSpans:
    """Span F1's typed chunks per test sentence: right, predicted and gold (their sums over any
    resample of sentences give its F1)."""

    tp: np.ndarray  # (sentences,) int
    pred: np.ndarray  # (sentences,) int
    gold: np.ndarray  # (sentences,) int


@dataclass(frozen=True)
class ProbeRun:
    """One probe run's ``metrics.json`` (``applicable`` False: the mode does not apply, no
    metric; e.g. the learned scalar mix for WSD 1-NN).

    ``extra`` holds the further split scores, ``dev_<name>`` and ``test_<name>`` (the structural
    probe's ``dev_dspr``, ``test_dspr``; a task measuring information: ``dev_bits``,
    ``test_bits``)."""

    path: Path
    task: str
    features: str
    encoder: str
    seed: int | None
    applicable: bool = True
    metric: str | None = None
    dev: float | None = None
    test: float | None = None
    mix_weights: tuple[float, ...] | None = None
    gamma: float | None = None
    per_sentence_test: PerSentence | None = None
    train_fraction: float = 1.0  # of the task's training sentences the probe saw
    n_train_sentences: int | None = None
    extra: dict[str, float] = field(default_factory=dict, hash=False)
    epochs: int | None = None  # epochs trained (None: nothing trained, or not recorded)
    hit_epoch_cap: bool | None = None  # still improving at the epoch cap (None: not recorded)
    # Summed bits and tokens of each test sentence (information tasks), both (sentences,).
    per_sentence_test_bits: np.ndarray | None = field(default=None, compare=False, repr=False)
    per_sentence_test_tokens: np.ndarray | None = field(default=None, compare=False, repr=False)
    wall_seconds: float | None = None  # the probe's training time (None: not recorded)
    per_sentence_test_spans: SentenceSpans | None = field(default=None, compare=False, repr=False)

    @property
    def identity(self) -> tuple[Any, ...]:
        """What makes a run unique across sources."""
        return (self.task, self.features, self.encoder, self.seed, self.train_fraction)


@dataclass(frozen=True)
class OnlineCode:
    """One ``online_code.json``: the online code length of a task's training labels given one
    encoder's features (Voita and Titov 2020), one seed."""

    path: Path
    task: str
    features: str
    encoder: str
    seed: int
    labels: int  # the label count of the uniform code
    fractions: tuple[float, ...]  # nested shares of the training sentences ending each block
    block_tokens: tuple[int, ...]  # per block
    block_bits: tuple[float, ...]  # per block: the code length of its labels
    uniform_bits: float  # every training label under the uniform code
    online_bits: float  # sum(block_bits)
    compression: float  # uniform_bits / online_bits
    wall_seconds: float  # the block probes' training time
    same_features_as: str | None = None  # copied from this encoder (identical features)

    @property
    def identity(self) -> tuple[Any, ...]:
        return (self.task, self.features, self.encoder, self.seed)


R = TypeVar("R", ProbeRun, OnlineCode)  # a result that is unique across sources


@dataclass(frozen=True)
class Pretraining:
    """A biLM's ``metrics.json`` and, for the trained model, its learning curve."""

    path: Path
    metrics: dict[str, Any]
    curve: dict[str, np.ndarray] | None = None  # column -> (rows,) float, nan where empty


@dataclass
class Inputs:
    """Every input of the report. ``probes`` and ``curves`` hold the runs of the feature modes
    proper; the conditional probes (``layer0+<mode>``) are in ``conditional`` only."""

    trained: Pretraining | None
    random: Pretraining | None
    probes: list[ProbeRun]
    curves: list[ProbeRun] = field(default_factory=list)  # learning-curve runs (fraction < 1)
    missing: list[str] = field(default_factory=list)  # one sentence per missing input
    conditional: list[ProbeRun] = field(default_factory=list)  # on all the training data
    online_codes: list[OnlineCode] = field(default_factory=list)


def collect(
    bilm_dir: Path,
    random_dir: Path,
    probes_dir: Path,
    sources: Sequence[Path] = (),
    display: Display = BY_NAME,
    *,
    expected: Expected,
) -> Inputs:
    """Read every input the report uses; what is ``expected`` and absent is listed in
    ``Inputs.missing``.

    ``sources`` adds probe results from elsewhere (:func:`probe_roots`): a Hydra multirun folder,
    one run's folder, or a probes folder. A run (or online code) found twice is an error naming
    both files. A baseline encoder of ``display`` that is expected and has no runs is listed as
    missing. Learning-curve runs of conditional probes are left out (no section shows them).
    """
    missing: list[str] = []
    trained = _read_pretraining(bilm_dir, "trained biLM", missing, with_curve=True)
    random = _read_pretraining(random_dir, "random-initialisation control", missing)
    roots = [probes_dir] if probes_dir.is_dir() else []
    roots += [root for source in sources for root in probe_roots(source)]
    runs = _unique([run for root in roots for run in read_probe_runs(root)], "probe run")
    probes = [run for run in runs if conditioned_mode(run.features) is None]
    conditional = [run for run in runs if conditioned_mode(run.features) is not None]
    curves = _unique([run for root in roots for run in read_learning_curve_runs(root)], "probe run")
    curves = [run for run in curves if conditioned_mode(run.features) is None]
    codes = _unique([code for root in roots for code in read_online_codes(root)], "online code")
    if CONDITIONAL_BASE in expected.features:
        missing += _unpaired_conditional(probes, conditional)
    if not probes:
        missing.append(f"no probe results under {probes_dir}/ (the probe stage has not run)")
    else:
        encoders = {run.encoder for run in probes}
        tasks = {run.task for run in probes}
        absent_encoders = set(expected.encoders) - encoders
        if display.random in absent_encoders:
            missing.append(
                f"no probe runs on the {display.random} encoder: trained vs random is not shown"
            )
        if display.token_layer in absent_encoders:
            missing.append(
                f"no probe runs on the {display.token_layer} encoder: trained biLM vs trained "
                "token layer is not shown"
            )
        absent_tasks = [task for task in expected.tasks if task not in tasks]
        for task in display.of_kind(TaskKind.WSD, absent_tasks):
            missing.append(f"no WSD results ({probes_dir / task}/): WSD is not shown")
        for task in display.of_kind(TaskKind.STRUCTURAL, absent_tasks):
            missing.append(
                f"no structural-probe results ({probes_dir / task}/): "
                "the structural probe is not shown"
            )
        controls = {task for task in expected.tasks if display.is_control(task)}
        if controls and not controls & tasks:
            missing.append("no control-task runs: selectivity is not shown")
        if expected.learning_curves and not curves:
            missing.append(
                "no learning-curve runs (<task>/<features>/<encoder>/seed<k>/"
                f"{FRACTION_PREFIX}<f>/): probe learning curves are not shown"
            )
    return Inputs(trained, random, probes, curves, missing, conditional, codes)


HYDRA_PROBES = "probes"  # the probe stage's folder inside a Hydra run (multirun job) folder


def probe_roots(source: Path) -> list[Path]:
    """The probe-result folders (``<task>/<features>/<encoder>/...``) of ``report.sources`` entry
    ``source``: a Hydra multirun folder (``multirun/<time>/<job>/probes``, every job), a Hydra run
    folder (``outputs/<time>/probes``), or such a probes folder itself."""
    if not source.is_dir():
        raise ElmolabError("report.sources: no such folder", source)
    if (source / HYDRA_PROBES).is_dir():
        return [source / HYDRA_PROBES]
    jobs = sorted(
        (job / HYDRA_PROBES for job in source.iterdir() if (job / HYDRA_PROBES).is_dir()),
        key=lambda path: (len(path.parent.name), path.parent.name),  # job 2 before job 10
    )
    return jobs or [source]


def _unique(results: list[R], what: str) -> list[R]:
    """``results`` (probe runs or online codes), or an error naming the two files of one found
    twice."""
    seen: dict[tuple[Any, ...], Path] = {}
    for result in results:
        if result.identity in seen:
            raise ElmolabError(
                f"the same {what} (task {result.task}, features {result.features}, encoder "
                f"{result.encoder}, seed {result.seed}) is also in {seen[result.identity]}: "
                "keep one source",
                result.path,
            )
        seen[result.identity] = result.path
    return results


def _unpaired_conditional(probes: list[ProbeRun], conditional: list[ProbeRun]) -> list[str]:
    """A missing-input line for conditional probes whose layer-0 run of the same seed is absent
    (the information beyond layer 0 needs it), or none."""
    baselines = {
        (run.task, run.encoder, run.seed) for run in probes if run.features == CONDITIONAL_BASE
    }
    unpaired = dict.fromkeys(
        f"{run.task}/{run.features}/{run.encoder}/seed{run.seed}"
        for run in conditional
        if (run.task, run.encoder, run.seed) not in baselines
    )
    if not unpaired:
        return []
    return [
        f"conditional probes without the {CONDITIONAL_BASE} run of their seed (not shown): "
        + ", ".join(unpaired)
    ]


def _read_pretraining(
    folder: Path, what: str, missing: list[str], with_curve: bool = False
) -> Pretraining | None:
    path = folder / METRICS_FILE
    if not path.is_file():
        missing.append(f"no {what} metrics ({path})")
        return None
    metrics = read_pretraining_metrics(path)
    curve = None
    if with_curve:
        if (folder / CURVE_FILE).is_file():
            curve = read_curve(folder / CURVE_FILE)
        else:
            missing.append(f"no learning curve ({folder / CURVE_FILE})")
    return Pretraining(path, metrics, curve)


def read_pretraining_metrics(path: Path) -> dict[str, Any]:
    """A biLM ``metrics.json``: ``val`` and ``test`` perplexities (mean, forward, backward) are
    required; ``unigram_ppl``, ``parameters``, ``steps``, ``tokens``, ``tokens_per_second`` and
    ``wall_seconds`` are shown when present (the random control has no training)."""
    data = _load_json_object(path)
    for split in ("val", "test"):
        values = _require(data, split, dict, path)
        for key in PPL_KEYS:
            _require(values, key, float, path, f"{split}.")
    if "unigram_ppl" in data:
        unigram = _require(data, "unigram_ppl", dict, path)
        for split in ("valid", "test"):
            _require(unigram, split, float, path, "unigram_ppl.", nullable=True)
    return data


def read_curve(path: Path) -> dict[str, np.ndarray]:
    """``curve.csv`` as column -> float array; empty cells (rows without validation) are nan.
    Columns other than ``CURVE_REQUIRED`` are ignored."""
    with path.open(newline="", encoding="utf-8") as fin:
        reader = csv.DictReader(fin)
        absent = [c for c in CURVE_REQUIRED if c not in (reader.fieldnames or [])]
        if absent:
            raise ElmolabError(f"missing column(s) {', '.join(absent)} in the header", path, 1)
        columns: dict[str, list[float]] = {c: [] for c in CURVE_REQUIRED}
        for row in reader:
            for column in CURVE_REQUIRED:
                cell = (row[column] or "").strip()
                try:
                    columns[column].append(float(cell) if cell else math.nan)
                except ValueError:
                    raise ElmolabError(
                        f"column {column!r}: {cell!r} is not a number", path, reader.line_num
                    ) from None
    return {column: np.asarray(values, dtype=float) for column, values in columns.items()}


def read_probe_runs(probes_dir: Path) -> list[ProbeRun]:
    """Every probe run's ``metrics.json`` under ``probes_dir`` on all the training data (the
    first two layouts of the module docstring; other files are not probe runs), validated
    against its path."""
    return [read_probe_run(path, probes_dir) for path in probe_run_paths(probes_dir)]


def read_learning_curve_runs(probes_dir: Path) -> list[ProbeRun]:
    """Every learning-curve run under ``probes_dir`` (``.../seed<k>/fraction_<f>/metrics.json``),
    validated like :func:`read_probe_run`; ``train_fraction`` must be the folder's f."""
    return [read_probe_run(path, probes_dir) for path in learning_curve_paths(probes_dir)]


def read_probe_run(path: Path, probes_dir: Path) -> ProbeRun:
    data = _load_json_object(path)
    # task, features, encoder[, seed<k>[, fraction_<f>]]
    parts = path.relative_to(probes_dir).parts[:-1]
    identity = _identity(data, path, parts[:4], seeded=False)
    train_fraction = _train_fraction(data, parts[4] if len(parts) == 5 else None, path)
    n_train_sentences = (
        _require(data, "n_train_sentences", int, path, nullable=True)
        if "n_train_sentences" in data
        else None
    )
    if data.get("applicable", True) is False:
        return ProbeRun(
            **identity,
            applicable=False,
            train_fraction=train_fraction,
            n_train_sentences=n_train_sentences,
        )
    weights = (
        _require(data, "mix_weights", list, path, nullable=True) if "mix_weights" in data else None
    )
    per_sentence_test = _per_sentence(data.get("per_sentence_test"), path)
    bits, tokens = _per_sentence_bits(data, per_sentence_test, path)
    return ProbeRun(
        **identity,
        metric=_require(data, "metric", str, path),
        dev=_require(data, "dev", float, path),
        test=_require(data, "test", float, path),
        mix_weights=None
        if weights is None
        else tuple(_as_float(w, "mix_weights", path) for w in weights),
        gamma=_require(data, "gamma", float, path, nullable=True) if "gamma" in data else None,
        per_sentence_test=per_sentence_test,
        train_fraction=train_fraction,
        n_train_sentences=n_train_sentences,
        epochs=_require(data, "epochs", int, path) if "epochs" in data else None,
        hit_epoch_cap=(
            _require(data, "hit_epoch_cap", bool, path) if "hit_epoch_cap" in data else None
        ),
        extra=_extra_scores(data, path),
        per_sentence_test_bits=bits,
        per_sentence_test_tokens=tokens,
        wall_seconds=(
            _require(data, "wall_seconds", float, path) if "wall_seconds" in data else None
        ),
        per_sentence_test_spans=_spans(data.get("per_sentence_test_spans"), path),
    )


def _identity(
    data: Mapping[str, Any], path: Path, parts: tuple[str, ...], seeded: bool
) -> dict[str, Any]:
    """A result's ``path``, ``task``, ``features``, ``encoder`` and ``seed``, checked against the
    folders it lies in (``parts``: task, features, encoder, then ``seed<k>`` unless the result has
    no seed). ``seeded``: the seed may not be null."""
    task = _require(data, "task", str, path)
    features = _require(data, "features", str, path)
    encoder = _require(data, "encoder", str, path)
    seed = _require(data, "seed", int, path, nullable=not seeded)
    expected = (task, features, encoder) + (() if seed is None else (f"seed{seed}",))
    if parts != expected:
        raise ElmolabError(
            f"contents (task {task!r}, features {features!r}, encoder {encoder!r}, seed {seed}) "
            "disagree with the file's path",
            path,
        )
    return {"path": path, "task": task, "features": features, "encoder": encoder, "seed": seed}


def _train_fraction(data: Mapping[str, Any], folder: str | None, path: Path) -> float:
    """The run's ``train_fraction``: that of its ``fraction_<f>`` folder, else 1."""
    if folder is None:
        fraction = (
            _require(data, "train_fraction", float, path) if "train_fraction" in data else 1.0
        )
        if fraction != 1.0:
            raise ElmolabError(
                f"train_fraction {fraction} outside a {FRACTION_PREFIX}<f>/ folder "
                "(runs on all the training data have 1.0)",
                path,
            )
        return fraction
    try:
        path_fraction = float(folder.removeprefix(FRACTION_PREFIX))
    except ValueError:
        path_fraction = math.nan
    if not 0.0 < path_fraction < 1.0:
        raise ElmolabError(
            f"folder {folder!r} should be {FRACTION_PREFIX}<f> with 0 < f < 1 (e.g. "
            f"{FRACTION_PREFIX}0.1)",
            path,
        )
    fraction = _require(data, "train_fraction", float, path)
    if not math.isclose(fraction, path_fraction, rel_tol=1e-9):
        raise ElmolabError(
            f"train_fraction {fraction} disagrees with the file's path ({folder})", path
        )
    return path_fraction


def _extra_scores(data: Mapping[str, Any], path: Path) -> dict[str, float]:
    """The ``dev_<name>``/``test_<name>`` scores (numbers, or null for none) beyond dev/test."""
    return {
        key: _as_float(value, key, path)
        for key, value in data.items()
        if key.startswith(("dev_", "test_")) and value is not None
    }


def _per_sentence(value: Any, path: Path) -> PerSentence | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ElmolabError("per_sentence_test must be an object {correct, total}", path)
    correct = _counts(value, "correct", path, "per_sentence_test.")
    total = _counts(value, "total", path, "per_sentence_test.")
    if correct.shape != total.shape:
        raise ElmolabError(
            f"per_sentence_test: {correct.size} correct counts but {total.size} totals", path
        )
    if (correct > total).any():
        raise ElmolabError("per_sentence_test: counts must be integers with correct <= total", path)
    return PerSentence(correct, total)


def _spans(value: Any, path: Path) -> SentenceSpans | None:
    if value is None:
        return None
    where = "per_sentence_test_spans."
    if not isinstance(value, Mapping):
        raise ElmolabError("per_sentence_test_spans must be an object {tp, pred, gold}", path)
    tp, pred, gold = (_counts(value, key, path, where) for key in ("tp", "pred", "gold"))
    if not tp.shape == pred.shape == gold.shape:
        raise ElmolabError(
            f"per_sentence_test_spans: {tp.size} tp, {pred.size} pred and {gold.size} gold "
            "counts: one each per test sentence",
            path,
        )
    if (tp > np.minimum(pred, gold)).any():
        raise ElmolabError(
            "per_sentence_test_spans: a sentence has more right chunks (tp) than predicted or "
            "gold ones",
            path,
        )
    return SentenceSpans(tp, pred, gold)


def _counts(data: Mapping[str, Any], key: str, path: Path, prefix: str = "") -> np.ndarray:
    """``data[key]``: a list of counts (integers >= 0), as int64."""
    values = np.asarray(_require(data, key, list, path, prefix))
    if values.ndim != 1 or (values.size and (values.dtype.kind not in "iu" or (values < 0).any())):
        raise ElmolabError(f"{prefix}{key} must be a list of counts (integers >= 0)", path)
    return values.astype(np.int64)


def _per_sentence_bits(
    data: Mapping[str, Any], per_sentence_test: PerSentence | None, path: Path
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``per_sentence_test_bits`` and the tokens of each test sentence: ``per_sentence_test``'s
    totals, else ``per_sentence_test_tokens`` (a metric that is not counted); all of one length.
    Absent or null bits: (None, None)."""
    if data.get("per_sentence_test_bits") is None:
        return None, None
    bits = np.asarray(_number_list(data, "per_sentence_test_bits", path), dtype=float)
    if per_sentence_test is not None:
        tokens, source = per_sentence_test.total, "per_sentence_test"
    elif data.get("per_sentence_test_tokens") is not None:
        tokens, source = _counts(data, "per_sentence_test_tokens", path), "per_sentence_test_tokens"
    else:
        return bits, None
    if len(bits) != len(tokens):
        raise ElmolabError(
            f"per_sentence_test_bits: {len(bits)} sentences but {source} has {len(tokens)}", path
        )
    return bits, tokens


def read_online_codes(probes_dir: Path) -> list[OnlineCode]:
    """Every ``online_code.json`` under ``probes_dir``, validated against its path."""
    return [read_online_code(path, probes_dir) for path in online_code_paths(probes_dir)]


def read_online_code(path: Path, probes_dir: Path) -> OnlineCode:
    """One online code (``elmolab.io.results``): every field checked, the per-block lists of one
    length, and ``task``, ``features``, ``encoder``, ``seed`` as in its path."""
    data = _load_json_object(path)
    # task, features, encoder, seed<k>
    identity = _identity(data, path, path.relative_to(probes_dir).parts[:-1], seeded=True)
    fractions = _number_list(data, "fractions", path)
    block_tokens = _require(data, "block_tokens", list, path)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in block_tokens):
        raise ElmolabError("'block_tokens' should be a list of integers", path)
    block_bits = _number_list(data, "block_bits", path)
    if not fractions or not len(fractions) == len(block_tokens) == len(block_bits):
        raise ElmolabError(
            f"fractions, block_tokens and block_bits should have one entry per block, got "
            f"{len(fractions)}, {len(block_tokens)} and {len(block_bits)}",
            path,
        )
    return OnlineCode(
        **identity,
        labels=_require(data, "labels", int, path),
        fractions=tuple(fractions),
        block_tokens=tuple(block_tokens),
        block_bits=tuple(block_bits),
        uniform_bits=_require(data, "uniform_bits", float, path),
        online_bits=_require(data, "online_bits", float, path),
        compression=_require(data, "compression", float, path),
        wall_seconds=_require(data, "wall_seconds", float, path),
        same_features_as=(
            _require(data, "same_features_as", str, path, nullable=True)
            if "same_features_as" in data
            else None
        ),
    )


def _number_list(data: Mapping[str, Any], key: str, path: Path) -> list[float]:
    """``data[key]``, checked to be a list of numbers."""
    return [_as_float(value, key, path) for value in _require(data, key, list, path)]


def read_taskmodel(folder: Path, missing: list[str]) -> dict[str, Any] | None:
    """The task model stage's summary (``<folder>/metrics.json``), or None and a line in
    ``missing``."""
    path = folder / "metrics.json"
    if not path.is_file():
        missing.append(f"no task-model results ({path}): ELMo in a task model is not shown")
        return None
    summary = _load_json_object(path)
    versus = summary.get("vs_baseline", {})
    if not isinstance(versus, Mapping) or any(
        not isinstance(v, Mapping) or "effect" not in v for v in versus.values()
    ):
        missing.append(
            f"{path}: written by an older task model stage (a t-test over seeds, no two-level"
            " test): ELMo in a task model is not shown until `dvc repro taskmodel` reruns it"
        )
        return None
    return summary


def _load_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ElmolabError(f"cannot read: {err}", path) from None
    except json.JSONDecodeError as err:
        raise ElmolabError(f"not valid JSON: {err.msg}", path, err.lineno) from None
    if not isinstance(data, dict):
        raise ElmolabError("expected a JSON object at the top level", path)
    return data


def _require(
    data: Mapping[str, Any],
    key: str,
    kind: type,
    path: Path,
    prefix: str = "",
    nullable: bool = False,
) -> Any:
    """``data[key]``, checked to be a ``kind`` (an int counts as a float; a bool only as a bool)."""
    if key not in data:
        raise ElmolabError(f"missing key '{prefix}{key}'", path)
    value = data[key]
    if value is None and nullable:
        return None
    if kind is float:
        return _as_float(value, prefix + key, path)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise ElmolabError(
            f"'{prefix}{key}' should be {kind.__name__}, got {type(value).__name__}", path
        )
    return value


def _as_float(value: Any, key: str, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ElmolabError(f"'{key}' should be a number, got {value!r}", path)
    return float(value)
