"""Which feature modes each encoder of a probing cell runs: the one place that decides it.

Every encoder runs every mode of the grid (``grid.features``), on the whole training split and on
each learning-curve subset, except an instance of a control (``controls``: the random
initialisation's and the token layer's instances), which runs only the modes its comparisons with
the trained biLM use, ``probe.control_features`` among the grid's. On a conditional task it also
runs ``layer0`` beside them, the baseline of its conditional probes (``layer0+<mode>`` for each of
its modes in ``CONDITIONAL_MODES``, as every encoder's); its learning curves, only
``probe.control_features``. The conditional probes themselves follow from the full modes
(:func:`elmolab.probing.jobs.plan_jobs`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from elmolab.core.errors import ElmolabError
from elmolab.io.results import CONDITIONAL_BASE, CONDITIONAL_MODES, FeatureMode

# A control's modes where the task's probe learns no mix (WSD 1-NN): the single layers.
SINGLE_LAYER_MODES = (FeatureMode.LAYER0, FeatureMode.LAYER1, FeatureMode.LAYER2)


@dataclass(frozen=True)
class CellModes:
    """The feature modes of a cell's runs, per encoder, each in the grid's order."""

    grid: tuple[FeatureMode, ...]  # the grid's modes, in its order
    full: Mapping[str, tuple[FeatureMode, ...]]  # encoder -> its modes on all the training split
    curve: Mapping[str, tuple[FeatureMode, ...]]  # encoder -> its modes on learning-curve subsets

    @classmethod
    def resolve(
        cls,
        grid: Sequence[str],
        encoders: Sequence[str],
        controls: Collection[str] = (),
        control_features: Sequence[str] = (),
        *,
        conditional: bool = False,
        learned_mix: bool = True,
    ) -> CellModes:
        """The modes of ``encoders`` in a cell of the grid's modes ``grid``: all of them, but for
        an encoder of ``controls`` (a control's instance) those of ``control_features`` (and, with
        ``conditional``, ``layer0`` where one of them has a conditional probe). Mode names are
        checked: an unknown one is an ElmolabError naming its key. A task whose probe learns no
        mix (``learned_mix`` False: WSD 1-NN, cheap) runs a control's every single layer
        instead of the learned mix, the modes its comparisons with the trained biLM then use."""
        grid = tuple(FeatureMode.parse(mode) for mode in grid)
        try:
            wanted = {FeatureMode.parse(mode) for mode in control_features}
        except ElmolabError as err:
            raise ElmolabError(f"probe.control_features: {err.problem}") from None
        if not learned_mix and FeatureMode.SCALAR_MIX in wanted:
            wanted = (wanted - {FeatureMode.SCALAR_MIX}) | set(SINGLE_LAYER_MODES)
        restricted = tuple(mode for mode in grid if mode in wanted)
        with_base = conditional and any(mode in CONDITIONAL_MODES for mode in restricted)
        controlled = tuple(
            mode for mode in grid if mode in wanted or (with_base and mode == CONDITIONAL_BASE)
        )
        full = {e: controlled if e in controls else grid for e in encoders}
        curve = {e: restricted if e in controls else grid for e in encoders}
        return cls(grid, full, curve)

    def modes(self, encoder: str, fraction: float) -> tuple[FeatureMode, ...]:
        """``encoder``'s modes on the share ``fraction`` of the training split (1.0: all of it)."""
        return (self.full if fraction == 1.0 else self.curve)[encoder]

    def encoders(self) -> list[str]:
        """The encoders with a run, in their order."""
        return [encoder for encoder, modes in self.full.items() if modes]
