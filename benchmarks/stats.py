"""The one summary every benchmark reports: median first (these machines are noisy)."""

from __future__ import annotations

import math
import statistics


def summary_ms(samples: list[float], digits: int = 2) -> dict[str, float]:
    """Median, p90, p99, minimum (milliseconds) and count of timings given in seconds."""
    ordered = sorted(samples)

    def rank(q: float) -> float:
        # Nearest rank: the smallest sample with at least q of them at or below it.
        return round(ordered[max(0, math.ceil(len(ordered) * q) - 1)] * 1e3, digits)

    return {
        "median_ms": round(statistics.median(ordered) * 1e3, digits),
        "p90_ms": rank(0.9),
        "p99_ms": rank(0.99),
        "min_ms": round(ordered[0] * 1e3, digits),
        "n": len(ordered),
    }
