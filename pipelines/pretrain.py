"""DVC's entry point of the pretrain stage: ``elmolab.stages.pretrain``."""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)
import _wait_policy  # noqa: F401  (before torch loads: idle OpenMP threads spin)

from elmolab.stages.pretrain import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parents[1] / "conf")
