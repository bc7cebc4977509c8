"""What every benchmark prints about the machine: its first line (the CPU, the kernel, Python,
the load average at the start) and its last (the share of CPU time the hypervisor took
while it ran). Figures from a busy or a contended machine are not comparable with an idle
one's; these two lines say which one it was."""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["Steal", "describe"]


def describe() -> str:
    model = platform.processor() or platform.machine()
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), model)
    except OSError:
        pass
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"machine: {model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, load average {load} at the start")


def _cpu_times() -> list[int] | None:
    """/proc/stat's `cpu` line: user nice system idle iowait irq softirq steal (in ticks)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if fields[:1] != ["cpu"] or len(fields) < 9:
        return None
    return [int(x) for x in fields[1:9]]


class Steal:
    """The hypervisor's share of this machine's CPU time since the object was made
    (/proc/stat's `steal`: time a virtual CPU wanted to run and the host ran something else)."""

    def __init__(self) -> None:
        self._start = _cpu_times()

    def __str__(self) -> str:
        end = _cpu_times()
        if self._start is None or end is None:
            return "hypervisor steal: unknown (no /proc/stat)"
        delta = [b - a for a, b in zip(self._start, end)]
        total = sum(delta)
        share = delta[7] / total if total else 0.0
        return f"hypervisor steal: {share:.1%} of the CPU time while the benchmark ran (/proc/stat)"
