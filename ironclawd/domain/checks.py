"""Values reported by ``ironctl doctor``: pure data, no I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(enum.Enum):
    PASS = "pass"  # noqa: S105 - a check status, not a password
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class CheckResult:
    """One host check: what was found and, when it is not a pass, what to do about it."""

    name: str
    status: Status
    detail: str
    fix_hint: str = ""
    required: bool = True
    duration_seconds: float = 0.0


def passed(name: str, detail: str, *, required: bool = True) -> CheckResult:
    return CheckResult(name, Status.PASS, detail, required=required)


def failed(name: str, detail: str, fix_hint: str, *, required: bool = True) -> CheckResult:
    return CheckResult(name, Status.FAIL, detail, fix_hint, required=required)
