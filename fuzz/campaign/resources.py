"""What this machine can give a campaign's workers: CPUs, memory, and what
one worker process takes of it.

A worker is one process fuzzing on one core (or one GPU); more workers than
that only fight over the same cores.  Its memory is measured, never
assumed: a forked worker shares its parent's pages until it writes them, so
what another worker costs is the memory private to a warm one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["MEMORY_SHARE", "cpu_count", "available_memory", "private_memory", "MemoryBudget", "MIB"]

MIB = 1 << 20
# The share of the memory available when workers start that they may take together.
MEMORY_SHARE = 0.5


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity, e.g. a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    """What the memory cgroup of this process may still allocate, if it is
    limited (cgroup v2, else v1)."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as fh:
            lines = [line.rstrip("\n").split(":", 2) for line in fh]
    except OSError:
        return None
    for hierarchy, controllers, path in lines:
        if hierarchy == "0" and not controllers:
            found = _headroom(os.path.join("/sys/fs/cgroup", path.lstrip("/")), "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            found = _headroom(os.path.join("/sys/fs/cgroup/memory", path.lstrip("/")), "memory.limit_in_bytes",
                              "memory.usage_in_bytes")
        else:
            continue
        if found is not None:
            return found
    return None


def _headroom(base: str, limit_name: str, usage_name: str) -> int | None:
    try:
        with open(os.path.join(base, limit_name), encoding="ascii") as fh:
            limit = fh.read().strip()
        if limit == "max" or int(limit) >= 1 << 60:  # unlimited
            return None
        with open(os.path.join(base, usage_name), encoding="ascii") as fh:
            return max(0, int(limit) - int(fh.read().strip()))
    except (OSError, ValueError):
        return None


def available_memory() -> int | None:
    """Bytes that can still be allocated here without swapping or the OOM
    killer (the kernel's MemAvailable, less where a cgroup limit is lower);
    None where the system does not say."""
    known = [m for m in (_meminfo_available(), _cgroup_headroom()) if m is not None]
    return min(known) if known else None


def private_memory(pid: int) -> int | None:
    """Bytes private to a process (not shared with its parent or siblings):
    what one more process like it costs.  None once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            total = 0
            for line in fh:
                if line.startswith(("Private_Clean:", "Private_Dirty:", "Swap:")):
                    total += int(line.split()[1]) * 1024
            return total
    except (OSError, ValueError, IndexError):
        pass
    try:  # kernels without smaps_rollup: the resident set, an overestimate
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class MemoryBudget:
    """How many more workers fit: ``share`` of the ``available`` bytes, each
    ``worker_bytes`` (measured on a warm worker)."""

    worker_bytes: int
    available: int
    share: float = MEMORY_SHARE

    @property
    def fits(self) -> int:
        return int(self.share * self.available // max(1, self.worker_bytes))

    def describe(self, running: int, asked: int) -> str:
        """Why only ``running`` + ``fits`` of ``asked`` workers run."""
        return (f"started {running + self.fits} of the {asked} workers asked for: a warm worker takes "
                f"{self.worker_bytes / MIB:.0f} MiB of its own, and {self.share:.0%} of the "
                f"{self.available / MIB:.0f} MiB still available holds {self.fits} more")
