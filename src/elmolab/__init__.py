"""elmolab: pretrain ELMo-style biLMs and probe what their layers know.

``from elmolab import Elmo, batch_to_ids`` gives ELMo for a user's own model (``elmolab.elmo``);
they are imported on first use, so ``import elmolab`` stays light (no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elmolab.elmo import Elmo, batch_to_ids

__version__ = "0.1.0"
__all__ = ["Elmo", "batch_to_ids"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from elmolab import elmo

        return getattr(elmo, name)
    raise AttributeError(f"module 'elmolab' has no attribute {name!r}")
