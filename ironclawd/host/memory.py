"""The host's available memory, for the warm pool (services/pool.py)."""

from __future__ import annotations

MEMINFO = "/proc/meminfo"


def mem_available_bytes(path: str = MEMINFO) -> int:
    """``MemAvailable`` of proc(5) meminfo, in bytes: the kernel's estimate of what new work
    can get without swapping. OSError if it cannot be read."""
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{path}: no MemAvailable line")
