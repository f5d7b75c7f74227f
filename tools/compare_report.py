"""Does this commit's report stage write the same report as a finished run's, byte for byte? For a
change that should alter structure only.

    .venv/bin/python tools/compare_report.py WORKSPACE

Runs the report stage of this checkout's HEAD (a clean, detached git worktree in a temporary
folder, so that the report names a commit and no local change) on WORKSPACE's finished inputs:
its ``params.yaml`` and every folder of ``artifacts/`` but ``report/``, linked read only. Then
compares every file of the new ``artifacts/report/`` with WORKSPACE's byte for byte, reading the
new commit's name as WORKSPACE's (the one place where the two must differ). Prints each file that
differs and a count; exit status 1 when any differs or either side has a file the other lacks.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _files(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workspace", type=Path, help="a finished run (repository root)")
    args = parser.parse_args()
    workspace = args.workspace.resolve()
    old_report = workspace / "artifacts" / "report"
    if not (old_report / "summary.json").is_file():
        sys.exit(f"{workspace}: no artifacts/report/summary.json (run the pipeline there first)")
    old_commit, new_commit = (
        _git("rev-parse", "HEAD", cwd=workspace),
        _git("rev-parse", "HEAD", cwd=ROOT),
    )
    with tempfile.TemporaryDirectory(prefix="compare_report_") as folder:
        tree = Path(folder) / "tree"
        _git("worktree", "add", "--quiet", "--detach", str(tree), "HEAD", cwd=ROOT)
        try:
            (tree / ".venv").symlink_to(ROOT / ".venv")
            (tree / "data").symlink_to(workspace / "data")
            (tree / "params.yaml").write_bytes((workspace / "params.yaml").read_bytes())
            (tree / "artifacts").mkdir()
            for inputs in (workspace / "artifacts").iterdir():
                if inputs.name != "report":
                    (tree / "artifacts" / inputs.name).symlink_to(inputs)
            # the worktree's code, not whatever the virtualenv's editable install points at
            env = {**os.environ, "WANDB_MODE": "disabled", "DVC_NO_ANALYTICS": "1"}
            env["PYTHONPATH"] = str(tree / "src")
            done = subprocess.run(
                [sys.executable, "pipelines/report.py", "--params", "params.yaml"],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
            )
            if done.returncode:
                sys.exit(
                    f"the report stage failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
                )
            new_report = tree / "artifacts" / "report"
            old_files, new_files = _files(old_report), _files(new_report)
            differ = sorted(
                name
                for name in old_files & new_files
                if (new_report / name)
                .read_bytes()
                .replace(new_commit.encode(), old_commit.encode())
                != (old_report / name).read_bytes()
            )
            only = sorted(old_files ^ new_files)
        finally:
            _git("worktree", "remove", "--force", str(tree), cwd=ROOT)
    for name in differ:
        print(f"differs: {name}")
    for name in only:
        print(f"in one only: {name}")
    print(
        f"{len(old_files)} vs {len(new_files)} report files (commit {new_commit[:7]} against"
        f" {old_commit[:7]}): {len(old_files & new_files) - len(differ)} identical byte for byte,"
        f" {len(differ)} differ, {len(only)} in one only"
    )
    return int(bool(differ or only))


if __name__ == "__main__":
    sys.exit(main())
