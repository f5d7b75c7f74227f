"""Atomic outputs: write to a temporary sibling, rename into place only when complete.

A process killed at any moment leaves either the old output or the new one, never half of one;
the temporary it was writing is removed the next time the same output is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import h5py


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; on success rename it onto ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.chmod(0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual permissions
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        _name_output(error, target)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``path``; on success it replaces ``path`` whole."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    tmp.chmod(0o777 & ~_UMASK)  # mkdtemp makes 0700
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        _name_output(error, target)
        raise


def _name_output(error: BaseException, target: Path) -> None:
    """Give an OSError that names no file (a failed ``write``: a full disk) the output's final
    name, so the one line reporting it says which output could not be written."""
    if isinstance(error, OSError) and error.filename is None:
        error.filename = str(target)


@contextlib.contextmanager
def atomic_hdf5(path: str | os.PathLike[str]) -> Iterator[h5py.File]:
    """Yield a new HDF5 file, open for writing, that appears at ``path`` only if the ``with``
    block ends without an exception (then it is closed and renamed into place).

    HDF5 writes through an unbuffered Python file (h5py's ``fileobj`` driver), so a failed write
    (a full disk) raises ``OSError`` (errno 28) where it happens and the file still closes. With
    HDF5's own POSIX driver such a failure surfaces only when h5py releases an object, where it
    can only be printed, the writer carries on, and HDF5 (2.0) crashes with a segmentation fault
    in a later write or in closing the file. The files are the same HDF5, byte for byte from one
    run to the next.
    """
    with atomic_path(path) as tmp, open(tmp, "r+b", buffering=0) as raw:
        file = h5py.File(raw, "w")
        try:
            yield file
        except BaseException:
            # The block's error is the one to report; closing after a failed write can fail
            # too (h5py then raises from the driver's callbacks), which says nothing more.
            with contextlib.suppress(Exception):
                file.close()
            raise
        file.close()  # before the file object and the rename: HDF5 flushes here


def _remove_stale_temporaries(target: Path) -> None:
    """Remove what a killed writer of ``target`` left: ``.<name>.*.tmp`` and ``.<name>.old``.

    One output has one writer at a time (a DVC stage, rank 0 of a DDP run, one probe worker per
    encoder folder), so a temporary of the same name is always a dead writer's.
    """
    for stale in target.parent.glob(f".{glob_escape(target.name)}.*"):
        if stale.name.endswith(".tmp") or stale.name == f".{target.name}.old":
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def write_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> None:
    """Write ``lines``, each ended by a newline, as UTF-8 text, atomically."""
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in lines)
