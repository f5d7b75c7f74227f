"""elmolab's C++ kernels, built on first use with the system's C++ compiler against the installed
torch, cached, and loaded as torch ops (``torch.ops.elmolab.*``):

- ``lstm_paired.cpp``: the time loop of the ``native`` LSTM path (``elmolab.models.lstm_paired``);
- ``sampled_softmax.cpp``: the elementwise part of the sampled softmax's log-normaliser
  (``elmolab.training.softmax``);
- ``char_cnn.cpp``: the character CNN's convolutions and max over positions
  (``elmolab.models.char_cnn``), from per-offset lookup tables;
- ``dropout.cpp``: dropout with a counter-based mask (``dropout`` below), recomputed in backward.

Each computes what the Python code beside it computes (tests compare them), in fewer passes over
memory and without Python between the steps. The build compiles the sources in parallel (one
compiler per core) and links them; it takes about half a minute on 2 idle cores, says so when
it starts (in the log where logging shows it, on stderr where not), and happens once per
source, torch version, compiler and CPU vector width (the cache key), under ``$ELMOLAB_CACHE_DIR``
(default ``$XDG_CACHE_HOME/elmolab`` or ``~/.cache/elmolab``) in ``native/<key>/``; it is written
to a temporary name and renamed, so concurrent processes (DDP ranks, sweep jobs) never load a
half-written library. The vector width is what torch itself dispatches to on this CPU
(``torch.backends.cpu.get_cpu_capability()``: AVX-512, AVX2 or none).

Where there is no compiler or the build fails, ``native_kernels()`` says why, the code keeps its
Python path (``lstm_path: auto`` then chooses ``paired``) and metrics.json records it.
``ELMOLAB_NATIVE=0`` turns the kernels off.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.cpp_extension

log = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("lstm_paired.cpp", "sampled_softmax.cpp", "char_cnn.cpp", "dropout.cpp")
)
HEADERS = (Path(__file__).with_name("vec_io.h"),)
LIBRARY = "elmolab_kernels.so"
# Compiler flags per torch CPU capability: the instruction set the vector code is built for.
VECTOR_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
    "DEFAULT": [],
}
# What the first build's notice says it takes: a source's compile time is mostly torch's headers,
# so it varies little with the sources (measured: docs/pretraining.md, "The kernels' build").
BUILD_TIME = "about half a minute on 2 idle cores, longer on a busy machine, less with more cores"


@dataclass(frozen=True)
class NativeKernels:
    """Whether the kernels are loaded, and the library or the reason they are not."""

    available: bool
    detail: str  # what they were built for ("AVX512, g++ 12.2.0"), or why there are none
    library: str | None = None  # the loaded library's path

    def as_dict(self) -> dict[str, object]:
        """What metrics.json records (no machine-specific path)."""
        return {"available": self.available, "detail": self.detail}


def cache_dir() -> Path:
    """Where built libraries are kept."""
    if os.environ.get("ELMOLAB_CACHE_DIR"):
        return Path(os.environ["ELMOLAB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "elmolab"


def _capability() -> str:
    capability = torch.backends.cpu.get_cpu_capability()
    return capability if capability in VECTOR_FLAGS else "DEFAULT"


def _compile_flags(capability: str) -> list[str]:
    """The flags every source compiles with (``-c``, into its own object file)."""
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        "-O3",
        "-std=c++20",
        "-fPIC",
        "-fopenmp",  # at::parallel_for runs on torch's OpenMP threads
        "-ffp-contract=off",  # a * b + c rounds twice, as in ATen's elementwise kernels
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-DCPU_CAPABILITY={capability}",
        *([f"-DCPU_CAPABILITY_{capability}"] if capability != "DEFAULT" else []),
        *VECTOR_FLAGS[capability],
        *(f"-I{p}" for p in torch.utils.cpp_extension.include_paths()),
    ]


def _link_flags() -> list[str]:
    """The flags that link the object files into one library against torch."""
    torch_lib = Path(torch.__file__).parent / "lib"
    return [
        "-shared",
        "-fopenmp",
        f"-L{torch_lib}",
        f"-Wl,-rpath,{torch_lib}",
        "-lc10",
        "-ltorch_cpu",
    ]


def _run_compiler(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-20:])
        raise RuntimeError(f"building the kernels ({what}) with {command[0]} failed:\n{tail}")


def _compile_and_link(compiler: str, capability: str, folder: Path, jobs: int) -> Path:
    """Each source compiled into an object file in ``folder``, ``jobs`` compilers at once, then
    linked; returns the library in ``folder``."""
    flags = _compile_flags(capability)
    objects = [folder / f"{source.stem}.o" for source in SOURCES]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        compiled = [
            pool.submit(
                _run_compiler, [compiler, *flags, "-c", str(source), "-o", str(out)], source.name
            )
            for source, out in zip(SOURCES, objects, strict=True)
        ]
        for done in compiled:
            done.result()  # the first failure, with its compiler output
    library = folder / LIBRARY
    _run_compiler([compiler, *map(str, objects), "-o", str(library), *_link_flags()], "linking")
    return library


def _announce(message: str) -> None:
    """``message`` where the user sees it: in the log where logging is set up to show it (the
    stages), on stderr where it is not (a script that calls ``Elmo`` without configuring
    logging would otherwise see nothing while it waits)."""
    if log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info(message)
    else:
        print(f"elmolab: {message}", file=sys.stderr, flush=True)


def _build() -> tuple[Path, str]:
    """The library for this machine, built unless cached, and what it was built for; raises
    RuntimeError with the reason it cannot be built."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++)")
    capability = _capability()
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as error:
        raise RuntimeError(f"C++ compiler {compiler} does not run: {error}") from error
    key = hashlib.sha256(
        b"\0".join(
            [source.read_bytes() for source in SOURCES + HEADERS]
            + [torch.__version__.encode(), version.encode(), compiler.encode()]
            + [" ".join(_compile_flags(capability) + _link_flags()).encode()]
        )
    ).hexdigest()[:16]
    target = cache_dir() / "native" / key / LIBRARY
    built_for = f"{capability}, {version}"
    if target.is_file():
        return target, built_for
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a read-only home: this process builds for itself
        log.warning("cannot write %s (%s): building in a temporary folder", target.parent, error)
        target = Path(tempfile.mkdtemp(prefix="elmolab-kernels-")) / LIBRARY
    # One compiler per core: each source takes about as long (mostly torch's headers).
    jobs = min(os.cpu_count() or 1, len(SOURCES))
    _announce(
        f"building the C++ kernels for this machine ({built_for}; {len(SOURCES)} sources, "
        f"{jobs} at a time), once: {BUILD_TIME}; the library is cached in {target.parent}"
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        os.replace(_compile_and_link(compiler, capability, Path(tmp), jobs), target)
    log.info("built the C++ kernels in %.1f s: %s", time.perf_counter() - start, target)
    return target, built_for


_turned_off = False  # set by turned_off(): the Python code runs as if there were no kernels


@contextlib.contextmanager
def turned_off() -> Iterator[None]:
    """Within the block, ``native_kernels()`` says none are available (benchmarks use this to
    measure the Python code beside the kernels in one process)."""
    global _turned_off
    before, _turned_off = _turned_off, True
    try:
        yield
    finally:
        _turned_off = before


def native_applies(
    *tensors: torch.Tensor, dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
) -> bool:
    """Whether the kernels take ``tensors``: loaded, and every tensor on the CPU in ``dtypes``
    (the callers' Python code runs otherwise: GPUs, float64, no compiler)."""
    return all(t.device.type == "cpu" and t.dtype in dtypes for t in tensors) and (
        native_kernels().available
    )


def native_kernels() -> NativeKernels:
    """The kernels, built (if needed) and loaded once per process; never raises."""
    if _turned_off:
        return NativeKernels(False, "turned off (elmolab.native.turned_off)")
    return _load()


@functools.cache
def _load() -> NativeKernels:
    if os.environ.get("ELMOLAB_NATIVE", "1") == "0":
        return NativeKernels(False, "turned off (ELMOLAB_NATIVE=0)")
    try:
        library, built_for = _build()
        torch.ops.load_library(str(library))
    except (RuntimeError, OSError) as error:
        log.warning("elmolab's C++ kernels are not available, using Python's code: %s", error)
        return NativeKernels(False, str(error))
    return NativeKernels(True, built_for, str(library))


class _Dropout(torch.autograd.Function):
    """``dropout.cpp``: the mask from (seed, element index), recomputed for the gradient."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, p: float, seed: int
    ) -> torch.Tensor:
        ctx.p, ctx.seed = p, seed
        return torch.ops.elmolab.dropout_apply(x, p, seed)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        return torch.ops.elmolab.dropout_apply(grad, ctx.p, ctx.seed), None, None


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Training-time dropout (``F.dropout(x, p, training=True)``): each element is zeroed with
    probability ``p`` and the rest scaled by ``1 / (1 - p)``. On the CPU with the kernels loaded
    the mask comes from ``dropout.cpp``, its seed drawn from torch's generator (so
    ``torch.manual_seed`` makes it repeat); elsewhere from ``F.dropout``."""
    if p <= 0.0 or not native_applies(x):
        return torch.nn.functional.dropout(x, p, training=True)
    seed = int(torch.randint(0, 2**62, (1,)).item())
    return _Dropout.apply(x, p, seed)
