"""What ``make run`` says before the study starts: this machine, the precision the stages will
choose on it, and about how long the stages ``dvc repro`` is going to run will take.

The time comes from the measured figures below, scaled to the stages DVC will run (the changed
ones and everything downstream of them) and to the machine's class (native bf16 or not); their
sources are in docs/results.md ("How long the study takes"). Nothing is timed here: a
calibration long enough to say anything would cost minutes of its own.

    python -m elmolab.launch.estimate [--params params.yaml] [--conf conf]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from dvc.exceptions import DvcException
from omegaconf import DictConfig, OmegaConf

from elmolab.core.config import load_params
from elmolab.core.errors import ElmolabError
from elmolab.core.hardware import choose_precision, cpu_model, native_bf16_flags
from elmolab.core.params import compose_params, differing_keys

# Minutes per stage in the default study's uninterrupted run on a 2-core AMD EPYC (family 26,
# model 2) with avx512_bf16, nothing else running: 40.4 min in all (docs/results.md). A group
# of stages was timed together; prepare's figure includes the install and the data pull. That
# run had one instance of each control (its stages pretrain_random and token_control then), now
# each control's first instance; the others have no figure yet.
NATIVE_BF16_MINUTES: dict[tuple[str, ...], float] = {
    ("prepare",): 0.8,
    ("pretrain",): 9.7,
    ("pretrain_random@random",): 1.0,
    ("token_control@token_only",): 0.1,
    ("extract@ud_english_ewt",): 0.7,
    ("extract@conll2000",): 0.8,
    ("extract@wnut17",): 0.5,
    ("extract@conll2003",): 1.0,
    ("extract@sst",): 0.7,
    ("extract@semcor30",): 2.3,
    ("extract@raganato_eval",): 0.2,
    ("probe@upos",): 1.1,
    ("probe@xpos",): 1.2,
    ("probe@chunk",): 1.0,
    ("probe@ner",): 1.1,
    ("probe@deplabel",): 3.8,
    ("probe@deparc",): 4.8,
    ("probe@structural",): 2.2,
    ("probe@wsd",): 0.3,
    ("probe@supersense",): 1.1,
    ("probe@upos_control",): 0.9,
    ("probe@sentiment",): 0.2,
    ("taskmodel",): 4.5,
    ("polysemy", "report"): 0.3,
}
NATIVE_BF16_STUDY_MINUTES = 40.4  # the run's own clock, start to end
# The default study those minutes describe: each top-level section of its composition (the
# default of f7606a3, the last one whose stage times are known) by :func:`section_digest`. A
# default whose sections differ is another study, which no figure here describes.
MEASURED_SECTIONS = {
    "seed": "6b86b273ff34",
    "study": "0bc795864186",
    "task": "653138242f7f",
    "paths": "51d165ef3489",
    "corpus": "ed36917588e7",
    "model": "0f81785eebbe",
    "pretrain": "b9018f44b093",
    "trainer": "269ff169cad6",
    "logger": "435f0104ca7e",
    "report": "908b26af4725",
    "polysemy": "0b3b4f97ffee",
    "extract": "a1eaa301a02b",
    "probe": "92855f751767",
    "features": "85d695adf3fa",
    "grid": "dfdce85c7140",
    "taskmodel": "9fc37ad001e2",
}
# A 2-core CPU without native bf16 (float32 throughout): pretraining about 7.7x slower (about
# 2,400 tokens/s against 18,587) and the whole default study about 3 hours; the other stages'
# factor follows from those two. An estimate, not an uninterrupted run (docs/results.md).
NO_BF16_PRETRAIN_SLOWDOWN = 7.7
NO_BF16_STUDY_MINUTES = 180.0
PRETRAINING = ("pretrain",)  # the stages the pretraining slowdown applies to


@dataclass(frozen=True)
class Machine:
    """What the estimate depends on: the CPU, its cores, its native bf16 flags, a GPU."""

    cpu: str
    cores: int
    native_bf16: tuple[str, ...]  # () where bf16 would be emulated
    gpu: str | None  # its name, None without one

    @classmethod
    def this_one(cls) -> Machine:
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        return cls(cpu_model(), os.cpu_count() or 1, tuple(native_bf16_flags()), gpu)

    def describe(self) -> str:
        bf16 = f"yes ({', '.join(self.native_bf16)})" if self.native_bf16 else "no"
        return f"{self.cpu}, {self.cores} cores, native bf16: {bf16}, GPU: {self.gpu or 'none'}"


def stage_minutes(stages: list[str], native_bf16: bool) -> tuple[float, list[str]]:
    """Minutes the default study's ``stages`` take on a 2-core CPU with or without native bf16,
    and the stages among them that have no measured figure (not counted)."""
    pretraining = NATIVE_BF16_MINUTES[PRETRAINING]
    rest_factor = (NO_BF16_STUDY_MINUTES - NO_BF16_PRETRAIN_SLOWDOWN * pretraining) / (
        NATIVE_BF16_STUDY_MINUTES - pretraining
    )
    minutes = 0.0
    for group, figure in NATIVE_BF16_MINUTES.items():
        if any(stage in stages for stage in group):
            if native_bf16:
                minutes += figure
            else:
                minutes += figure * (
                    NO_BF16_PRETRAIN_SLOWDOWN if group == PRETRAINING else rest_factor
                )
    measured = {stage for group in NATIVE_BF16_MINUTES for stage in group}
    return minutes, [stage for stage in stages if stage not in measured]


def as_duration(minutes: float) -> str:
    """``minutes`` as a person would say them: 'under a minute', 'about 40 min', 'about 3.0 h'."""
    if minutes < 1:
        return "under a minute"
    if minutes < 90:
        return f"about {minutes:.0f} min"
    return f"about {minutes / 60:.1f} h"


def named(stages: list[str], most: int = 6) -> str:
    """``stages`` by name, the first ``most`` of them, for one line."""
    more = f" and {len(stages) - most} more" if len(stages) > most else ""
    return (", ".join(stages[:most]) or "none") + more


def section_digest(value: Any) -> str:
    """A composed section's value, as JSON with sorted keys, hashed (12 hex digits)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def stale_sections(conf: Path) -> list[str]:
    """The sections in which the default composition of ``conf`` differs from the study whose
    stage times this module holds (:data:`MEASURED_SECTIONS`), or that only one of them has."""
    default = OmegaConf.to_container(OmegaConf.create(compose_params(conf)))
    names = dict.fromkeys([*default, *MEASURED_SECTIONS])
    return [
        name
        for name in names
        if name not in default
        or name not in MEASURED_SECTIONS
        or section_digest(default[name]) != MEASURED_SECTIONS[name]
    ]


