"""Process memory for the benchmarks (Linux): resident now, and the peak so far."""

from __future__ import annotations

import resource


def rss_mib() -> float:
    """Current resident set size (MiB)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def max_rss_mib() -> float:
    """Peak resident set size of the process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
