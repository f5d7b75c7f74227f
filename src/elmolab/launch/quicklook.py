"""The quick look: the smoke preset run in a workspace of its own, leaving the study untouched.

``make smoke`` runs ``experiment=smoke`` (``conf/experiment/smoke.yaml``, the whole pipeline in
minutes) with ``dvc repro`` in ``smoke/``, a copy of the working tree: the files git tracks and
the untracked ones it does not ignore, so uncommitted edits count. The copy has its own
``params.yaml`` (``conf/`` composed with the preset), ``dvc.lock`` and ``artifacts/``, and shares
the project's ``.venv`` and DVC cache: its data is linked from the cache, not copied, and what one
quick look computed the next finds there. The study's ``params.yaml``, ``dvc.lock`` and
``artifacts/`` stay as they were, so that ``make run`` afterwards runs the study.

Every run brings the whole workspace up to date again and trusts nothing an earlier, perhaps
interrupted, run left without checking it: each file is compared with the working tree's and
copied into place atomically; the files an earlier copy brought that the tree no longer has are
removed (the workspace lists what it may hold before copying anything); the DVC settings and
``params.yaml`` are written anew; and ``dvc repro`` redoes whatever a stopped run left undone.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

from elmolab.core.errors import ElmolabError
from elmolab.core.failpoints import failpoint
from elmolab.core.fsutil import atomic_path
from elmolab.core.params import compose_params, exit_with_error

WORKSPACE = Path("smoke")
PRESET = "experiment=smoke"
REPORT = Path("artifacts/report/index.html")
# The workspace's own files, never copied from the tree: what it ran and its DVC record.
OWN_FILES = frozenset({"params.yaml", "dvc.lock"})
# The files of the tree copied into the workspace, NUL-separated: what a later copy may remove.
COPIED = ".copied"
# Linked from the shared cache, never copied; symlinks where the cache lies on another filesystem.
CACHE_TYPE = "reflink,hardlink,symlink"


def tree_files(root: Path) -> set[str]:
    """The files of the working tree at ``root`` (relative paths): tracked, or untracked and not
    ignored by git; without the workspace's own files."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise ElmolabError(f"the quick look copies a git working tree: {error}", root) from error
    names = set(os.fsdecode(listed).split("\0")) - {""} - OWN_FILES
    # A file deleted from the tree but still in git's index is listed too.
    return {name for name in names if (root / name).is_file()}


def copy_tree(root: Path, workspace: Path, names: set[str]) -> None:
    """Make the files ``names`` of ``root`` those of ``workspace``: copy each that differs
    (atomically, its time kept), and remove the files an earlier copy brought and ``names`` no
    longer has. Whatever an interrupted copy left, the next one finishes it."""
    listing = workspace / COPIED
    earlier = (
        set(listing.read_text(encoding="utf-8").split("\0")) - {""} if listing.is_file() else set()
    )
    _write_listing(listing, earlier | names)
    for name in sorted(names):
        source, copy = root / name, workspace / name
        if not (copy.is_file() and filecmp.cmp(source, copy, shallow=False)):
            with atomic_path(copy) as tmp:
                shutil.copy2(source, tmp)
            failpoint("file_copied")
    for name in sorted(earlier - names):
        (workspace / name).unlink(missing_ok=True)
    _write_listing(listing, names)


def _write_listing(path: Path, names: set[str]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("\0".join(sorted(names)), encoding="utf-8")


def configure_dvc(root: Path, workspace: Path) -> None:
    """The workspace's local DVC settings: the cache and remotes of ``root``'s DVC project, links
    from the cache instead of copies, and no git (the workspace is ignored by ``root``'s)."""
    from dvc.config import Config

    project = Config(dvc_dir=root / ".dvc")
    cache = project["cache"].get("dir") or str(root.resolve() / ".dvc" / "cache")
    local = workspace / ".dvc" / "config.local"
    local.unlink(missing_ok=True)  # rewritten whole: an interrupted write leaves nothing to read
    with Config(dvc_dir=workspace / ".dvc").edit("local") as config:
        config["core"]["no_scm"] = True
        config["cache"]["dir"] = cache
        config["cache"]["type"] = CACHE_TYPE
        for name, remote in project["remote"].items():
            config["remote"][name] = dict(remote)


def prepare(root: Path, workspace: Path, overrides: list[str]) -> None:
    """Bring ``workspace`` up to date with the working tree at ``root``, its ``params.yaml``
    composed from its ``conf/`` with ``overrides``, its data checked out from the cache."""
    names = tree_files(root)
    workspace.mkdir(parents=True, exist_ok=True)
    copy_tree(root, workspace, names)
    venv = workspace / ".venv"
    if (root / ".venv").is_dir() and not venv.is_symlink():
        venv.symlink_to(os.path.relpath(root / ".venv", workspace), target_is_directory=True)
    configure_dvc(root, workspace)
    text = compose_params(workspace / "conf", overrides)
    with atomic_path(workspace / "params.yaml") as tmp:
        tmp.write_text(text, encoding="utf-8")
    tracked_data = sorted(name for name in names if name.endswith(".dvc"))
    if tracked_data:
        _dvc(workspace, "pull", "--quiet", *tracked_data)


def _dvc(workspace: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=workspace)
    if proc.returncode != 0:
        raise ElmolabError(
            f"`dvc {' '.join(args)}` failed (exit status {proc.returncode})", workspace
        )


def main() -> None:
    """``make smoke``: the quick look of the repository root that is the current folder."""
    print(
        f"The quick look ({PRESET}) runs in {WORKSPACE}/; params.yaml, dvc.lock and artifacts/ "
        "here stay as they are.",
        flush=True,
    )
    try:
        prepare(Path.cwd(), WORKSPACE, [PRESET])
        _dvc(WORKSPACE, "repro")
    except ElmolabError as error:
        exit_with_error(error)
    print(f"The quick look's report: {(WORKSPACE / REPORT).resolve()}")


if __name__ == "__main__":
    main()
