"""The gateway across a crash and a departed approver (issue 11): a change approved before the
daemon died is applied at start, never recorded failed because its own write already landed, and
"applied" is recorded only once the agent's sessions run the new spec."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import Change, ChangeState, transition
from ironclawd.errors import Conflict, HostError
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from ironclawd.services.registry import Registry
from tests.unit.test_changes_domain import DEMO, ROOT, World


def _crashed_after_approval(put: bool) -> tuple[World, Change]:
    """A world whose daemon died after ``change`` was recorded approved, and (``put``) after
    its new spec reached the registry too: a new gateway over the same store, as at start."""
    w = World()
    change = w.gateway.submit("persona", "demo", '{"persona": "New."}', "", ROOT)
    approved = transition(change, ChangeState.APPROVED, decided_by="uid:1000(alice)",
                          decided_at=w.now)  # fmt: skip
    w.store.save_change(approved)
    if put:
        w.registry.put(replace(DEMO, persona="New."))
    again = World()
    again.store = w.store
    again.agents = w.agents
    again.registry = Registry(w.agents, [DEMO], again.clock)
    again.gateway = Gateway(
        store=w.store,
        registry=again.registry,
        audit=again.audit,
        policy=GatewayPolicy(),
        restart_agent_sessions=again._restart,
        mounts=HostMounts(),
        clock=again.clock,
    )
    return again, change


@pytest.mark.parametrize("put", [False, True], ids=["before-the-registry", "after-the-registry"])
def test_a_change_approved_before_a_crash_is_applied_at_start_never_failed(put: bool) -> None:
    w, change = _crashed_after_approval(put)
    asyncio.run(w.gateway.resume())
    assert w.store.changes[change.id].state is ChangeState.APPLIED
    assert w.registry["demo"].persona == "New."
    assert w.restarted == ["demo"]  # the sessions run the new spec before it says "applied"
    assert w.audit.events() == ["change.applied"]
    assert w.audit.records[0][2]["approved_by"] == "uid:1000(alice)"


def test_an_approver_that_leaves_does_not_cut_the_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    w = World()
    change = w.gateway.submit("persona", "demo", '{"persona": "New."}', "", ROOT)
    restarting, release, applied = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_restart(agent: str) -> list[str]:
        restarting.set()
        await release.wait()
        return await w._restart(agent)

    w.gateway._restart = slow_restart
    save_change = w.store.save_change

    def save_and_signal(saved: Change) -> None:
        save_change(saved)
        if saved.state is ChangeState.APPLIED:
            applied.set()

    monkeypatch.setattr(w.store, "save_change", save_and_signal)

    async def leave_mid_apply() -> None:
        call = asyncio.create_task(w.gateway.approve(change.id, change.hash, ROOT))
        await restarting.wait()
        assert w.store.changes[change.id].state is ChangeState.APPROVED
        call.cancel()  # the client's deadline, mid-restart
        with pytest.raises(asyncio.CancelledError):
            await call
        release.set()
        await applied.wait()

    asyncio.run(asyncio.wait_for(leave_mid_apply(), 5))
    assert w.restarted == ["demo"]
    assert w.audit.events() == ["change.submitted", "change.approved", "change.applied"]


def test_a_change_that_cannot_be_applied_at_start_never_stops_the_start() -> None:
    """A host failure while resuming (a full disk, a unit that will not restart) leaves the
    change approved for the next start instead of failing the daemon's start-up (a restart
    loop)."""
    w, change = _crashed_after_approval(put=True)
    good_restart = w.gateway._restart

    async def failing_restart(agent: str) -> list[str]:
        raise HostError("restarting the agent's sessions: No space left on device")

    w.gateway._restart = failing_restart
    asyncio.run(w.gateway.resume())  # does not raise
    assert w.store.changes[change.id].state is ChangeState.APPROVED
    w.gateway._restart = good_restart
    asyncio.run(w.gateway.resume())
    assert w.store.changes[change.id].state is ChangeState.APPLIED


def test_a_change_approved_while_the_daemon_recovers_is_applied_once() -> None:
    """READY comes before resume(): an approval made meanwhile is still applying (its sessions
    restarting) when resume() lists the approved changes. It must not be applied again."""
    w = World()
    change = w.gateway.submit("persona", "demo", '{"persona": "New."}', "", ROOT)
    restarting, release = asyncio.Event(), asyncio.Event()

    async def slow_restart(agent: str) -> list[str]:
        restarting.set()
        await release.wait()
        return await w._restart(agent)

    w.gateway._restart = slow_restart

    async def approve_during_resume() -> None:
        approving = asyncio.create_task(w.gateway.approve(change.id, change.hash, ROOT))
        await restarting.wait()  # approved and in the registry, its sessions restarting
        resuming = asyncio.create_task(w.gateway.resume())
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(approving, resuming)

    asyncio.run(asyncio.wait_for(approve_during_resume(), 5))
    assert w.restarted == ["demo"]
    assert w.audit.events() == ["change.submitted", "change.approved", "change.applied"]
    assert w.store.changes[change.id].state is ChangeState.APPLIED


def test_an_approval_during_resume_cannot_undo_the_resumed_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A change approved before a crash (``first``) is resumed while an operator approves
    another (``second``) made against the same old spec. Only one may win the agent's check
    against its "before": the other is refused "changed since", never written over it."""
    w, first = _crashed_after_approval(put=False)
    second = w.gateway.submit("persona", "demo", '{"persona": "Second."}', "", ROOT)
    new_spec = w.gateway._new_spec
    checked, release = threading.Event(), threading.Event()

    def held_new_spec(change: Change) -> AgentSpec:
        after = new_spec(change)  # the check against "before" passed
        if change.id == first.id:
            checked.set()
            assert release.wait(5)
        return after

    monkeypatch.setattr(w.gateway, "_new_spec", held_new_spec)

    async def approve_during_resume() -> None:
        resuming = asyncio.create_task(w.gateway.resume())
        await asyncio.to_thread(checked.wait, 5)
        approving = asyncio.create_task(w.gateway.approve(second.id, second.hash, ROOT))
        await asyncio.wait({approving}, timeout=0.2)  # without the lock it is applied by now
        release.set()
        await resuming
        with pytest.raises(Conflict, match="changed since"):
            await approving

    asyncio.run(asyncio.wait_for(approve_during_resume(), 10))
    assert w.registry["demo"].persona == "New."
    assert w.store.changes[first.id].state is ChangeState.APPLIED
    assert w.store.changes[second.id].state is ChangeState.FAILED


