"""The one error tree of ironclawd.

Foreign exceptions are translated once, at the adapter that met them, with ``raise ... from exc``.
``api/status.py`` maps these classes to gRPC status codes; ``ctl`` maps gRPC codes to exit codes.
"""

from __future__ import annotations


class IronclawError(Exception):
    """Base of every error ironclawd raises on purpose."""


class ConfigError(IronclawError):
    """The configuration is missing, malformed or names an unknown key or a bad value."""


class HostError(IronclawError):
    """A host effect (systemd, netns, mount, file) failed."""


class DiskFull(HostError):
    """The state directory's filesystem is full or below ``daemon.min_free_bytes``: nothing
    was written; the message names the directory and the threshold. Retry when space is back."""


class SandboxError(IronclawError):
    """A sandbox could not be built, started or stopped."""


class PolicyDenied(IronclawError):
    """The caller is not allowed to do this."""


class Unauthenticated(IronclawError):
    """The caller's identity could not be established from the kernel."""


class NotFound(IronclawError):
    """The named thing does not exist."""


class Conflict(IronclawError):
    """The request conflicts with the current state (duplicate id, wrong state)."""


class AlreadyExists(Conflict):
    """Something with that name or id already exists."""


class InvalidArgument(IronclawError):
    """A request field is malformed; the message names the field and what was expected."""


class ProviderError(IronclawError):
    """The upstream model API failed; the message says how (secrets are redacted later)."""
