"""What this machine's CPU offers: its feature flags and its last-level cache.

Below every folder that asks (``d3d.kernels`` builds and picks C++ kernels by the flags,
``d3d.cpu`` picks dtypes and weights by the flags and the cache), so that none of them reaches
into another for it.
"""

from __future__ import annotations


def cpu_flags() -> set[str]:
    """The CPU feature flags the kernel reports (empty where /proc/cpuinfo is unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def llc_bytes() -> int:
    """The last-level cache of this CPU in bytes (32 MiB where sysfs does not say)."""
    for index in (3, 2):
        try:
            text = open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        return int(text.rstrip("KMG")) * unit
    return 32 << 20


__all__ = ["cpu_flags", "llc_bytes"]
