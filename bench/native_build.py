"""The C++ kernels' build, one compiler at a time against one per core, side by side.

Builds the library from scratch in empty temporary folders with the same compiler, flags and
sources as ``elmolab.native`` (its ``_compile_and_link``), alternating the two ways, and prints the
CPU model, each build's wall seconds and the ratio of the medians. The build a user meets is the
parallel one (``jobs`` = cores, at most one per source); ``--jobs 1`` is how it was before.

    .venv/bin/python bench/native_build.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from elmolab import native
from elmolab.core.hardware import cpu_model


def build_seconds(compiler: str, capability: str, jobs: int) -> float:
    with tempfile.TemporaryDirectory(prefix="elmolab-build-bench-") as folder:
        start = time.perf_counter()
        native._compile_and_link(compiler, capability, Path(folder), jobs)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="builds of each way (2)")
    args = parser.parse_args()
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise SystemExit("no C++ compiler found (set CXX or install g++)")
    capability = native._capability()
    parallel = min(os.cpu_count() or 1, len(native.SOURCES))
    print(
        f"{cpu_model()}, {os.cpu_count()} cores; {compiler}, {capability}, "
        f"{len(native.SOURCES)} sources"
    )
    seconds: dict[int, list[float]] = {1: [], parallel: []}
    for repeat in range(args.repeats):
        for jobs in (1, parallel) if repeat % 2 == 0 else (parallel, 1):
            seconds[jobs].append(build_seconds(compiler, capability, jobs))
            print(f"  jobs {jobs}: {seconds[jobs][-1]:.1f} s", flush=True)
    one, many = statistics.median(seconds[1]), statistics.median(seconds[parallel])
    print(f"median: one compiler {one:.1f} s, {parallel} at a time {many:.1f} s: {one / many:.2f}x")


if __name__ == "__main__":
    main()
