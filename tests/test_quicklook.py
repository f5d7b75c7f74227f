"""The quick look's workspace (``elmolab.launch.quicklook``): the working tree copied as it
stands, kept exactly up to date by the next copy even after one killed half-way, with DVC
settings that share the project's cache and remotes. ``make smoke`` itself runs in
tests/stages/test_pipeline_e2e.py.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elmolab.launch.quicklook import CACHE_TYPE, COPIED, configure_dvc, copy_tree, tree_files

COMMITTED = {
    ".gitignore": "/artifacts/\n",
    "dvc.yaml": "stages: {}\n",
    "dvc.lock": "schema: '2.0'\n",
    "params.yaml": "seed: 1\n",
    "conf/config.yaml": "seed: 1\n",
    "src/a.py": "A = 1\n",
}


def _git(repo: Path, *args: str) -> None:
    identity = ["-c", "user.name=elmolab tests", "-c", "user.email=tests@elmolab.invalid"]
    subprocess.run(["git", *identity, *args], cwd=repo, check=True, capture_output=True)


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")


def _files(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
        for p in folder.rglob("*")
        if p.is_file() and p.name != COPIED
    }


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A git working tree: committed files, an uncommitted edit, an untracked file and an ignored
    one."""
    root = tmp_path / "tree"
    _write(root, COMMITTED)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "tree")
    _write(root, {"conf/config.yaml": "seed: 2\n", "conf/new.yaml": "x: 1\n"})
    _write(root, {"artifacts/result.txt": "the study's result\n"})
    return root


def test_the_workspace_is_the_working_tree_with_its_own_params_lock_and_artifacts(
    tree: Path, tmp_path: Path
) -> None:
    names = tree_files(tree)
    assert names == {".gitignore", "dvc.yaml", "conf/config.yaml", "conf/new.yaml", "src/a.py"}
    workspace = tmp_path / "smoke"
    own = {"params.yaml": "seed: 7\n", "dvc.lock": "its own\n", "artifacts/r.txt": "its own\n"}
    _write(workspace, own)

    copy_tree(tree, workspace, names)

    assert _files(workspace) == {**{name: (tree / name).read_text() for name in names}, **own}
    assert (workspace / "conf" / "config.yaml").read_text() == "seed: 2\n"  # uncommitted edits


# An earlier quick look's copy, started again after the tree changed, and killed after its
# second file.
KILLED_COPY = """
import sys
from pathlib import Path
from elmolab.launch.quicklook import copy_tree, tree_files

root, workspace = Path(sys.argv[1]), Path(sys.argv[2])
copy_tree(root, workspace, tree_files(root))
"""


def test_a_copy_killed_half_way_is_finished_by_the_next_one(tree: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "smoke"
    copy_tree(tree, workspace, tree_files(tree))
    (tree / "src" / "a.py").unlink()
    _write(tree, {"dvc.yaml": "stages: {changed: 1}\n", "src/b.py": "B = 2\n"})

    env = {**os.environ, "ELMOLAB_FAILPOINT": "file_copied:2"}
    args = [sys.executable, "-c", KILLED_COPY, str(tree), str(workspace)]
    assert subprocess.run(args, env=env).returncode == -signal.SIGKILL
    assert (workspace / "src" / "b.py").is_file() and (workspace / "src" / "a.py").is_file()
    # Before the next copy, the file the killed one brought leaves the tree: the workspace's
    # list of what it may hold, written before copying, still names it.
    (tree / "src" / "b.py").unlink()
    copy_tree(tree, workspace, tree_files(tree))

    assert _files(workspace) == {name: (tree / name).read_text() for name in tree_files(tree)}
    assert not list(workspace.rglob("*.tmp"))


def test_the_workspace_shares_the_projects_cache_and_remotes(tmp_path: Path) -> None:
    from dvc.config import Config

    root = tmp_path / "project"
    config = "[core]\n    remote = store\n['remote \"store\"']\n    url = ../../store\n"
    _write(root, {".dvc/config": config})
    workspace = root / "smoke"
    _write(workspace, {".dvc/config": config, ".dvc/config.local": "[cache\n"})  # half-written

    configure_dvc(root, workspace)

    settings = Config(dvc_dir=workspace / ".dvc")
    assert Path(settings["cache"]["dir"]) == root.resolve() / ".dvc" / "cache"
    assert settings["cache"]["type"] == CACHE_TYPE.split(",")
    assert Path(settings["remote"]["store"]["url"]) == (tmp_path / "store").resolve()
    assert settings["core"]["no_scm"]
    # What the real command line makes of it.
    dvc = [sys.executable, "-m", "dvc", "cache", "dir"]
    shown = subprocess.run(dvc, cwd=workspace, capture_output=True, text=True, check=True)
    assert Path(shown.stdout.strip()) == root.resolve() / ".dvc" / "cache"
