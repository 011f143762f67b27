"""How many CPU cores this process may run on (its affinity mask; the machine's count where there is none)."""
from __future__ import annotations

import os


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
