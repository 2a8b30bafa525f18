"""Reconcile on daemon start: adopt the sandboxes still running, settle sessions a dead daemon
left mid-transition, and remove every orphaned unit, netns, runsc state, bundle and socket dir
(docs/architecture.md §3 Lifecycle).

It runs after READY, while the admin API already serves (issue 17: READY waited for every agent
to reconnect). Before the API serves, ``claim`` takes the lock of every session left in a live
state (``Recovery``): a command on one of them waits until reconcile has settled it, listings
show it ``recovering`` meanwhile, and sessions created or started meanwhile are never taken for
orphans (each orphan is removed under its session's lock, only if no live session owns it).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

from ironclawd.domain.reconcile import Action, HostFacts, decide
from ironclawd.domain.session import (
    LIVE,
    Session,
    State,
    netns_name,
    sid_from_netns,
    sid_from_unit,
)
from ironclawd.errors import IronclawError, NotFound
from ironclawd.services.session_lifecycle import quietly_sync
from ironclawd.services.sessions import SessionService, describe

log = logging.getLogger("ironclawd.reconcile")


@dataclass
class ReconcileReport:
    adopted: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # "unit ironclaw-sbx-x.service", ...
    restarted: list[str] = field(default_factory=list)  # a cut restart left them stopped

    def summary(self) -> str:
        return (
            f"adopted {len(self.adopted)} session(s), settled {len(self.settled)}, "
            f"removed {len(self.removed)} orphan(s)"
        )


@dataclass
class Recovery:
    """The sessions a start still has to settle, each with its lock held until it is."""

    pending: set[str] = field(default_factory=set)  # shown as "recovering"
    claimed: frozenset[str] = frozenset()
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def release(self, sid: str) -> None:
        self.pending.discard(sid)
        lock = self._locks.pop(sid, None)
        if lock is not None:
            lock.release()

    def release_all(self) -> None:
        for sid in list(self._locks):
            self.release(sid)


async def claim(service: SessionService) -> Recovery:
    """Take the lock of every session persisted in a live state (before anything else can: at
    start nobody holds one, so no acquire waits)."""
    recovery = Recovery()
    for session in service.list_sessions():
        if session.state in LIVE:
            lock = service.lock(session.sid)
            await lock.acquire()
            recovery._locks[session.sid] = lock
            recovery.pending.add(session.sid)
    recovery.claimed = frozenset(recovery.pending)
    return recovery


async def reconcile(service: SessionService, recovery: Recovery | None = None) -> ReconcileReport:
    """Settle every session ``recovery`` claimed (``claim`` when None) from what the host shows
    (``decide``); a session that cannot be settled is marked failed and logged, never an error
    for the daemon's start. Each claimed lock is released as soon as its session is settled.
    Then each session an approved change's restart left stopped and marked is started (the
    change's resume finds it running the new spec): no mark outlives the start."""
    recovery = recovery if recovery is not None else await claim(service)
    try:
        report = await _reconcile(service, recovery)
    finally:
        recovery.release_all()
    report.restarted = await service.finish_restarts()
    if report.restarted:
        log.info("reconcile: started %d session(s) a cut restart left stopped: %s",
                 len(report.restarted), ", ".join(report.restarted))  # fmt: skip
    return report


