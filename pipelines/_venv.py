"""Run a stage under the project's virtualenv, whichever ``python`` started it.

``dvc.yaml`` runs ``python pipelines/<stage>.py``: the ``python`` first on PATH. When that is not
the project's ``.venv`` (``.venv/bin/dvc repro`` without activating it, a system ``dvc``), the
stage would die on its first import. Importing this module first re-executes the script with
``.venv/bin/python`` in that case; without a ``.venv`` it stops with one line saying what to do.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"


def _in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_project_python() -> None:
    """Return if the project's packages import here; else re-execute under ``.venv`` or exit."""
    try:
        import omegaconf  # noqa: F401

        import elmolab  # noqa: F401
    except ImportError as error:
        missing = error.name
    else:
        return
    python = VENV / "bin" / "python"
    if python.is_file() and not _in_venv():
        os.execv(python, [str(python), *sys.argv])
    print(
        f"error: {sys.executable} cannot import {missing!r}: run `make install` (it creates "
        f"{VENV}), then `source .venv/bin/activate`, or use the make targets (`make run`)",
        file=sys.stderr,
    )
    sys.exit(2)


ensure_project_python()
