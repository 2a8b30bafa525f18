"""``TrustedKeys`` over a dict (the real adapter reads ``*.pub`` files: host/skill_keys.py)."""

from __future__ import annotations

from collections.abc import Mapping


class FakeTrustedKeys:
    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self.keys = dict(keys or {})
        self.reads = 0

    def read(self) -> Mapping[str, str]:
        self.reads += 1
        return dict(self.keys)
