"""Recording fakes, one per port of ``ironclawd.ports``, for the unit tier. Each keeps what it
was asked (``calls``) and passes the same contract tests (tests/contract) as the real adapter."""

from tests.fakes.audit import MemoryAuditLog, RecordingAudit
from tests.fakes.clock import FakeClock
from tests.fakes.host import (
    FakeBundles,
    FakeControl,
    FakeCredentials,
    FakeMounts,
    FakeNetns,
    FakeRuntime,
    FakeSessionData,
    FakeUnits,
)
from tests.fakes.records import (
    MemoryAgents,
    MemoryAuditHead,
    MemoryChanges,
    MemoryReplies,
    MemorySessionKeys,
    MemorySessions,
    StaticSessions,
)
from tests.fakes.skills import FakeTrustedKeys

__all__ = [
    "FakeBundles",
    "FakeClock",
    "FakeControl",
    "FakeCredentials",
    "FakeMounts",
    "FakeNetns",
    "FakeRuntime",
    "FakeSessionData",
    "FakeTrustedKeys",
    "FakeUnits",
    "MemoryAgents",
    "MemoryAuditHead",
    "MemoryAuditLog",
    "MemoryChanges",
    "MemoryReplies",
    "MemorySessionKeys",
    "MemorySessions",
    "RecordingAudit",
    "StaticSessions",
]
