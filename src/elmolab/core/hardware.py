"""What this machine is: the CPU model and whether it runs bf16 natively, decided at run time.

``trainer.precision: auto`` and ``probe.precision: auto`` resolve here: bf16-mixed on a GPU that
supports bf16 and on a CPU with native bf16 instructions (AMX-bf16 or AVX512-BF16), float32
elsewhere. On a CPU without them PyTorch emulates bf16 and is many times slower than float32 (an
AVX2-only CPU trained the default biLM 27x slower in bf16-mixed), so the choice is made by the
flags of the running CPU, never by a setting that one machine happened to like.
"""

from __future__ import annotations

import functools
import platform
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 math
_CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def _cpuinfo_fields() -> dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo ({} where there is none)."""
    try:
        text = _CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers where /proc/cpuinfo has them, e.g.
    'AMD EPYC (family 25, model 17)': a generic name alone tells CPU generations apart badly."""
    fields = _cpuinfo_fields()
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is not available)."""
    return frozenset(_cpuinfo_fields().get("flags", "").split())


def native_bf16_flags() -> list[str]:
    """The native-bf16 flags this CPU has: [] means bf16 would be emulated."""
    flags = cpu_flags()
    return [flag for flag in NATIVE_BF16_FLAGS if flag in flags]


@dataclass(frozen=True)
class PrecisionChoice:
    """A Lightning precision and why it was chosen (recorded in metrics.json and the log)."""

    precision: str  # "32-true" or "bf16-mixed" (or what the config named)
    reason: str
    requested: str  # the config's value, e.g. "auto"

    def as_dict(self) -> dict[str, str]:
        return {"chosen": self.precision, "requested": self.requested, "reason": self.reason}


def choose_precision(
    requested: str, accelerator: str, key: str = "trainer.precision"
) -> PrecisionChoice:
    """Resolve a precision setting (``key``, e.g. ``trainer.precision``): anything but ``auto`` is
    kept as the config says."""
    if requested != "auto":
        return PrecisionChoice(requested, f"set in the config ({key})", requested)
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if on_gpu:
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            name = torch.cuda.get_device_name()
            return PrecisionChoice("bf16-mixed", f"GPU {name} supports bf16", requested)
        return PrecisionChoice("32-true", "the GPU does not support bf16", requested)
    native = native_bf16_flags()
    if native:
        return PrecisionChoice(
            "bf16-mixed", f"CPU {cpu_model()} runs bf16 natively ({', '.join(native)})", requested
        )
    return PrecisionChoice(
        "32-true",
        f"CPU {cpu_model()} has no native bf16 (neither {' nor '.join(NATIVE_BF16_FLAGS)}): "
        "emulated bf16 is many times slower than float32",
        requested,
    )


def peak_memory() -> dict[str, int]:
    """This process's peak resident memory so far, and the largest of its finished child
    processes' (workers), in bytes (``getrusage``'s ``ru_maxrss``; Linux counts KiB)::

        {"peak_rss_bytes": int, "peak_rss_children_bytes": int}
    """
    scale = 1 if sys.platform == "darwin" else 1024  # macOS counts bytes
    return {
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
        "peak_rss_children_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale,
    }
