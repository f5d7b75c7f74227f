"""The registry of trained probe kinds: every kind of the schema that trains a probe has one
entry, under its own name, with a reference probe and a batched form."""

import re

import pytest

from elmolab.core.schema import TaskKind
from elmolab.probing.heads import HeadProbes
from elmolab.probing.kinds import KINDS, probe_kind
from elmolab.probing.probes import Probe

# The schema's kinds that train no probe: WSD is a 1-NN over sense centroids.
UNTRAINED = {TaskKind.WSD}


def test_every_trained_task_kind_has_one_registry_entry() -> None:
    assert set(KINDS) == set(TaskKind) - UNTRAINED
    for task_kind, kind in KINDS.items():
        assert kind.task_kind is task_kind
        assert issubclass(kind.reference, Probe) and issubclass(kind.batched, HeadProbes)
        assert probe_kind(task_kind.value) is kind


@pytest.mark.parametrize("name", ["wsd", "nope"])
def test_a_kind_outside_the_registry_is_refused_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"unknown probe kind {name!r}")):
        probe_kind(name)