async def _reconcile(service: SessionService, recovery: Recovery) -> ReconcileReport:
    report = ReconcileReport()
    host = service.lifecycle
    units = {
        u.name: u for u in await asyncio.to_thread(host.units.list_units, "ironclaw-sbx-*.service")
    }
    netns = set(await asyncio.to_thread(host.netns.list_names, "ironclaw-"))
    containers = set(await asyncio.to_thread(host.runtime.list_ids))
    adopt = []
    for sid in sorted(recovery.claimed):
        session = service.stored(sid)
        unit = units.get(session.unit)
        facts = HostFacts(
            unit_state=unit.active_state if unit is not None else "",
            netns=netns_name(session.sid) in netns,
            runsc=session.container_id in containers,
        )
        action, reason = decide(session.state, facts)
        if action is Action.KEEP:
            recovery.release(sid)
            continue
        if action is Action.ADOPT:
            adopt.append(session)
            continue
        try:
            await settle_locked(service, session, reason)
        except Exception as exc:  # one bad session must not keep the daemon from starting
            log.exception("reconcile: settling session %s", session.sid)
            await _last_resort(service, session, f"reconcile: settling it failed: {exc}")
        finally:
            recovery.release(sid)
        report.settled.append(session.sid)
    results = await asyncio.gather(*(_adopt(service, s, recovery) for s in adopt))
    kept = {s.sid for s in results if s.state is State.RUNNING}
    report.adopted = sorted(kept)
    report.settled += sorted(s.sid for s in results if s.state is not State.RUNNING)
    # Listed again: settling and failed adoptions have torn their units down already, and those
    # are not orphans (the report would count them as removed).
    left = await asyncio.to_thread(host.units.list_units, "ironclaw-sbx-*.service")
    await _remove_orphans(service, kept, recovery.claimed, [u.name for u in left], report)
    await _release_netns_names(service, kept)
    log.info("reconcile: %s", report.summary())
    return report


async def adopt(service: SessionService, session: Session) -> Session:
    """Take over a sandbox left running by an earlier daemon: listen on its control socket
    again and wait for the agent to reconnect; tear it down if it does not."""
    async with service.lock(session.sid):
        return await adopt_locked(service, session)


async def adopt_locked(service: SessionService, session: Session) -> Session:
    """``adopt``, the session's lock already held."""
    sid = session.sid
    try:
        hello = await service.lifecycle.reattach(session)
    except (IronclawError, OSError, TimeoutError) as exc:
        reason = describe(exc, f"adopting session {sid}")
        log.warning("%s", reason)
        return await service.stop_locked(session, State.FAILED, error=reason)
    log.info("session %s adopted: agent pid %d", sid, hello.pid)
    # Reattached: a full disk must not turn the record's failure into a teardown of a running
    # sandbox (its workspace with it); it is logged (found by a review).
    service.audit_quietly(session, "adopted")
    service.watch(sid)
    return session


async def settle(service: SessionService, session: Session, reason: str) -> Session:
    """Clean up a session a dead daemon left mid-transition: a stop under way is finished
    (stopped), as is an approved change's restart (stopped and still marked ``restarting``:
    ``reconcile`` then starts it), anything else ends failed with ``reason``."""
    async with service.lock(session.sid):
        return await settle_locked(service, session, reason)


async def settle_locked(service: SessionService, session: Session, reason: str) -> Session:
    """``settle``, the session's lock already held."""
    if session.state is State.CREATING:
        session = service.move(session, State.FAILED, error=reason)
        await service.lifecycle.teardown(session)
        return session
    if session.restarting:
        return await service.stop_locked(session, State.STOPPED, restarting=True)
    if session.state is State.STOPPING:
        return await service.stop_locked(session, State.STOPPED)
    return await service.stop_locked(session, State.FAILED, error=reason)


async def mark_failed(service: SessionService, sid: str, reason: str) -> Session:
    """The last resort for a session nothing else could settle: tear down what may exist and
    record it failed with ``reason``, whatever state it was in (errors are logged)."""
    session = service.stored(sid)
    await service.lifecycle.teardown(session)
    return service.force_failed(session, reason)


async def _adopt(service: SessionService, session: Session, recovery: Recovery) -> Session:
    try:
        return await adopt_locked(service, session)
    except Exception as exc:  # one bad session must not keep the daemon from starting
        log.exception("reconcile: adopting session %s", session.sid)
        return await _last_resort(service, session, f"reconcile: adopting it failed: {exc}")
    finally:
        recovery.release(session.sid)


