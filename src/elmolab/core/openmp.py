"""How a stage's idle OpenMP threads wait: chosen before torch loads, since OpenMP reads it then.

Between two parallel regions (two ops of a training step) OpenMP's worker threads either spin,
ready for the next region, or sleep and must be woken (``OMP_WAIT_POLICY=ACTIVE`` / ``PASSIVE``;
unset, they spin briefly and then sleep). A stage that has every core to itself and runs many
small ops (an LSTM step by step) loses a third of its speed to the wake-ups: on a 2-core AMD EPYC,
``bench/train.py`` trained the CPU default at 2,547 tokens/s sleeping, 3,155 unset and 3,726
spinning (bf16), and ``bench/embed.py`` extracted 4,642 against 7,279 tokens/s. Spinning hurts
only where another busy process needs the core the spinning thread holds, so the stages that use
every core alone (pretrain, extract) spin, the probe stage (one thread per forked worker) keeps
OpenMP's default, and an ``OMP_WAIT_POLICY`` set in the environment always wins (set ``PASSIVE``
when stages share the machine, e.g. a parallel Hydra sweep of pretraining runs).

Torch-free on purpose: importing this module must not load OpenMP.
"""

from __future__ import annotations

import os
import sys


def spin_idle_threads() -> None:
    """Set ``OMP_WAIT_POLICY=ACTIVE`` unless the environment chose a policy. Call it before
    anything imports torch: once torch is loaded (a test that imports a stage in-process)
    OpenMP has read the variable, and this changes nothing."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