def estimate(
    machine: Machine, stages: list[str], differs: list[str], stale: Sequence[str] = ()
) -> str:
    """The estimate's line for ``stages`` (those DVC will run) on ``machine``; ``differs`` names
    the sections of params.yaml that differ from the default study (which alone was measured),
    ``stale`` those in which today's default differs from the study that was measured."""
    if not stages:
        return "nothing to run: every stage is up to date"
    if machine.gpu:
        return f"none: no measured figure exists for a machine with a GPU ({machine.gpu})"
    if stale:
        return (
            "none: the default study has changed since its stage times were measured (in "
            f"{', '.join(stale)}); its next uninterrupted run gives new figures (docs/results.md)"
        )
    if differs:
        return (
            f"none: params.yaml differs from the default study (in {', '.join(differs)}), "
            "and only the default study was measured"
        )
    minutes, unmeasured = stage_minutes(stages, bool(machine.native_bf16))
    if len(unmeasured) == len(stages):
        return f"none: no measured figure for {named(unmeasured)}"
    if machine.native_bf16:
        line = (
            f"{as_duration(minutes)}, scaled from the default study's {NATIVE_BF16_STUDY_MINUTES}"
            " min measured on a 2-core AMD EPYC with native bf16"
        )
    else:
        line = (
            f"{as_duration(minutes)}: an estimate for a 2-core CPU without native bf16 (float32; "
            f"pretraining about {NO_BF16_PRETRAIN_SLOWDOWN}x slower than with it, the default "
            f"study about {NO_BF16_STUDY_MINUTES / 60:.0f} h)"
        )
    if unmeasured:
        line += f"; not counted, without a measured figure: {named(unmeasured)}"
    return line + " (docs/results.md)"


def stages_to_run(root: Path) -> tuple[list[str], int]:
    """The stages ``dvc repro`` will run in ``root`` (those DVC finds changed and every stage
    downstream of them, which DVC itself finds changed only once the upstream ones have run),
    and how many stages the pipeline has; a data file tracked by a ``.dvc`` file is no stage."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # an edge runs from a stage to a stage it depends on
        # status names a stage by its address from the working directory, the output by name
        stages = {stage.addressing: stage for stage in graph if stage.cmd}
        to_run = set()
        for address in repo.status().keys() & stages.keys():
            to_run.add(stages[address])
            to_run.update(nx.ancestors(graph, stages[address]))
    return [stage.name for stage in stages.values() if stage in to_run], len(stages)


def params_differences(cfg: DictConfig, conf: Path) -> list[str]:
    """The top-level sections in which ``cfg`` (params.yaml) differs from the default
    composition of ``conf`` (the default study), in the composition's order: the sections of
    :func:`elmolab.core.params.differing_keys`, the comparison ``make run``'s check makes."""
    given = OmegaConf.to_container(cfg)
    default = OmegaConf.to_container(OmegaConf.create(compose_params(conf)))
    return list(dict.fromkeys(key.split(".")[0] for key in differing_keys(given, default)))


def summary(root: Path, params: Path, conf: Path, machine: Machine) -> list[str]:
    """The block ``make run`` prints before ``dvc repro``: the machine, the precisions, the
    stages to run and the estimate."""
    cfg = load_params(params)
    pretraining = choose_precision(cfg.trainer.precision, cfg.trainer.accelerator)
    probes = choose_precision(cfg.probe.precision, "cpu", key="probe.precision")
    reasons = dict.fromkeys([pretraining.reason, probes.reason])  # once where they agree
    try:
        stages, total = stages_to_run(root)
        to_run = f"{len(stages)} of {total} ({named(stages) if len(stages) < total else 'all'})"
    except DvcException as error:  # not a DVC project, or a broken dvc.yaml: dvc repro says so
        stages = [stage for group in NATIVE_BF16_MINUTES for stage in group]
        to_run = f"DVC could not tell ({type(error).__name__}: {error}); counting every stage"
    differs = params_differences(cfg, conf)
    return [
        f"this machine: {machine.describe()}",
        f"precision: pretraining {pretraining.precision}, probes {probes.precision} "
        f"({'; '.join(reasons)})",
        f"stages to run: {to_run}",
        f"estimated time: {estimate(machine, stages, differs, stale_sections(conf))}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--conf", type=Path, default=Path("conf"))
    args = parser.parse_args()
    try:
        lines = summary(Path(os.getcwd()), args.params, args.conf, Machine.this_one())
    except ElmolabError as error:
        raise SystemExit(f"error: {error}") from None
    print("\n".join(["Before the study:", *(f"  {line}" for line in lines)]), flush=True)


if __name__ == "__main__":
    main()