async def _last_resort(service: SessionService, session: Session, reason: str) -> Session:
    try:
        return await mark_failed(service, session.sid, reason)
    except Exception:  # logged; the daemon starts and serves the others
        log.exception("reconcile: marking session %s failed", session.sid)
        return replace(session, state=State.FAILED)  # never adopted; its leftovers are orphans


async def _release_netns_names(service: SessionService, kept: Collection[str]) -> None:
    """Release the netns name of each adopted session that still has one (an earlier version
    of the daemon kept it while the session ran): its sandbox's process holds the namespace,
    and a name is one more mount every new unit copies. Not an orphan: the session owns it."""
    host = service.lifecycle
    names = set(await asyncio.to_thread(host.netns.list_names, "ironclaw-"))
    for sid in sorted(kept):
        name = netns_name(sid)
        if name in names:
            async with service.lock(sid):
                await quietly_sync("releasing the netns name", host.netns.delete, name)


Removal = tuple[str, Callable[..., object], tuple[object, ...]]  # (what, how, its arguments)


async def _remove_orphans(
    service: SessionService,
    kept: set[str],
    claimed: Collection[str],
    units: Collection[str],
    report: ReconcileReport,
) -> None:
    """Remove what no session owns, per session id under its lock: a session created or
    started since the API began serving is live and keeps what it has (one this reconcile
    claimed and did not keep is settled, whatever its record says)."""
    for sid, removals in (await _orphans(service, kept, units)).items():
        async with service.lock(sid):
            if sid not in claimed and _is_live(service, sid):
                continue
            for what, fn, args in removals:
                try:
                    if inspect.iscoroutinefunction(fn):
                        await fn(*args)
                    else:
                        await asyncio.to_thread(fn, *args)
                    report.removed.append(what)
                except (IronclawError, OSError) as exc:
                    log.warning("reconcile: removing %s: %s", what, exc)


async def _orphans(
    service: SessionService, kept: set[str], units: Collection[str]
) -> dict[str, list[Removal]]:
    """What the host holds for sessions not ``kept``, by session id, in teardown order."""
    host = service.lifecycle
    found: dict[str, list[Removal]] = {}

    def add(sid: str | None, what: str, fn: Callable[..., object], *args: object) -> None:
        if sid is not None and sid not in kept:
            found.setdefault(sid, []).append((what, fn, args))

    for name in units:
        sid = sid_from_unit(name)
        add(sid, f"unit {name}", host.units.stop, name, host.layout.stop_timeout)
        add(sid, f"failed state of {name}", host.units.reset_failed, name)
    for cid in await asyncio.to_thread(host.runtime.list_ids):
        if cid.startswith("ironclaw-"):
            add(cid.removeprefix("ironclaw-"), f"runsc state {cid}", host.runtime.delete, cid)
    for name in await asyncio.to_thread(host.netns.list_names, "ironclaw-"):
        sid = sid_from_netns(name)
        if sid is not None and name == netns_name(sid):
            add(sid, f"netns {name}", host.netns.delete, name)
    bundles = host.layout.bundles_dir
    for entry in await asyncio.to_thread(host.bundles.list_names, bundles):
        add(entry, f"bundle {entry}", host.bundles.remove, bundles / entry)
    for sid in host.control.list_dirs():
        add(sid, f"socket dir {sid}", host.control.close, sid)

    async def drop_queues(sid: str) -> None:
        # Only an id no session record names: a warm pool's sandbox an earlier run left
        # (services/pool.py); a stopped session's queues are its data.
        if not _has_record(service, sid):
            await asyncio.to_thread(host.data.destroy, sid)

    for sid in await asyncio.to_thread(host.data.list_sids):
        if not _has_record(service, sid):
            add(sid, f"queues of {sid}", drop_queues, sid)
    return found


def _has_record(service: SessionService, sid: str) -> bool:
    try:
        service.stored(sid)
    except NotFound:
        return False
    return True


def _is_live(service: SessionService, sid: str) -> bool:
    try:
        return service.stored(sid).state in LIVE
    except NotFound:
        return False
