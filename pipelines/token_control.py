"""DVC's entry point of the token_control stage: ``elmolab.stages.token_control``."""

from pathlib import Path

import _venv  # noqa: F401  (before the project imports: re-runs under .venv if needed)

from elmolab.stages.token_control import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parents[1] / "conf")
