"""Lightning's messages that do not apply to elmolab's runs, dropped once per process.

Pretraining and the task model both build Trainers; this module is what they share of Lightning's
output handling, apart from the trainers themselves (so the task model does not import
pretraining).
"""

from __future__ import annotations

import functools
import logging
import warnings

_IRRELEVANT_WARNINGS = (
    r"You're resuming from a checkpoint that ended before the epoch ended",
    r"Your `IterableDataset` has `__len__` defined",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


@functools.cache  # once per process: filters added again would pile up on the logger
def quiet_lightning() -> None:
    """Drop Lightning's messages that do not apply here (its tip to install litlogger, printed
    by every Trainer, among them); its other messages and every other warning still show."""
    for message in _IRRELEVANT_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropTips())
