"""One exception type for every bad input, so entry points can print one clear line and exit."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from collections.abc import Iterator
from os import PathLike
from pathlib import Path


class ElmolabError(Exception):
    """A problem with the user's input: names the file (and line) and what is wrong.

    ``str(error)`` is the line a user sees, e.g. ``data/x.conllu:12: expected 10 columns, got 9``.
    """

    def __init__(
        self, problem: str, path: str | PathLike[str] | None = None, line: int | None = None
    ) -> None:
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        where = ""
        if self.path is not None:
            where = self.path if line is None else f"{self.path}:{line}"
            where += ": "
        super().__init__(where + problem)

    def __reduce__(self) -> tuple:
        # Rebuilt with its fields when it crosses a process boundary (probe workers).
        return (type(self), (self.problem, self.path, self.line))


NO_SPACE = ("No space left on device", "errno = 28")  # OSError's text; HDF5's RuntimeError's
_HDF5_FILENAME = re.compile(r"filename = '([^']+)'")
# atomic_path's and atomic_dir's temporaries, ``.<name>.<8 random characters>.tmp``: the user
# knows the output by its final name.
_TEMPORARY = re.compile(r"(^|/)\.([^/]+)\.[A-Za-z0-9_]{8}\.tmp(?=/|$)")
_TRIED = (
    re.compile(r"you tried to allocate (\d+) bytes"),  # torch's CPU allocator
    re.compile(r"[Tt]ried to allocate ([\d.]+ [KMGT]i?B)"),  # torch's CUDA allocator
    re.compile(r"[Uu]nable to allocate ([\d.]+ [KMGT]i?B)"),  # numpy
)


def resource_error(
    error: BaseException, stage: str, output: str | PathLike[str]
) -> ElmolabError | None:
    """The one line for a stage that ran out of disk space or memory, or None for other errors.

    Disk: an ``OSError`` with errno 28 anywhere in the exception's chain, or an error whose text
    carries it (HDF5 and torch wrap it in a RuntimeError). The line names the file being written
    (by its final name, not its temporary's; ``output``, the stage's output, where the error
    does not say) and the space free on its filesystem now, after the stage's temporaries were
    removed. Memory: a ``MemoryError``, or torch's "can't allocate memory" / "out of memory"
    RuntimeError; the line says how much the failed allocation asked for, where the error says.
    """
    chain: list[BaseException] = []
    node: BaseException | None = error
    while node is not None and node not in chain:
        chain.append(node)
        node = node.__cause__ or node.__context__
    for link in chain:
        text = str(link)
        if (isinstance(link, OSError) and link.errno == errno.ENOSPC) or any(
            marker in text for marker in NO_SPACE
        ):
            found = _HDF5_FILENAME.search(text)
            if isinstance(link, OSError) and link.filename:
                path = os.fsdecode(link.filename)
            else:
                path = found[1] if found else os.fspath(output)
            path = _TEMPORARY.sub(r"\1\2", path)
            return ElmolabError(
                f"no space left on device in stage {stage} ({_free_space(path)} free on its "
                "filesystem now); free some space and run the stage again",
                path,
            )
    for link in chain:
        text = str(link)
        if isinstance(link, MemoryError) or (
            isinstance(link, RuntimeError)
            and ("can't allocate memory" in text or "out of memory" in text)
        ):
            tried = next((m[1] for pattern in _TRIED if (m := pattern.search(text))), None)
            if tried is not None and tried.isdigit():
                tried = f"{int(tried):,} bytes ({_size(int(tried))})"
            asked = f"an allocation of {tried}" if tried else "an allocation"
            return ElmolabError(
                f"out of memory in stage {stage}: {asked} failed "
                f"({_size(_available_memory())} of memory available now)"
            )
    return None


@contextlib.contextmanager
def resource_errors_named(stage: str, output: str | PathLike[str]) -> Iterator[None]:
    """Re-raise a full disk or exhausted memory in the block as :func:`resource_error`'s one
    ElmolabError (from the original, kept as its cause); other errors pass unchanged."""
    try:
        yield
    except Exception as error:  # h5py can raise a full disk's OSError as another's context
        resource = resource_error(error, stage, output)
        if resource is None:
            raise
        raise resource from error


def _free_space(path: str) -> str:
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return _size(shutil.disk_usage(folder).free)


def _available_memory() -> int:
    """MemAvailable of /proc/meminfo, in bytes (0 where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _size(n_bytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            break
        n_bytes /= 1024
    return f"{n_bytes:.0f} {unit}" if unit == "bytes" else f"{n_bytes:.1f} {unit}"
