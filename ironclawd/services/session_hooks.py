"""``SessionHooks``: what else happens when a session's sandbox comes, goes, dies or is removed.

Made first and handed to the ``SessionService`` and to everyone who subscribes (the sandbox API
serves a session's sockets while its sandbox runs; messaging resumes a session that died with
messages waiting; the broker and messaging forget a removed session). The service depends on
the hooks, never on its subscribers: that breaks the cycle between it and the sandbox API."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

SidHook = Callable[[str], Awaitable[None]]
SidCheck = Callable[[str], Awaitable[bool]]


class SessionHooks:
    """Subscribers per event, called in subscription order. Implements ``ports.SandboxSockets``
    (``open``/``close`` of a session's sandbox-facing sockets)."""

    def __init__(self) -> None:
        self._open: list[SidHook] = []
        self._close: list[SidHook] = []
        self._exit: list[SidHook] = []
        self._remove: list[Callable[[str], None]] = []
        self._removing: list[SidHook] = []
        self._gone: list[Callable[[str], None]] = []
        self._fences: list[tuple[SidCheck, Callable[[str], None]]] = []

    def on_sockets(self, open_: SidHook, close: SidHook) -> None:
        """Serve a session's sockets (``open_``) while its sandbox runs, until ``close``."""
        self._open.append(open_)
        self._close.append(close)

    def on_sandbox_exit(self, hook: SidHook) -> None:
        """Call ``hook(sid)`` after a running sandbox died on its own and the session was
        marked failed (not after a stop or remove asked for by the operator)."""
        self._exit.append(hook)

    def on_remove(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(sid)`` when a session is removed, before its data is destroyed."""
        self._remove.append(hook)

    def on_removing(self, hook: SidHook) -> None:
        """Await ``hook(sid)`` when a session is removed, after the ``on_remove`` hooks and
        before its data is destroyed: for work on the data already under way to end first."""
        self._removing.append(hook)

    def on_gone(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(sid)`` once a removed session's data and record are gone: from then on
        its id may name a new session."""
        self._gone.append(hook)

    def on_fence(self, fence: SidCheck, lift: Callable[[str], None]) -> None:
        """For a removal only if unused: ``fence(sid)`` says whether no message was ever
        queued to the session, letting none in from then on if so (else it lets them in
        again); ``lift(sid)`` lets them in again once the removal is over or failed."""
        self._fences.append((fence, lift))

    async def open(self, sid: str) -> None:
        for hook in self._open:
            await hook(sid)

    async def close(self, sid: str) -> None:
        for hook in self._close:
            await hook(sid)

    @property
    def exit_hooks(self) -> tuple[SidHook, ...]:
        return tuple(self._exit)

    async def removed(self, sid: str) -> None:
        for hook in self._remove:
            hook(sid)
        for removing in self._removing:
            await removing(sid)

    def gone(self, sid: str) -> None:
        for hook in self._gone:
            hook(sid)

    async def fence_unused(self, sid: str) -> bool:
        """Whether no subscriber ever queued a message to ``sid``; if so, each holds new
        ones back until ``lift``, else (or if one fails) none does."""
        unused = False
        try:
            for fence, _lift in self._fences:
                if not await fence(sid):
                    return False
            unused = True
            return True
        finally:
            if not unused:
                self.lift(sid)

    def lift(self, sid: str) -> None:
        for _fence, lift in self._fences:
            lift(sid)
