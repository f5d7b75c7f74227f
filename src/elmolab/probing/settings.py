"""The probe stage's settings: the schema of ``conf/probe/`` and what each probe kind's training
reads of it (:class:`Schedule`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from elmolab.core.hardware import PrecisionChoice, choose_precision
from elmolab.core.schema import ProbeSettings


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
    """The optimisation of one probe kind, as ``probe`` (token, pair) or ``probe.tree`` set it
    (each kind names its own: ``elmolab.probing.kinds``)."""

    lr: float
    mix_lr: float
    lr_decay: float
    max_epochs: int
    patience: int
    max_stalls: int
    weight_decay: float
    min_delta: float

    @classmethod
    def of_probe(cls, settings: ProbeSettings, lr: float) -> Schedule:
        """``probe``'s schedule at learning rate ``lr``: the probes that label items (token,
        sentence, pair)."""
        return cls(
            lr,
            settings.mix_lr,
            settings.lr_decay,
            settings.max_epochs,
            settings.patience,
            settings.max_stalls,
            settings.weight_decay,
            settings.min_delta,
        )

    @classmethod
    def of_tree(cls, settings: ProbeSettings) -> Schedule:
        """``probe.tree``'s schedule: the tree probes (arc, structural)."""
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
