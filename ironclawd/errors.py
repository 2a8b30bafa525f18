"""The one error tree of ironclawd, and the one table from its classes to gRPC status codes and
from those to ``ironctl`` exit codes (docs/style.md §6)::

    IronclawError                       INTERNAL
    ├── ConfigError                     FAILED_PRECONDITION
    ├── HostError                       INTERNAL
    │   ├── DiskFull                    RESOURCE_EXHAUSTED
    │   ├── Changing                    INTERNAL
    │   └── Crafted                     INTERNAL
    ├── SandboxError                    ABORTED
    ├── PolicyDenied                    PERMISSION_DENIED
    │   ├── BudgetExceeded              RESOURCE_EXHAUSTED
    │   │   └── RateLimited             RESOURCE_EXHAUSTED
    │   ├── ResponseRefused             PERMISSION_DENIED
    │   └── SignatureMismatch           PERMISSION_DENIED
    ├── Unauthenticated                 UNAUTHENTICATED
    │   └── SignatureError              UNAUTHENTICATED
    ├── NotFound                        NOT_FOUND
    ├── Conflict                        FAILED_PRECONDITION
    │   └── AlreadyExists               ALREADY_EXISTS
    ├── InvalidArgument                 INVALID_ARGUMENT
    │   ├── MalformedReport             INVALID_ARGUMENT
    │   └── MinisignFormatError         INVALID_ARGUMENT
    ├── UpstreamFailed                  UNAVAILABLE
    ├── ProviderError                   UNAVAILABLE
    ├── McpServerFailed                 UNAVAILABLE
    └── ChannelFailed                   UNAVAILABLE

Foreign exceptions are translated once, at the adapter that met them, with ``raise ... from exc``.
This module imports nothing, so every layer can use it: the pure formats (``ironclawd.formats``,
which import-linter keeps free of the daemon's layers) raise their errors from here, and ironctl
(which speaks only gRPC) reads the exit-code half of the table. gRPC codes are named by
``grpc.StatusCode`` member name; ``api/status.py`` turns the name into the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final


class IronclawError(Exception):
    """Base of every error ironclawd raises on purpose."""


class ConfigError(IronclawError):
    """The configuration is missing, malformed or names an unknown key or a bad value."""


class HostError(IronclawError):
    """A host effect (systemd, netns, mount, file, database) failed; the message names it."""


class DiskFull(HostError):
    """The state directory's filesystem is full or below ``daemon.min_free_bytes``: nothing
    was written; the message names the directory and the threshold. Retry when space is back."""


class Changing(HostError):
    """The agent was writing its outbound file while it was copied: take it again."""


class Crafted(HostError):
    """An agent's outbound file no SQLite writes: its rows hold more bytes than the file."""


class SandboxError(IronclawError):
    """A sandbox could not be built, started or stopped."""


class PolicyDenied(IronclawError):
    """The caller is not allowed to do this."""


class BudgetExceeded(PolicyDenied):
    """A rate limit, budget or cap is exhausted: try again later (gRPC RESOURCE_EXHAUSTED).
    ``retry_after``: seconds until a call would be taken again, where that is known and soon (a
    per-minute rate); a sandbox's agent waits that long and calls again (the retry-after
    trailer, api/status.py) rather than failing its user's turn."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(BudgetExceeded):
    """A submitter sent more change submissions per hour than ``gateway.submissions_per_hour``."""


class ResponseRefused(PolicyDenied):
    """The upstream answered, but the answer is not forwarded: it carries the injected
    credential, or comes in a content coding the broker cannot inspect (audited as failed)."""


class SignatureMismatch(PolicyDenied):
    """A well-formed minisign signature does not verify against the trusted public key."""


class Unauthenticated(IronclawError):
    """The caller's identity could not be established from the kernel."""


