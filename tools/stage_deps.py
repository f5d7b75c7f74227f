"""Each dvc.yaml stage's code, computed from its imports: what the stage's ``deps`` must list.

    .venv/bin/python tools/stage_deps.py [STAGE ...]

A stage's code is the import closure of its entry point (the ``pipelines/<stage>.py`` its ``cmd``
runs) within the project: every ``import`` and ``from ... import`` of every module reached, at
the top or inside a function (static, from the source), each package's ``__init__.py`` on the
way, and the package data (``pyproject.toml``'s ``package-data``: the C++ sources, the report's
templates) of every package reached. Imports under ``if TYPE_CHECKING:`` never run and are left
out; a package's ``__getattr__`` (PEP 562) counts only where a name that is not a submodule is
imported from the package. A foreach or matrix stage is read once, from its template (``probe@*``).

Prints each stage's code deps, a directory where the closure holds every file under it, then
what ``dvc.yaml`` lacks or lists in vain (its ``src/`` and ``pipelines/`` deps only: data,
artifacts and config are not code); exit status 1 when there is any. ``tests/test_stage_deps.py``
holds ``dvc.yaml`` to it.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "elmolab"
CODE_DEPS = ("src/", "pipelines/")  # the deps checked; the others are data, artifacts, config
ENTRY_POINT = re.compile(r"\bpython\s+(pipelines/\S+\.py)\b")
TYPE_CHECKING = ("TYPE_CHECKING", "typing.TYPE_CHECKING")  # true for type checkers only


Imported = tuple[str, str]  # (module, the name taken from it; "" for ``import module``)


@functools.cache
def _source(module: str, root: Path, scripts: Path) -> Path | None:
    """The file of ``module``: the package's under ``root/src``, any other beside the entry point
    (``scripts``: ``pipelines/_venv.py``); None if it is not the project's (torch, json)."""
    parts = module.split(".")
    base = root / "src" if parts[0] == PACKAGE else scripts
    for path in (base.joinpath(*parts, "__init__.py"), base.joinpath(*parts).with_suffix(".py")):
        if path.is_file():
            return path
    return None


@functools.cache
def _imports(path: Path, root: Path) -> tuple[list[Imported], list[Imported]]:
    """What the module at ``path`` imports where it can run (at the top or in a function; not under
    ``if TYPE_CHECKING:``), and what its ``__getattr__`` (PEP 562) imports, which runs only for a
    name the module does not have."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    lazy = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
    eager, todo = [], [n for n in tree.body if n not in lazy]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) in TYPE_CHECKING:
            todo += node.orelse
        elif isinstance(node, ast.Import | ast.ImportFrom):
            eager.append(node)
        else:
            todo += ast.iter_child_nodes(node)
    lazy_imports = [
        n for f in lazy for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    return _resolve(eager, path, root), _resolve(lazy_imports, path, root)


def _resolve(nodes: list[ast.Import | ast.ImportFrom], path: Path, root: Path) -> list[Imported]:
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
            continue
        module = node.module or ""
        if node.level:  # relative: from the package of ``path``, up ``level - 1`` packages
            package = path.relative_to(root / "src").parent.parts
            base = ".".join(package[: len(package) - node.level + 1])
            module = f"{base}.{module}" if module else base
        found += [(module, alias.name) for alias in node.names]
    return found


def _package_data(root: Path) -> dict[Path, list[str]]:
    """Package folder -> the glob patterns of its data files, from ``pyproject.toml``."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    data = pyproject["tool"]["setuptools"].get("package-data", {})
    return {root.joinpath("src", *package.split(".")): globs for package, globs in data.items()}


def closure(entry_point: str, root: Path = ROOT) -> set[str]:
    """Every file of the project that running ``entry_point`` loads, relative to ``root``."""
    scripts = (root / entry_point).parent
    seen: set[Path] = set()
    todo: list[Path | None] = [root / entry_point]

    def reach(module: str) -> Path | None:
        """Queue ``module`` and each package on its way (their ``__init__.py`` runs first)."""
        parts = module.split(".")
        todo.extend(_source(".".join(parts[:i]), root, scripts) for i in range(1, len(parts) + 1))
        return _source(module, root, scripts)

    def follow(module: str, name: str) -> None:
        """Queue what ``from module import name`` (``import module``: no name) loads."""
        found = reach(module)
        # ``from package import name``: a submodule, or else perhaps what __getattr__ loads
        if name and reach(f"{module}.{name}") is None and found and found.stem == "__init__":
            for lazy in _imports(found, root)[1]:
                follow(*lazy)

    while todo:
        path = todo.pop()
        if path is None or path in seen:
            continue
        seen.add(path)
        for imported in _imports(path, root)[0]:
            follow(*imported)
    for package, globs in _package_data(root).items():
        if any(path.is_relative_to(package) for path in seen):
            seen |= {path for pattern in globs for path in package.glob(pattern)}
    return {path.relative_to(root).as_posix() for path in seen}


def stages(dvc_yaml: Path) -> dict[str, tuple[str, list[str]]]:
    """Stage -> (entry point, deps) of each stage of ``dvc_yaml`` that runs one; a foreach or
    matrix stage once, from its template, named ``<stage>@*``."""
    found = {}
    for name, stage in yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"].items():
        if "foreach" in stage:
            name, stage = f"{name}@*", stage["do"]
        elif "matrix" in stage:
            name = f"{name}@*"
        entry_point = ENTRY_POINT.search(stage["cmd"])
        if entry_point:
            found[name] = (entry_point.group(1), [str(dep) for dep in stage.get("deps", [])])
    return found


def _covers(dep: str, path: str) -> bool:
    """Whether ``dep`` (a file or a folder) is or holds ``path``."""
    return path == dep or path.startswith(dep.rstrip("/") + "/")


def problems(dvc_yaml: Path, root: Path = ROOT) -> list[str]:
    """A line for each file a stage of ``dvc_yaml`` loads but does not list, and for each code
    dep it lists but does not load."""
    found = []
    for name, (entry_point, deps) in stages(dvc_yaml).items():
        files = closure(entry_point, root)
        found += [
            f"stage {name}: imports {path}, not in dvc.yaml deps"
            for path in sorted(files)
            if not any(_covers(dep, path) for dep in deps)
        ]
        found += [
            f"stage {name}: lists {dep}, which it does not import"
            for dep in deps
            if dep.startswith(CODE_DEPS) and not any(_covers(dep, path) for path in files)
        ]
    return found


def minimal_deps(files: set[str], root: Path = ROOT) -> list[str]:
    """``files`` with each folder whose every file is among them written as the folder."""
    folders = {parent.as_posix() for f in files for parent in Path(f).parents if parent.parts}
    deps = set(files)
    for folder in sorted(folders, key=len):  # outermost first: a whole package, not its parts
        inside = {
            path.relative_to(root).as_posix()
            for path in (root / folder).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        }
        if inside <= files and not any(_covers(dep, folder) for dep in deps):
            deps = {dep for dep in deps if not _covers(folder, dep)} | {folder}
    return sorted(deps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", nargs="*", help="the stages to print (default: all), e.g. probe@*")
    parser.add_argument("--dvc-yaml", type=Path, default=ROOT / "dvc.yaml")
    args = parser.parse_args()
    for name, (entry_point, _) in stages(args.dvc_yaml).items():
        if not args.stage or name in args.stage:
            print(
                f"{name}:", *(f"  - {dep}" for dep in minimal_deps(closure(entry_point))), sep="\n"
            )
    found = problems(args.dvc_yaml)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
