"""``ports.Clock`` driven by hand: both readings move only when the test says so."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1_000_000.0, monotonic: float = 100.0) -> None:
        self.now = now
        self.mono = monotonic

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward (the wall clock never jumps here)."""
        self.now += seconds
        self.mono += seconds