class SignatureError(Unauthenticated):
    """A signed webhook's ``X-Ironclaw-Signature`` does not authenticate its body
    (``formats/webhook_sig.py``); ``reason`` is one of "missing", "malformed", "stale",
    "mismatch" and the message says what was expected."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"signature {reason}: {detail}" if detail else reason)
        self.reason = reason


class NotFound(IronclawError):
    """The named thing does not exist."""


class Conflict(IronclawError):
    """The request conflicts with the current state (duplicate id, wrong state)."""


class AlreadyExists(Conflict):
    """Something with that name or id already exists."""


class InvalidArgument(IronclawError):
    """A request field is malformed; the message names the field and what was expected."""


class MalformedReport(InvalidArgument):
    """A containment report does not follow its format; the message names the field."""


class MinisignFormatError(InvalidArgument):
    """A minisign key or signature is malformed, or uses something ``formats/minisign.py``
    does not speak."""


class UpstreamFailed(IronclawError):
    """An egress upstream could not be reached or broke off (gRPC UNAVAILABLE). ``audit`` is
    what the audit log keeps when it says more than the message (the address connected to,
    which the agent is not told)."""

    def __init__(self, message: str, audit: str = "") -> None:
        super().__init__(message)
        self.audit = audit or message


class ProviderError(IronclawError):
    """The upstream model API failed; the message says how (secrets are redacted later)."""


class McpServerFailed(IronclawError):
    """An MCP server could not be started, crashed, is backing off, timed out or broke the
    protocol (gRPC UNAVAILABLE); the message names the server and what happened. ``run``: when
    the request was in flight on a running server that failed and was stopped, that run's number
    (each start of a server is a new run); 0 when it never reached one. ``bystander``: that
    failure is known to be another call's doing (services/mcp_calls.py)."""

    def __init__(self, message: str, *, run: int = 0, bystander: bool = False) -> None:
        super().__init__(message)
        self.run = run
        self.bystander = bystander


class ChannelFailed(IronclawError):
    """A channel (Matrix, webhook) could not take or deliver a message (gRPC UNAVAILABLE); the
    message names the channel and what happened. ``retryable`` is False when trying again
    cannot help (the homeserver refused the bot, the receiver answered 4xx)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


# Error class -> gRPC status. Every class has its own row (a subclass does not inherit its base's
# silently): tests/unit/test_error_tree.py fails for a class without one. Every rate limit,
# budget and full disk is RESOURCE_EXHAUSTED.
GRPC_STATUS: Final[Mapping[type[IronclawError], str]] = MappingProxyType({
    IronclawError: "INTERNAL",
    ConfigError: "FAILED_PRECONDITION",
    HostError: "INTERNAL",
    DiskFull: "RESOURCE_EXHAUSTED",
    Changing: "INTERNAL",
    Crafted: "INTERNAL",
    SandboxError: "ABORTED",
    PolicyDenied: "PERMISSION_DENIED",
    BudgetExceeded: "RESOURCE_EXHAUSTED",
    RateLimited: "RESOURCE_EXHAUSTED",
    ResponseRefused: "PERMISSION_DENIED",
    SignatureMismatch: "PERMISSION_DENIED",
    Unauthenticated: "UNAUTHENTICATED",
    SignatureError: "UNAUTHENTICATED",
    NotFound: "NOT_FOUND",
    Conflict: "FAILED_PRECONDITION",
    AlreadyExists: "ALREADY_EXISTS",
    InvalidArgument: "INVALID_ARGUMENT",
    MalformedReport: "INVALID_ARGUMENT",
    MinisignFormatError: "INVALID_ARGUMENT",
    UpstreamFailed: "UNAVAILABLE",
    ProviderError: "UNAVAILABLE",
    McpServerFailed: "UNAVAILABLE",
    ChannelFailed: "UNAVAILABLE",
})  # fmt: skip

# gRPC status -> ironctl exit code, for every status there is (the numbers are the ones
# ``ctl/exitcodes.py`` names and ``ironctl --help`` lists; a unit test keeps them in step).
EXIT_CODE: Final[Mapping[str, int]] = MappingProxyType({
    "OK": 0,
    "ABORTED": 1,  # FAILED
    "RESOURCE_EXHAUSTED": 1,  # FAILED: a rate limit, budget or the disk; retry later
    "UNAVAILABLE": 3,
    "PERMISSION_DENIED": 4,
    "UNAUTHENTICATED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,  # CONFLICT
    "FAILED_PRECONDITION": 6,  # CONFLICT
    "INVALID_ARGUMENT": 7,
    "OUT_OF_RANGE": 7,
    "DEADLINE_EXCEEDED": 8,
    "CANCELLED": 9,  # INTERNAL: ironctl never cancels a call itself
    "UNKNOWN": 9,
    "UNIMPLEMENTED": 9,
    "INTERNAL": 9,
    "DATA_LOSS": 9,
})  # fmt: skip


def grpc_status(exc: IronclawError) -> str:
    """The gRPC status name of ``exc``: its class's row, else its nearest listed base's."""
    for cls in type(exc).__mro__:
        if issubclass(cls, IronclawError) and cls in GRPC_STATUS:
            return GRPC_STATUS[cls]
    return "INTERNAL"  # not reached: IronclawError has a row
