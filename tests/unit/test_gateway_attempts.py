"""A session's change submissions are metered before they are checked (stop 47's review): a
check may cost real work (resolving packages runs apt in a unit for seconds), and a refused
change is not stored, so counting stored changes alone let a box run the resolver without
end, and let concurrent submissions all pass one count. On the sandbox's gateway socket a
session has one submission checked at a time, in threads of the gateway's own."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ironclaw.gateway.v1 import gateway_pb2
from ironclawd.api.sandbox_gateway import GatewayServicer
from ironclawd.domain.packages import AgentPackage
from ironclawd.errors import InvalidArgument, RateLimited
from ironclawd.host.mounts import HostMounts
from ironclawd.services.gateway import Gateway, GatewayPolicy
from tests.fakes.packages import FakeDeb, FakePackageImages
from tests.unit.test_changes_domain import World


class CountingImages(FakePackageImages):
    """Stands for the apt helper unit: counts its runs; unknown names are refused."""

    runs = 0

    def resolve(self, names: Sequence[str]) -> tuple[AgentPackage, ...]:
        self.runs += 1
        return super().resolve(names)


def _world(tmp_path: Path, limit: int) -> tuple[World, CountingImages]:
    world = World()
    images = CountingImages(tmp_path / "images", archive={"jq": FakeDeb("1.6")})
    world.gateway = Gateway(
        store=world.store, registry=world.registry, audit=world.audit,
        policy=GatewayPolicy(submissions_per_hour=limit), restart_agent_sessions=world._restart,
        mounts=HostMounts(), clock=world.clock, packages=images,
    )  # fmt: skip
    return world, images


def _packages(*names: str) -> str:
    return json.dumps({"packages": list(names)})


def test_a_sessions_refused_submissions_count_and_the_resolver_stops_running(
    tmp_path: Path,
) -> None:
    world, images = _world(tmp_path, limit=3)
    for n in range(3):
        with pytest.raises(InvalidArgument):
            world.gateway.submit("packages", "demo", _packages(f"nope{n}"), "", "session:s1",
                                 only_agent="demo")  # fmt: skip
    for n in range(50):
        with pytest.raises(RateLimited, match="at most 3 change submissions per hour"):
            world.gateway.submit("packages", "demo", _packages(f"more{n}"), "", "session:s1",
                                 only_agent="demo")  # fmt: skip
    assert images.runs == 3  # before: 53
    # Another session is not held up, and the window slides.
    world.gateway.submit("packages", "demo", _packages("jq"), "", "session:s2", only_agent="demo")
    world.now += 3601
    world.gateway.submit("packages", "demo", _packages("jq"), "", "session:s1", only_agent="demo")


def test_concurrent_submissions_of_a_session_do_not_all_pass_one_count(tmp_path: Path) -> None:
    class Slow(CountingImages):
        def resolve(self, names: Sequence[str]) -> tuple[AgentPackage, ...]:
            threading.Event().wait(0.2)  # apt takes its time
            return super().resolve(names)

    world = World()
    archive = {f"p{n}": FakeDeb("1.0") for n in range(8)}
    world.gateway = Gateway(
        store=world.store, registry=world.registry, audit=world.audit,
        policy=GatewayPolicy(submissions_per_hour=1), restart_agent_sessions=world._restart,
        mounts=HostMounts(), clock=world.clock, packages=Slow(tmp_path / "i", archive=archive),
    )  # fmt: skip

    async def go() -> list[Any]:
        return await asyncio.gather(
            *(
                asyncio.to_thread(
                    world.gateway.submit,
                    "packages",
                    "demo",
                    _packages(f"p{n}"),
                    "",
                    "session:s1",
                    only_agent="demo",
                )
                for n in range(8)
            ),
            return_exceptions=True,
        )

    results = asyncio.run(go())
    assert sum(not isinstance(r, Exception) for r in results) == 1  # before: up to 6
    assert all(isinstance(r, RateLimited) for r in results if isinstance(r, Exception))


def test_an_operators_refused_submissions_do_not_count(tmp_path: Path) -> None:
    world, _ = _world(tmp_path, limit=1)
    for n in range(3):
        with pytest.raises(InvalidArgument):
            world.gateway.submit("packages", "demo", _packages(f"typo{n}"), "", "uid:0(root)")
    world.gateway.submit("packages", "demo", _packages("jq"), "", "uid:0(root)")


class _Session:
    agent = "demo"


class _Sessions:
    def get(self, sid: str) -> _Session:
        return _Session()


class _BlockingGateway:
    def __init__(self) -> None:
        self.entered, self.gate = threading.Event(), threading.Event()
        self.threads: list[str] = []

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.gate.wait(5)
        raise InvalidArgument("refused at last")


def test_a_session_has_one_submission_checked_at_a_time_in_the_gateways_threads() -> None:
    gateway = _BlockingGateway()
    servicer = GatewayServicer(gateway, _Sessions(), lambda: "s1")  # type: ignore[arg-type]
    request = gateway_pb2.SubmitChangeRequest(kind="packages", payload_json=_packages("x"))

    async def go() -> None:
        first = asyncio.ensure_future(servicer.SubmitChange(request, None))  # type: ignore[arg-type]
        assert await asyncio.to_thread(gateway.entered.wait, 5)
        with pytest.raises(RateLimited, match="one change submission at a time"):
            await servicer.SubmitChange(request, None)  # type: ignore[arg-type]
        first.cancel()  # the caller gives up; the check goes on, and so does the session's turn
        await asyncio.sleep(0.05)
        with pytest.raises(RateLimited, match="one change submission at a time"):
            await servicer.SubmitChange(request, None)  # type: ignore[arg-type]
        gateway.gate.set()
        await asyncio.sleep(0.1)
        gateway.entered.clear()
        gateway.gate.clear()
        second = asyncio.ensure_future(servicer.SubmitChange(request, None))  # type: ignore[arg-type]
        assert await asyncio.to_thread(gateway.entered.wait, 5)
        gateway.gate.set()
        with pytest.raises(InvalidArgument, match="refused at last"):
            await second

    asyncio.run(go())
    assert gateway.threads
    assert all(name.startswith("gateway-submit") for name in gateway.threads)
