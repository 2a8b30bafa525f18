"""The one table from ironclawd's error classes to gRPC status codes (docs/style.md §6)."""

from __future__ import annotations

import grpc

from ironclawd.domain.egress import UpstreamFailed
from ironclawd.domain.model import BudgetExceeded
from ironclawd.errors import (
    AlreadyExists,
    ConfigError,
    Conflict,
    DiskFull,
    HostError,
    InvalidArgument,
    IronclawError,
    NotFound,
    PolicyDenied,
    SandboxError,
    Unauthenticated,
)
from ironclawd.providers.base import ProviderError

_CODES: tuple[tuple[type[IronclawError], grpc.StatusCode], ...] = (
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (BudgetExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DiskFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ProviderError, grpc.StatusCode.UNAVAILABLE),
    (UpstreamFailed, grpc.StatusCode.UNAVAILABLE),
    (PolicyDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (ConfigError, grpc.StatusCode.FAILED_PRECONDITION),
    (SandboxError, grpc.StatusCode.ABORTED),
    (HostError, grpc.StatusCode.INTERNAL),
)


def code_for(exc: IronclawError) -> grpc.StatusCode:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL
