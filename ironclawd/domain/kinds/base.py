"""What a change kind is: one payload type and the rules for it (docs/architecture.md §7).

A kind parses its JSON payload into a frozen value (the only place a payload is a mapping),
dumps it back to the canonical JSON that is stored and hashed, applies it to an agent, shows the
agent fields it owns in the approver's view, and may ask the host or the submitter's standing
before anything is queued. The registry of kinds is ``ironclawd/domain/kinds/__init__.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from ironclawd.domain.agents import AgentMount, AgentSpec
from ironclawd.domain.packages import AgentPackage
from ironclawd.domain.tools import CATALOG
from ironclawd.errors import InvalidArgument

P = TypeVar("P")


class HostChecks(Protocol):
    """What a kind may ask of the host before a change is queued and again before it is applied
    (the gateway implements it; the domain does no I/O)."""

    def mount_source(self, source: str) -> None:
        """PolicyDenied unless ``source`` is a real directory below the operator's allowlist."""

    def mount_overlap(self, agent: str, mounts: tuple[AgentMount, ...]) -> None:
        """PolicyDenied if ``mounts`` given to ``agent`` would nest with another agent's
        grants where either could write above the other (``domain.agents.grant_overlap``)."""

    def skill_signature(self, name: str, manifest: bytes, signature: str) -> str:
        """The signer's key id if ``signature`` (minisign, prehashed) over the skill's
        ``manifest`` verifies under a key the operator trusts; else PolicyDenied (unknown key),
        SignatureMismatch (the files changed) or InvalidArgument (malformed)."""

    def resolve_packages(self, names: tuple[str, ...]) -> tuple[AgentPackage, ...]:
        """What installing ``names`` on the base image would unpack, dependencies included
        (apt against the host's archives), refused by policy (PolicyDenied: essential, a shell,
        an interpreter, naming the package that pulled it in) or InvalidArgument (unknown)."""

    def prepare_packages(self, packages: tuple[AgentPackage, ...]) -> None:
        """Build the image holding exactly ``packages`` (each ``.deb`` re-checked against its
        approved hash: SignatureMismatch if it changed); SandboxError if it cannot be built."""

    def channel_kind(self, name: str) -> str:
        """ "matrix" or "webhook": the type of configured channel ``name``; InvalidArgument
        naming the configured channels if there is none of that name."""

    def webhook_endpoint(self, channel: str, endpoint: str) -> None:
        """InvalidArgument unless webhook channel ``channel`` configures ``endpoint``."""

    def route_owner(self, channel: str, where: str) -> str | None:
        """The agent wired to room or endpoint ``where`` of ``channel`` now, if any."""

    def host_group(self, name: str) -> None:
        """InvalidArgument unless ``name`` is a group on this host."""


class ChangeKind(ABC, Generic[P]):
    """One kind of change. ``P`` is its payload: a frozen dataclass."""

    name: str
    # The change creates its target agent (which must not exist) instead of altering it.
    creates_agent: bool = False
    # Why this ironclawd refuses the kind outright ("" when it applies it).
    refusal: str = ""

    @abstractmethod
    def parse(self, payload: Mapping[str, Any]) -> P:
        """The payload checked and normalised, or InvalidArgument naming the field."""

    @abstractmethod
    def dump(self, payload: P) -> dict[str, Any]:
        """The canonical JSON form: what is stored, hashed and parsed again at apply time."""

    @abstractmethod
    def apply(self, spec: AgentSpec, payload: P) -> AgentSpec:
        """The agent after the change (for ``creates_agent``: applied to ``AgentSpec(name)``)."""

    def view(self, spec: AgentSpec) -> dict[str, Any]:
        """The agent fields this kind owns, as the approver sees them diffed. A field a new kind
        adds must be left out while it has its default: every pending change's ``before`` was
        recorded without it, and an approval checks the agent still looks like that."""
        return {}

    def authorize(self, payload: P, submitter: str) -> None:
        """Policy that depends on who asks (``uid:…`` or ``session:…``); PolicyDenied if not."""

    def host_check(self, payload: P, host: HostChecks) -> None:
        """Checks that need the host (run at submission and again at apply)."""

    def resolve(self, payload: P, host: HostChecks) -> P:
        """At submission only: the payload with what the host decides filled in (the packages
        apt resolved), so that the approver sees it and the hash covers it."""
        return payload

    def prepare(self, payload: P, host: HostChecks) -> None:
        """At apply only, before the agent changes: host work the new spec needs (the image of
        its packages). A failure leaves the agent as it was."""

    def host_check_for(self, agent: str, payload: P, host: HostChecks) -> None:
        """``host_check`` for a kind whose host checks need the target agent's name (whether a
        room is wired to another agent); by default just ``host_check``."""
        self.host_check(payload, host)


class RefusedKind(ChangeKind[None]):
    """A kind this ironclawd names and validates the envelope of, but cannot apply: refused with
    a clear reason rather than accepted and left to rot."""

    def __init__(self, name: str, why: str = "") -> None:
        self.name = name
        self.why = why
        self.refusal = (
            f"kind {name}: this ironclawd cannot apply {name} changes yet; nothing was queued"
            + (f" ({why})" if why else "")
        )

    def parse(self, payload: Mapping[str, Any]) -> None:
        raise InvalidArgument(self.refusal)

    def dump(self, payload: None) -> dict[str, Any]:
        raise InvalidArgument(self.refusal)

    def apply(self, spec: AgentSpec, payload: None) -> AgentSpec:
        raise InvalidArgument(self.refusal)


# -- shared field checks: the messages name the field and what was expected --------------------


def only(payload: Mapping[str, Any], kind: str, allowed: set[str]) -> None:
    extra = sorted(set(payload) - allowed)
    if extra:
        raise InvalidArgument(
            f"payload for {kind}: unexpected key(s) {', '.join(extra)} "
            f"(expected: {', '.join(sorted(allowed))})"
        )


def text(payload: Mapping[str, Any], key: str, limit: int) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidArgument(f"payload.{key}: expected non-empty text of at most {limit} chars")
    return value


def tool_list(payload: Mapping[str, Any]) -> tuple[str, ...]:
    tools = payload.get("tools")
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise InvalidArgument("payload.tools: expected a list of tool names")
    unknown = [t for t in tools if t not in CATALOG]
    if unknown:
        raise InvalidArgument(
            f"payload.tools: unknown tool(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(CATALOG))})"
        )
    return tuple(dict.fromkeys(tools))
