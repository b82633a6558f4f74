"""The machine a benchmark ran on, printed with its figures (shared by every bench script).

CPU model, usable cores, memory, load average, Python and NumPy, and the BLAS that NumPy
loaded with its thread count (through threadpoolctl when it is installed, else NumPy's own
build configuration). The environment variables that change BLAS kernels or threads are
printed too: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE pick older, slower kernels on some
processors, and a figure measured under them is not comparable with one measured without.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BLAS_ENVIRONMENT = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds over an interval: this process's own, every process's on the machine (all
    its cores, from /proc/stat), and the core-seconds the machine had (wall x cores)."""

    process: float
    machine: float
    available: float

    @property
    def others(self) -> float:
        """Other processes: a bench's helpers (parse workers) and anything else running."""
        return max(self.machine - self.process, 0.0)

    @property
    def busy(self) -> float:
        """The share of the machine's core-seconds spent."""
        return self.machine / self.available if self.available else 0.0


def _machine_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of every core since boot; None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(f) for f in stat.readline().split()[1:9]]
    except OSError:  # pragma: no cover - not on Linux
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


class CpuMeter:
    """Started when made; `stop()` gives the `CpuUse` since (machine figures 0 off Linux)."""

    def __init__(self) -> None:
        self._times = os.times()
        self._jiffies = _machine_jiffies()

    def stop(self) -> CpuUse:
        times = os.times()
        process = (times.user - self._times.user) + (times.system - self._times.system)
        jiffies = _machine_jiffies()
        if jiffies is None or self._jiffies is None:
            return CpuUse(process, 0.0, 0.0)
        tick = os.sysconf("SC_CLK_TCK")
        busy, total = (now - then for now, then in zip(jiffies, self._jiffies, strict=True))
        return CpuUse(process, busy / tick, total / tick)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which containers narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _meminfo(field: str) -> str:
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith(field + ":"):
                return f"{int(line.split()[1]) / 1024**2:.1f} GiB"
    return "unknown"


def blas() -> str:
    """The BLAS NumPy uses: library, version, kernel architecture and thread count."""
    # A tiny product makes NumPy load its BLAS, so threadpoolctl can see it.
    np.ones((2, 2), dtype=np.float32) @ np.ones(2, dtype=np.float32)
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return _blas_from_config() + " (install threadpoolctl for the kernel and thread count)"
    pools: list[dict[str, Any]] = threadpool_info()
    if not pools:
        return _blas_from_config()
    return "; ".join(
        f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture', '?')} kernels, "
        f"{p.get('num_threads')} threads, {p.get('threading_layer', '?')})"
        for p in pools
    )


def _blas_from_config() -> str:
    try:
        config: Any = np.show_config(mode="dicts")
        info = config["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version')}"
    except Exception:  # pragma: no cover - a NumPy without the dict mode
        return "unknown BLAS"


def describe() -> str:
    """A few lines naming the machine and the numeric stack, for a benchmark's output."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    env = ", ".join(f"{name}={os.environ[name]}" for name in BLAS_ENVIRONMENT if name in os.environ)
    return "\n".join(
        [
            f"machine: {_cpu_model()}; {usable_cores()} usable cores of {os.cpu_count()}; "
            f"memory {_meminfo('MemTotal')} total, {_meminfo('MemAvailable')} available",
            f"load average (1, 5, 15 min) at start: {load} (a shared machine: compare the "
            "ratios measured within one run, not absolute times across runs)",
            f"python {platform.python_version()} ({sys.implementation.name}), numpy "
            f"{np.__version__}, BLAS {blas()}",
            f"BLAS environment: {env or 'none of ' + ', '.join(BLAS_ENVIRONMENT[:2]) + ' set'}",
        ]
    )


if __name__ == "__main__":
    print(describe())
