"""Reconcile on daemon start: adopt the sandboxes still running, settle sessions a dead daemon
left mid-transition, and remove every orphaned unit, netns, runsc state, bundle and socket dir
(docs/architecture.md §3 Lifecycle)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

from ironclawd.domain.reconcile import Action, HostFacts, decide
from ironclawd.domain.session import (
    Session,
    State,
    netns_name,
    sid_from_netns,
    sid_from_unit,
)
from ironclawd.errors import IronclawError
from ironclawd.services.sessions import SessionService, describe

log = logging.getLogger("ironclawd.reconcile")


@dataclass
class ReconcileReport:
    adopted: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # "unit ironclaw-sbx-x.service", ...

    def summary(self) -> str:
        return (
            f"adopted {len(self.adopted)} session(s), settled {len(self.settled)}, "
            f"removed {len(self.removed)} orphan(s)"
        )


async def reconcile(service: SessionService) -> ReconcileReport:
    """Settle every persisted session from what the host shows (``decide``); a session that
    cannot be settled is marked failed and logged, never an error for the daemon's start."""
    report = ReconcileReport()
    host = service.lifecycle
    units = {
        u.name: u for u in await asyncio.to_thread(host.units.list_units, "ironclaw-sbx-*.service")
    }
    netns = set(await asyncio.to_thread(host.netns.list_names, "ironclaw-"))
    containers = set(await asyncio.to_thread(host.runtime.list_ids))
    adopt = []
    for session in service.list_sessions():
        unit = units.get(session.unit)
        facts = HostFacts(
            unit_state=unit.active_state if unit is not None else "",
            netns=netns_name(session.sid) in netns,
            runsc=session.container_id in containers,
        )
        action, reason = decide(session.state, facts)
        if action is Action.KEEP:
            continue
        if action is Action.ADOPT:
            adopt.append(session)
            continue
        try:
            await settle(service, session, reason)
        except Exception as exc:  # one bad session must not keep the daemon from starting
            log.exception("reconcile: settling session %s", session.sid)
            await _last_resort(service, session, f"reconcile: settling it failed: {exc}")
        report.settled.append(session.sid)
    results = await asyncio.gather(*(_adopt(service, s) for s in adopt))
    kept = {s.sid for s in results if s.state is State.RUNNING}
    report.adopted = sorted(kept)
    report.settled += sorted(s.sid for s in results if s.state is not State.RUNNING)
    # Listed again: settling and failed adoptions have torn their units down already, and those
    # are not orphans (the report would count them as removed).
    left = await asyncio.to_thread(host.units.list_units, "ironclaw-sbx-*.service")
    await _remove_orphans(service, kept, [u.name for u in left], report)
    log.info("reconcile: %s", report.summary())
    return report


async def adopt(service: SessionService, session: Session) -> Session:
    """Take over a sandbox left running by an earlier daemon: listen on its control socket
    again and wait for the agent to reconnect; tear it down if it does not."""
    sid = session.sid
    async with service.lock(sid):
        try:
            hello = await service.lifecycle.reattach(sid)
        except (IronclawError, OSError, TimeoutError) as exc:
            reason = describe(exc, f"adopting session {sid}")
            log.warning("%s", reason)
            return await service.stop_locked(session, State.FAILED, error=reason)
        log.info("session %s adopted: agent pid %d", sid, hello.pid)
        service.audit_event(session, "adopted")
        service.watch(sid)
        return session


async def settle(service: SessionService, session: Session, reason: str) -> Session:
    """Clean up a session a dead daemon left mid-transition: a stop under way is finished
    (stopped), anything else ends failed with ``reason``."""
    async with service.lock(session.sid):
        if session.state is State.CREATING:
            session = service.move(session, State.FAILED, error=reason)
            await service.lifecycle.teardown(session)
            return session
        if session.state is State.STOPPING:
            return await service.stop_locked(session, State.STOPPED)
        return await service.stop_locked(session, State.FAILED, error=reason)


async def mark_failed(service: SessionService, sid: str, reason: str) -> Session:
    """The last resort for a session nothing else could settle: tear down what may exist and
    record it failed with ``reason``, whatever state it was in (errors are logged)."""
    session = service.stored(sid)
    await service.lifecycle.teardown(session)
    return service.force_failed(session, reason)


async def _adopt(service: SessionService, session: Session) -> Session:
    try:
        return await adopt(service, session)
    except Exception as exc:  # one bad session must not keep the daemon from starting
        log.exception("reconcile: adopting session %s", session.sid)
        return await _last_resort(service, session, f"reconcile: adopting it failed: {exc}")


async def _last_resort(service: SessionService, session: Session, reason: str) -> Session:
    try:
        return await mark_failed(service, session.sid, reason)
    except Exception:  # logged; the daemon starts and serves the others
        log.exception("reconcile: marking session %s failed", session.sid)
        return replace(session, state=State.FAILED)  # never adopted; its leftovers are orphans


async def _remove_orphans(
    service: SessionService, kept: set[str], units: Collection[str], report: ReconcileReport
) -> None:
    host = service.lifecycle

    async def attempt(what: str, fn: Callable[..., object], *args: object) -> None:
        try:
            await asyncio.to_thread(fn, *args)
            report.removed.append(what)
        except (IronclawError, OSError) as exc:
            log.warning("reconcile: removing %s: %s", what, exc)

    for name in units:
        sid = sid_from_unit(name)
        if sid is not None and sid not in kept:
            await attempt(f"unit {name}", host.units.stop, name, host.layout.stop_timeout)
            await attempt(f"failed state of {name}", host.units.reset_failed, name)
    for cid in await asyncio.to_thread(host.runtime.list_ids):
        if cid.startswith("ironclaw-") and cid.removeprefix("ironclaw-") not in kept:
            await attempt(f"runsc state {cid}", host.runtime.delete, cid)
    for name in await asyncio.to_thread(host.netns.list_names, "ironclaw-"):
        sid = sid_from_netns(name)
        if sid is not None and sid not in kept and name == netns_name(sid):
            await attempt(f"netns {name}", host.netns.delete, name)
    bundles = host.layout.bundles_dir
    for entry in await asyncio.to_thread(host.bundles.list_names, bundles):
        if entry not in kept:
            await attempt(f"bundle {entry}", host.bundles.remove, bundles / entry)
    for sid in host.control.list_dirs():
        if sid not in kept:
            try:
                await host.control.close(sid)
                report.removed.append(f"socket dir {sid}")
            except (IronclawError, OSError) as exc:
                log.warning("reconcile: removing socket dir %s: %s", sid, exc)