def test_an_approval_before_resume_waits_for_it_and_nothing_in_effect_is_recorded_failed() -> None:
    """A change whose spec reached the registry before a crash, and another built on it
    approved between READY and resume(): resume found the first "changed since" and recorded
    it failed (and audited change.failed) while it was in effect (found by a review)."""
    w, first = _crashed_after_approval(put=True)
    w.gateway = replace_gateway(w, resume_pending=True)
    second = w.gateway.submit("tools", "demo", '{"tools": ["read_file"]}', "", ROOT)

    async def go() -> None:
        approving = asyncio.ensure_future(w.gateway.approve(second.id, second.hash, "uid:1(b)"))
        await asyncio.sleep(0.01)
        assert not approving.done()  # waits for resume()
        await w.gateway.resume()
        assert (await approving).state is ChangeState.APPLIED

    asyncio.run(go())
    assert w.store.changes[first.id].state is ChangeState.APPLIED
    assert w.registry["demo"].persona == "New."
    assert w.registry["demo"].tools == ("read_file",)
    assert "change.failed" not in w.audit.events()


def replace_gateway(w: World, *, resume_pending: bool) -> Gateway:
    return Gateway(
        store=w.store, registry=w.registry, audit=w.audit, policy=GatewayPolicy(),
        restart_agent_sessions=w._restart, mounts=HostMounts(), clock=w.clock,
        resume_pending=resume_pending,
    )  # fmt: skip


def test_no_change_is_approved_on_top_of_one_a_resume_could_not_apply() -> None:
    """Approvals wait for resume(), but it may not finish a change (its sessions' restart
    failed, or a stop cut it short): the change stays approved, and one approved on top of it
    made the next start record it failed while it was in effect (found by a review)."""
    w, first = _crashed_after_approval(put=True)
    w.gateway = replace_gateway(w, resume_pending=True)
    second = w.gateway.submit("tools", "demo", '{"tools": ["read_file"]}', "", ROOT)

    async def failing(agent: str) -> list[str]:
        raise HostError("restarting the agent's sessions: No space left on device")

    w.gateway._restart = failing

    async def go() -> None:
        approving = asyncio.ensure_future(w.gateway.approve(second.id, second.hash, "uid:1(b)"))
        await w.gateway.resume()
        with pytest.raises(Conflict, match=f"change {first.id} .* not applied yet"):
            await approving

    asyncio.run(go())
    assert w.store.changes[first.id].state is ChangeState.APPROVED
    assert w.store.changes[second.id].state is ChangeState.PENDING
    # The next start applies the first; then the second may be approved.
    w.gateway = replace_gateway(w, resume_pending=True)
    asyncio.run(w.gateway.resume())
    assert w.store.changes[first.id].state is ChangeState.APPLIED
    assert asyncio.run(w.gateway.approve(second.id, second.hash, "uid:1(b)")).state is (
        ChangeState.APPLIED
    )
