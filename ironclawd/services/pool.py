"""The warm pool (issue 17): pre-started sandboxes a new session claims.

A pooled sandbox is made under the session id it will have (so its unit, netns, bundle and mount
sources are the ones a session of that id gets), but holds nothing of a session: its queue
directories are empty, its key file is empty, its socket directory serves only ``claim.sock``
and the state DB has no record or key for it. Its agent waits on that socket, in a blocked read.
A claim (``claim``) hands it to exactly one session, which then seals it
(``SandboxLifecycle.seal``: key, queues, sockets, then the line on ``claim.sock`` that wakes the
agent, then its hello); it is never returned to the pool, and a claim that fails tears it
down. The pool refills one sandbox at a time in the background, and gives sandboxes back while
memory is short (``domain/pool.py`` decides; this module acts).

A refill waits while a claim is the latency someone waits on: while it is sealed, and then until
the claimed session's first reply (``answered``) or ``engage_hold`` seconds, whichever comes
first. Starting a sandbox takes about a core for a second; on 2 cores, a refill begun at once
tripled the first reply of the session that had just claimed (issue 17)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.pool import PoolConfig, next_step
from ironclawd.domain.session import Session, State, new_sid
from ironclawd.errors import IronclawError, NotFound
from ironclawd.ports import Clock, SessionRecords
from ironclawd.services.session_lifecycle import SandboxLifecycle, quietly_sync
from ironclawd.services.session_watch import OwnedTasks

log = logging.getLogger("ironclawd.pool")

REFILL_CHECK_SECONDS = 2.0  # memory is looked at this often when nothing else wakes the pool
MAX_BACKOFF_SECONDS = 60.0  # after failed starts, the longest wait before the next try
# The longest a refill waits for a claimed session's first reply (a real model may take longer:
# the refill then goes ahead, and a person typing their first message finds it done).
ENGAGE_HOLD_SECONDS = 2.0


@dataclass(frozen=True)
class Pooled:
    """A ready sandbox: the session value it was started for (never stored) and the agent spec
    it was built from (a claim refuses it if the agent changed since)."""

    session: Session
    spec: AgentSpec

    @property
    def sid(self) -> str:
        return self.session.sid


class WarmPool:
    def __init__(
        self,
        *,
        lifecycle: SandboxLifecycle,
        agents: Mapping[str, AgentSpec],
        records: SessionRecords,
        config: PoolConfig,
        available_bytes: Callable[[], int],
        clock: Clock,
        engage_hold: float = ENGAGE_HOLD_SECONDS,
    ) -> None:
        self._lifecycle = lifecycle
        self._agents = agents
        self._records = records
        self._config = config
        self._available = available_bytes
        self._clock = clock
        self._engage_hold = engage_hold
        self._ready: dict[str, list[Pooled]] = {}
        self._starting: dict[str, int] = {}
        self._doomed: list[Pooled] = []  # taken out of the pool, to be destroyed by the loop
        self._held: set[str] = set()  # ids of sandboxes starting, ready or claimed not yet sealed
        self._sealing: set[str] = set()  # claimed, their session not yet running (or failed)
        self._engaging: dict[str, float] = {}  # claimed and running, no reply yet: until when
        self._wake = asyncio.Event()
        self._closing = False
        self._failures = 0
        self._loop = OwnedTasks()
        lifecycle.control.on_claim_lost(self._lost)

    # -- what sessions use --------------------------------------------------------------------

    def claim(self, spec: AgentSpec) -> Session | None:
        """Take a ready sandbox of ``spec``'s agent out of the pool, for good; None if there is
        none. Synchronous, so two creates on the event loop never get the same one."""
        entries = self._ready.get(spec.name, [])
        while entries:
            entry = entries.pop(0)
            self._wake.set()  # refill (once the claim is done)
            if entry.spec == spec:
                self._sealing.add(entry.sid)
                return entry.session
            self._doomed.append(entry)  # the agent changed since it was started
        return None

    def _lost(self, sid: str) -> None:
        """A ready sandbox's waiting agent is gone (its claim.sock connection ended): take it
        out of the pool and have the loop destroy it and start another, instead of a claim
        finding it dead (and a person waiting for a cold start) and its leftovers staying."""
        for agent, entries in self._ready.items():
            for entry in entries:
                if entry.sid == sid:
                    entries.remove(entry)
                    self._doomed.append(entry)
                    log.warning("pool: sandbox %s of agent %s ended while it waited for a "
                                "claim; replacing it", sid, agent)  # fmt: skip
                    self._wake.set()
                    return

    def holds(self, sid: str) -> bool:
        """Whether ``sid`` belongs to a pooled sandbox (an explicit ``--sid`` may not take it)."""
        return sid in self._held

    def done(self, sid: str, *, running: bool = False) -> None:
        """The claim of ``sid`` is over (its session runs, or failed and was torn down): the
        session owns the id from now on. The pool refills once ``running`` sessions have
        answered (``answered``) or waited ``engage_hold`` seconds, failed ones at once."""
        self._held.discard(sid)
        self._sealing.discard(sid)
        if running and self._engage_hold > 0:
            self._engaging[sid] = self._clock.monotonic() + self._engage_hold
        self._wake.set()

    def answered(self, sid: str) -> None:
        """A reply of ``sid`` was taken in: if it had just claimed, the refill may go ahead."""
        if self._engaging.pop(sid, None) is not None:
            self._wake.set()

    def _engage_left(self) -> float:
        """Seconds until every claimed session has answered or waited long enough (0: none)."""
        now = self._clock.monotonic()
        for sid in [sid for sid, until in self._engaging.items() if until <= now]:
            del self._engaging[sid]
        return max(self._engaging.values(), default=now) - now

    def status(self) -> list[tuple[str, int]]:
        """(agent, ready sandboxes) for every pooled agent and every agent still holding some."""
        pooled = self._config.agents if self._config.size else ()
        holding = sorted(agent for agent, entries in self._ready.items() if entries)
        return [(name, len(self._ready.get(name, []))) for name in dict.fromkeys(
            [*pooled, *holding])]  # fmt: skip

    # -- its life ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start refilling in the background (after reconcile removed what an earlier run left)."""
        if not len(self._loop):
            self._closing = False
            self._loop.spawn(self._run())
        self._name_unknown()

    def configure(self, config: PoolConfig) -> None:
        """A reloaded ``[pool]``: the loop fills or drops towards it."""
        self._config = config
        self._wake.set()
        self._name_unknown()

    def _name_unknown(self) -> None:
        """Say which agents of ``[pool] agents`` the registry does not hold: a misspelt name
        gave no pool and no word (found by a review). Not refused: an approved create_agent
        change may bring the agent later, and the pool then fills for it."""
        unknown = [a for a in self._config.agents if a not in self._agents]
        if self._config.size > 0 and unknown:
            log.warning(
                "pool: no agent named %s in the registry (yet): nothing is pooled for it until "
                "one is created (ironctl agent list)", ", ".join(unknown),
            )  # fmt: skip

    async def close(self, grace: float = 30.0) -> None:
        """Stop refilling and destroy every sandbox the pool holds (none is left for a later
        run: it would not know them)."""
        self._closing = True
        self._wake.set()
        await self._loop.settle(grace)
        await self._loop.close()
        for entries in self._ready.values():
            self._doomed.extend(entries)
            entries.clear()
        await self._destroy_doomed()

    async def _run(self) -> None:
        failures = 0
        while not self._closing:
            try:
                await self._step()
            except Exception as exc:  # the pool must outlive any one failure
                # Nothing starts this loop again (``start`` runs once, ``configure`` only wakes
                # it) and OwnedTasks leaves a task's failure to the task: one state DB read
                # error in ``_fresh_sid`` ended the refills until a restart (found by a review).
                failures += 1
                wait = min(MAX_BACKOFF_SECONDS, 2.0 ** min(failures - 1, 30))
                log.error("pool: refilling: %s (next try in %gs)", exc, wait,
                          exc_info=not isinstance(exc, IronclawError))  # fmt: skip
                await self._sleep(wait)
            else:
                failures = 0

    async def _step(self) -> None:
        """One turn of the refill loop: wait, or destroy what is doomed and fill or drop one."""
        if self._sealing:
            # A claim is the latency a person waits on: starting or destroying a sandbox
            # meanwhile would take the cores from it (2 cores here: +50% on a claim).
            await self._sleep(REFILL_CHECK_SECONDS)
            return
        engaging = self._engage_left()
        if engaging > 0:
            await self._sleep(engaging)
            return
        await self._destroy_doomed()
        step = next_step(
            self._config,
            self._agents,
            {agent: len(entries) for agent, entries in self._ready.items()},
            self._starting,
            self._available_bytes(),
        )
        if step.action == "fill":
            await self._fill(step.agent)
        elif step.action == "drop":
            self._doomed.append(self._ready[step.agent].pop(0))
        else:
            await self._sleep(REFILL_CHECK_SECONDS)

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    def _available_bytes(self) -> int:
        try:
            return self._available()
        except OSError as exc:  # unknown: treated as short, the pool does not grow blind
            log.warning("pool: reading available memory: %s", exc)
            return 0

    async def _fill(self, agent: str) -> None:
        spec = self._agents[agent]
        sid = self._fresh_sid()
        now = self._clock.time()
        session = Session(sid, agent, State.STARTING, now, now, now)
        self._held.add(sid)
        self._starting[agent] = self._starting.get(agent, 0) + 1
        try:
            await self._lifecycle.bring_up_pooled(session, spec)
        except (IronclawError, OSError, TimeoutError) as exc:
            self._held.discard(sid)
            self._failures += 1
            wait = min(MAX_BACKOFF_SECONDS, 2.0 ** min(self._failures, 30))
            log.warning("pool: starting a sandbox of agent %s: %s (next try in %gs)",
                        agent, exc, wait)  # fmt: skip
            await self._sleep(wait)
            return
        finally:
            self._starting[agent] -= 1
        self._failures = 0
        self._ready.setdefault(agent, []).append(Pooled(session, spec))
        log.info("pool: sandbox %s of agent %s ready", sid, agent)

    def _fresh_sid(self) -> str:
        while True:
            sid = new_sid()
            if sid in self._held:
                continue
            try:
                self._records.get(sid)
            except NotFound:
                return sid

    async def _destroy_doomed(self) -> None:
        while self._doomed:
            entry = self._doomed.pop(0)
            log.info("pool: stopping sandbox %s", entry.sid)
            await self._lifecycle.teardown(entry.session)
            await quietly_sync("removing queues", self._lifecycle.data.destroy, entry.sid)
            self._held.discard(entry.sid)
