"""How the reproduction summarises one figure over seeds: shared by every part's table."""
from __future__ import annotations

import statistics


def spread(values: list[float]) -> dict:
    """mean / min / max / n of some seeds' values ({"n": 0} when there are none)."""
    if not values:
        return {"n": 0}
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}
