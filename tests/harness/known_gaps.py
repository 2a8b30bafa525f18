"""A documented gap, raised by the one assertion a strict xfail is about.

``@pytest.mark.xfail(raises=KnownGap, strict=True)`` expects exactly this: the test's controls
(the target is there, the probe ran, the attempt was judged) stay ordinary assertions, so a
failed control fails the test instead of passing as the expected failure; and once the gap is
closed, the test passes and strict xfail turns that into a failure that asks for the marker's
removal.
"""

from __future__ import annotations


class KnownGap(AssertionError):
    """The documented gap is still there (the test's controls held)."""
