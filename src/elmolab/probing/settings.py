"""The probe stage's settings: the schema of ``conf/probe/`` and what each probe kind's training
reads of it (:class:`Schedule`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from elmolab.errors import ElmolabError
from elmolab.hardware import PrecisionChoice, choose_precision

PRECISIONS = ("auto", "32-true", "bf16-mixed")
# The kinds trained as token probes: a label per token, per (word, gold head), per pooled sentence.
TOKEN_KINDS = ("token", "pair", "sentence")


@dataclass
class TreeSettings:
    """Schema of ``probe.tree``: what the tree probes (deparc, structural) do differently."""

    lr: float  # Adam, the probe's own parameters
    lr_decay: float  # lr factor after an epoch without improvement
    batch_tokens: int  # whole sentences per step, about this many words
    max_epochs: int
    patience: int  # epochs without improvement before a head stops
    max_stalls: int  # epochs without improvement in all (not in a row) before a head stops
    rank: int  # structural probe: rows of the linear map B


@dataclass
class ProbeSettings:
    """Schema of the ``probe`` section (``conf/probe/default.yaml`` gives every value and why)."""

    features_dir: str  # the extract stage's output: <features_dir>/<encoder>/<dataset>/<split>
    encoders: list[str]  # names of extract.encoders, each probed in every cell
    kind: str  # linear | mlp (token and pair tasks)
    hidden_dim: int  # mlp only
    dropout: float  # mlp only
    root: str  # pair and arc tasks: the vector standing for the root, learned | zeros
    lr: float  # Adam, the probe's own parameters (token tasks)
    pair_lr: float  # Adam, the probe's own parameters (pair tasks)
    mix_lr: float  # Adam, the learned scalar mix (every task)
    lr_decay: float  # lr factor after an epoch without improvement (token and pair tasks)
    weight_decay: float  # on the classifier (token and pair tasks)
    batch_size: int  # tokens per step (token and pair tasks)
    max_epochs: int
    patience: int  # epochs without progress in a row before a head stops
    max_stalls: int  # epochs without progress in all (not in a row) before a head stops
    min_delta: float  # progress: the dev score up by more than this (or the loss by this share)
    layer_norm: bool  # normalize each layer before mixing
    standardize: bool  # each layer's dimensions by the train split's mean and std (load_splits)
    l2_lambda: float  # L2 penalty on the learned scalar-mix logits
    num_threads: int  # torch intra-op threads of the cell's process (workers use one each)
    precision: str  # the probes' matrix products: auto (by the CPU) | 32-true | bf16-mixed
    workers: int  # jobs (an encoder and a training set each) side by side, one process each
    save_predictions: bool  # write test_predictions.txt beside metrics.json
    unseen: str | None  # raise | keep for every task (presets that cut the data); None: the task's
    train_fractions: list[float]  # token tasks: learning-curve points below the full train set
    subset_seed: int  # fixes the learning-curve subsets (never the probe seed)
    min_epoch_tokens: int  # an epoch cycles a small training set up to this many tokens
    # Online code (tasks with mdl): nested shares of the training sentences ending each block
    online_code_fractions: list[float]
    tree: TreeSettings

    def check(self) -> None:
        """Values the schema's types cannot rule out."""
        if self.kind not in ("linear", "mlp"):
            raise ElmolabError(f"probe.kind must be 'linear' or 'mlp', got {self.kind!r}")
        if self.root not in ("learned", "zeros"):
            raise ElmolabError(f"probe.root must be 'learned' or 'zeros', got {self.root!r}")
        if not self.encoders:
            raise ElmolabError("probe.encoders is empty: nothing to probe")
        if self.precision not in PRECISIONS:
            raise ElmolabError(
                f"probe.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        for key in ("batch_size", "max_epochs", "patience", "max_stalls", "workers", "hidden_dim"):
            if getattr(self, key) < 1:
                raise ElmolabError(f"probe.{key} must be at least 1, got {getattr(self, key)}")
        for key in ("batch_tokens", "max_epochs", "patience", "max_stalls", "rank"):
            if getattr(self.tree, key) < 1:
                raise ElmolabError(
                    f"probe.tree.{key} must be at least 1, got {getattr(self.tree, key)}"
                )
        for key, value in (
            ("lr", self.lr),
            ("pair_lr", self.pair_lr),
            ("mix_lr", self.mix_lr),
            ("tree.lr", self.tree.lr),
        ):
            if not value > 0:
                raise ElmolabError(f"probe.{key} must be positive, got {value}")
        for key, value in (("lr_decay", self.lr_decay), ("tree.lr_decay", self.tree.lr_decay)):
            if not 0 < value <= 1:
                raise ElmolabError(f"probe.{key} must lie in (0, 1], got {value}")
        if not 0 <= self.min_delta < 1:
            raise ElmolabError(f"probe.min_delta must lie in [0, 1), got {self.min_delta}")
        if not 0 <= self.dropout < 1:
            raise ElmolabError(f"probe.dropout must lie in [0, 1), got {self.dropout}")
        blocks = list(self.online_code_fractions)
        if (
            len(blocks) < 2
            or blocks[-1] != 1.0
            or blocks[0] <= 0
            or any(a >= b for a, b in itertools.pairwise(blocks))
        ):
            raise ElmolabError(
                "probe.online_code_fractions must rise strictly from above 0 to 1.0 (at least two"
                f" blocks), got {blocks}"
            )


def probe_precision(settings: ProbeSettings) -> PrecisionChoice:
    """``probe.precision`` resolved for this machine (probes run on the CPU): ``auto`` is
    bf16-mixed where the CPU has native bf16 instructions, else 32-true."""
    return choose_precision(settings.precision, "cpu", key="probe.precision")


def probe_dtype(settings: ProbeSettings) -> torch.dtype:
    """The type the probes read their features in: bf16 under bf16-mixed (the features rounded
    once, as each product would round them), else float32."""
    return torch.bfloat16 if probe_precision(settings).precision == "bf16-mixed" else torch.float32


@dataclass(frozen=True)
class Schedule:
    """The optimisation of one probe kind, as ``probe`` (token, pair) or ``probe.tree`` set it."""

    lr: float
    mix_lr: float
    lr_decay: float
    max_epochs: int
    patience: int
    max_stalls: int
    weight_decay: float
    min_delta: float

    @classmethod
    def of(cls, settings: ProbeSettings, kind: str) -> Schedule:
        """The schedule of probe ``kind``: token, pair, sentence (the token schedule), arc or
        structural."""
        if kind in ("arc", "structural"):
            t = settings.tree
            return cls(
                t.lr,
                settings.mix_lr,
                t.lr_decay,
                t.max_epochs,
                t.patience,
                t.max_stalls,
                0.0,
                settings.min_delta,
            )
        if kind not in TOKEN_KINDS:
            raise ValueError(f"unknown probe kind {kind!r}")
        return cls(
            settings.pair_lr if kind == "pair" else settings.lr,
            settings.mix_lr,
            settings.lr_decay,
            settings.max_epochs,
            settings.patience,
            settings.max_stalls,
            settings.weight_decay,
            settings.min_delta,
        )
