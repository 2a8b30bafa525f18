"""The figures of benchmarks/platforms.py: bare sandboxes compared platform against platform,
and IronClaw on Debian 13's runsc, systrap against ptrace and each against the bare sandbox on
the same platform. A way named for IronClaw is never taken for a bare one."""

from __future__ import annotations

import pytest

from benchmarks import platforms
from benchmarks.platforms import _figures

OLD, NEW = "runsc 0.0~20221219.0", "runsc 0.0~20240729.0"


def _way(create: float, trip: float, stop: float) -> dict[str, list[float]]:
    return {"create": [create] * 3, "trip": [trip] * 3, "stop": [stop] * 3}


def _by_name(figures: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(f["figure"]) + " | " + str(f.get("baseline_name", "")): f for f in figures}


def test_ironclaw_is_compared_across_platforms_and_against_the_bare_sandbox() -> None:
    by_way = {  # IronClaw's ways first: they must not be taken for the bare ones
        f"ironclaw on {NEW} ptrace": _way(0.88, 0.0110, 0.058),
        f"ironclaw on {NEW} systrap": _way(0.90, 0.0100, 0.057),
        f"{OLD} ptrace": _way(0.70, 0.0060, 0.025),
        f"{NEW} ptrace": _way(0.71, 0.0075, 0.024),
        f"{NEW} systrap": _way(0.50, 0.0050, 0.025),
    }
    figures = _by_name(_figures(by_way, []))
    bare = figures[f"bare start to hello, {NEW} systrap | the same on {NEW} ptrace"]
    assert bare["value"]["median_ms"] == 500.0  # type: ignore[index]
    assert bare["baseline"]["median_ms"] == 710.0  # type: ignore[index]
    across = figures[f"IronClaw message round trip, {NEW} systrap | the same on {NEW} ptrace"]
    assert across["value"]["median_ms"] == 10.0  # type: ignore[index]
    assert across["baseline"]["median_ms"] == 11.0  # type: ignore[index]
    for platform, ours, base in (("systrap", 10.0, 5.0), ("ptrace", 11.0, 7.5)):
        key = f"IronClaw message round trip, {NEW} {platform} | a bare sandbox on {NEW} {platform}"
        assert figures[key]["value"]["median_ms"] == ours  # type: ignore[index]
        assert figures[key]["baseline"]["median_ms"] == base  # type: ignore[index]
    create = figures[f"IronClaw session create (gRPC), {NEW} systrap | the same on {NEW} ptrace"]
    assert create["value"]["median_ms"] == 900.0  # type: ignore[index]
    assert create["baseline"]["median_ms"] == 880.0  # type: ignore[index]


def test_without_systrap_every_figure_says_why() -> None:
    by_way = {f"{OLD} ptrace": _way(0.70, 0.0060, 0.025)}
    figures = _figures(by_way, ["no Debian 13 runsc .deb here"])
    missing = [f for f in figures if "value" not in f or f.get("value") is None]
    assert len(figures) == 6  # three bare parts, three IronClaw parts: none measured
    assert len(missing) == 6
    assert all("no Debian 13 runsc .deb here" in str(f) for f in figures)


def test_a_rounds_trip_is_the_median_of_its_warm_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platforms, "TRIPS", 10)
    # The first trip (cold, 1 s) is left out; the warm ones are 1..10 ms: median 5.5 ms.
    trips = [1.0] + [x / 1e3 for x in (4, 9, 1, 7, 10, 2, 6, 3, 8, 5)]
    stopped: list[bool] = []
    took = platforms._parts("w", lambda: None, lambda i: trips[i], lambda: stopped.append(True))
    assert took["w:trip"] == pytest.approx(0.0055)
    assert stopped == [True]
