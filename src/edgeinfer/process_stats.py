"""This process's ``process_*`` figures (memory, CPU, file descriptors, start time), read from /proc:
what the metrics exposition, the status page and the supervisor's per-worker gauges show."""

from __future__ import annotations

import os
import resource
from pathlib import Path

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_stats() -> dict[str, float]:
    """This process's ``process_*`` values (the names prometheus-client's process collector uses), read
    from /proc; empty where there is no /proc."""
    try:
        vsize, rss = (int(field) for field in Path("/proc/self/statm").read_text().split()[:2])
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        fds = len(os.listdir("/proc/self/fd"))
    except (OSError, StopIteration, ValueError):
        return {}
    times = os.times()
    return {
        "process_resident_memory_bytes": float(rss * _PAGE_BYTES),
        "process_virtual_memory_bytes": float(vsize * _PAGE_BYTES),
        "process_cpu_seconds_total": times.user + times.system,
        "process_open_fds": float(fds),
        "process_max_fds": float(resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
        "process_start_time_seconds": boot + int(stat[19]) / _TICKS,
    }
