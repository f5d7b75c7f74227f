"""DVC's entry point of the polysemy stage: ``elmolab.stages.polysemy``."""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)

from elmolab.stages.polysemy import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parents[1] / "conf")
