"""A full disk and exhausted memory become one line (``elmolab.core.errors.resource_error``); HDF5
files written through ``atomic_hdf5`` report a full disk where it happens and never crash."""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from elmolab.core.errors import resource_error

HDF5_TEXT = (
    "Can't decrement id ref count (file write failed: time = Sun Dec  6 14:20:01 2026\n, "
    "filename = '/ws/artifacts/features/trained/.conll2000.q333x8iz.tmp/.test.hdf5.lnzsamvw.tmp'"
    ", file descriptor = 3, errno = 28, error message = 'No space left on device', buf = 0x5)"
)


def test_a_full_disk_names_the_stage_the_final_file_and_the_free_space(tmp_path: Path) -> None:
    found = resource_error(RuntimeError(HDF5_TEXT), "extract", tmp_path)
    assert found is not None
    assert str(found).startswith(
        "/ws/artifacts/features/trained/conll2000/test.hdf5: no space left on device in stage "
        "extract ("
    )
    plain = OSError(errno.ENOSPC, "No space left on device")
    wrapped = RuntimeError("writing failed")
    wrapped.__cause__ = plain
    found = resource_error(wrapped, "probe", tmp_path / "absent" / "out.json")
    assert str(found).startswith(f"{tmp_path / 'absent' / 'out.json'}: no space left on device")
    assert str(found).endswith(
        " free on its filesystem now); free some space and run the stage again"
    )


@pytest.mark.parametrize(
    ("error", "asked"),
    [
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate "
                "memory: you tried to allocate 640000000000 bytes. Error code 12"
            ),
            "an allocation of 640,000,000,000 bytes (596.0 GiB) failed",
        ),
        (
            MemoryError("Unable to allocate 7.45 GiB for an array with shape (1000, 2000000)"),
            "an allocation of 7.45 GiB failed",
        ),
        (MemoryError(), "an allocation failed"),
    ],
)
def test_exhausted_memory_says_how_much_was_asked_for(error: BaseException, asked: str) -> None:
    found = resource_error(error, "pretrain", "artifacts/bilm")
    assert found is not None and str(found).startswith(f"out of memory in stage pretrain: {asked}")
    assert found.path is None


def test_other_errors_are_not_resource_errors() -> None:
    assert resource_error(OSError(errno.EACCES, "Permission denied"), "x", ".") is None
    assert resource_error(RuntimeError("shape mismatch"), "x", ".") is None


WRITE_UNTIL_FULL = """
import errno, sys
import numpy as np
from pathlib import Path
from elmolab.core.fsutil import atomic_hdf5
target = Path(sys.argv[1]) / "out.hdf5"
try:
    with atomic_hdf5(target) as out:
        for i in range(10_000):
            out.create_dataset(str(i), data=np.ones((20, 50), "float32"))
except OSError as error:
    assert error.errno == errno.ENOSPC and error.filename == str(target), error
    print("full")
"""


def test_an_hdf5_file_on_a_full_disk_raises_where_it_fails_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """With HDF5's own POSIX driver this ended in a segmentation fault (h5py 3.16, HDF5 2.0)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        done = subprocess.run(
            [sys.executable, "-c", WRITE_UNTIL_FULL, str(disk)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout == "full\n" and done.stderr == ""
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)
