"""The records services keep (real: store/state.py, store/audit.py). A cluster-wide store may
later replace them: nothing here names SQL, a connection or a file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ironclawd.domain.messages import Reply
from ironclawd.domain.reply_bounds import ReplyUsage
from ironclawd.domain.session import Session

if TYPE_CHECKING:
    from ironclawd.domain.changes import Change


class SessionRecords(Protocol):
    """Persisted sessions, one record per session id."""

    def insert(self, session: Session) -> None:
        """Add a new session; Conflict if the id is taken."""
        ...

    def save(self, session: Session) -> None:
        """Replace an existing session's record; NotFound if there is none."""
        ...

    def get(self, sid: str) -> Session:
        """NotFound if there is none."""
        ...

    def list_sessions(self) -> list[Session]: ...
    def delete(self, sid: str) -> None: ...


class ReplyRecords(Protocol):
    """What the host ingested from each session's agent, hash-chained per session."""

    def add_replies(self, sid: str, replies: list[Reply], usage: ReplyUsage | None = None) -> None:
        """Store ``replies`` (the next seqs); with ``usage``, what the session's replies take
        with them, kept together (all or nothing)."""
        ...

    def reply_usage(self, sid: str) -> ReplyUsage:
        """What the session's replies take, as last stored with them (all zero if none)."""
        ...

    def last_reply(self, sid: str) -> tuple[int, bytes]:
        """(seq, chain) of the newest reply, (0, 32 zero bytes) when there is none."""
        ...

    def replies_after(self, sid: str, after: int, limit: int = 1000) -> list[Reply]: ...
    def set_pruned(self, sid: str, seq: int) -> None:
        """Record that the agent was told it may drop its rows up to ``seq`` (never lowered)."""
        ...

    def pruned(self, sid: str) -> int:
        """Up to which seq the agent may have dropped its rows (0: none)."""
        ...

    def add_sender(self, sid: str, sender: str) -> None:
        """Record a host user ("uid:N(name)") who sent the session messages (kept for its
        life, a restart included; four-eyes reads them)."""
        ...

    def senders(self, sid: str) -> frozenset[str]: ...


class SessionKeyRecords(Protocol):
    """Each session's data key, wrapped by the master key."""

    def put_wrapped_key(self, sid: str, wrapped: bytes) -> None:
        """Only for a new session: its pruned seq (ReplyRecords.pruned) starts again at 0."""
        ...

    def wrapped_key(self, sid: str) -> bytes | None: ...
    def destroy_session_data(self, sid: str) -> None:
        """Forget the session's key and its ingested replies."""
        ...


class AgentRecords(Protocol):
    """The agent registry: name -> the agent's spec as JSON."""

    def put_agent(self, name: str, spec_json: str, now: float) -> None: ...
    def agents(self) -> dict[str, str]: ...


class ChangeRecords(Protocol):
    """Gateway change requests."""

    def insert_change(self, change: Change) -> None: ...
    def save_change(self, change: Change) -> None: ...
    def get_change(self, change_id: str) -> Change:
        """NotFound if there is none."""
        ...

    def list_changes(self, state: str | None = None) -> list[Change]: ...
    def list_changes_page(
        self, state: str | None, after: str, limit: int, max_bytes: int
    ) -> tuple[list[Change], bool]:
        """A page of changes in ``list_changes``' order (created_at, then id): those after change
        ``after`` ("": from the first; NotFound if there is none) of ``state`` (None: any), at
        most ``limit``, ending before their payload, before and after together pass
        ``max_bytes`` of UTF-8 (one change at least); and whether more follow. Reads only the
        page: a change may take megabytes."""
        ...

    def count_changes_since(self, submitter: str, since: float) -> int: ...


class AuditHead(Protocol):
    """The newest audit record's (seq, mac), kept apart from the log to detect truncation."""

    def set_audit_head(self, seq: int, mac: str) -> None: ...
    def audit_head(self) -> tuple[int, str] | None: ...


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int
    first_bad: int = 0  # seq (1-based line number) of the first bad record
    problem: str = ""  # what is wrong; when ok, what was repaired after a crash or full disk
    repairs: int = 0  # audit.repaired records and torn writes found between whole records


class AuditLogFile(Protocol):
    """The MAC-chained audit log (real: store/audit.py)."""

    @property
    def append_only(self) -> bool: ...
    def continue_after(self, remembered: tuple[int, str]) -> bool:
        """True if the file ends before ``remembered`` (records were removed)."""
        ...

    def append(
        self, event: str, actor: str, *, sync: bool = True, **fields: Any
    ) -> dict[str, Any]: ...
    def sync(self) -> None: ...
    def verify(self, expected_head: tuple[int, str] | None = None) -> VerifyResult: ...
    def read(self, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...
