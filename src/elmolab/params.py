"""Compose ``conf/`` into ``params.yaml`` exactly as ``dvc exp run`` does.

``dvc repro`` reads ``params.yaml`` without recomposing it, so the committed file must equal the
composition of ``conf/`` (a test checks it). ``make params`` rewrites it after editing ``conf/``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def compose_params(conf_dir: Path, overrides: list[str] | None = None) -> str:
    """The text of ``params.yaml`` composed from ``conf_dir`` with Hydra ``overrides``."""
    from dvc.utils.hydra import compose_and_dump

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "params.yaml"
        compose_and_dump(out, str(conf_dir.resolve()), None, "config", "", overrides or [])
        return out.read_text(encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=smoke")
    parser.add_argument("--conf", default="conf", type=Path, help="config folder (conf)")
    parser.add_argument("--out", default="params.yaml", type=Path, help="output (params.yaml)")
    args = parser.parse_args()
    from elmolab.fsutil import atomic_path

    with atomic_path(args.out) as tmp:
        tmp.write_text(compose_params(args.conf, args.overrides), encoding="utf-8")


if __name__ == "__main__":
    main()
