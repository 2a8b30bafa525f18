"""Batched attacks for ``probe --probe-attack CATEGORY``: what a compromised agent tries.

Each category module has ``ATTACKS``: attack id -> a function of the options (``--probe-opt
KEY=VALUE``) that attempts one thing. Its outcome says whether the attempt *succeeded* from the
attacker's side (``ok``), the errno if it failed, and a short detail; the red-team tests decide
what counts as contained, and check the host side. One ``runsc exec`` runs a whole category.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redteam_probe.probes import (
    exhaust,
    fs,
    kernel,
    net,
    packages,
    queues,
    secrets,
    skills,
    sockets,
)
from redteam_probe.probes.base import JSON, Attack, attempt

CATEGORIES: dict[str, dict[str, Attack]] = {
    "network": net.ATTACKS,
    "filesystem": fs.ATTACKS,
    "kernel": kernel.ATTACKS,
    "queues": queues.ATTACKS,
    "sockets": sockets.ATTACKS,
    "exhaustion": exhaust.ATTACKS,
    "secrets": secrets.ATTACKS,
    "skills": skills.ATTACKS,
    "packages": packages.ATTACKS,
}


def run(categories: Sequence[str], opts: Mapping[str, str]) -> dict[str, JSON]:
    """Every attack of each named category (or only ``opts["only"]``, comma-separated ids)."""
    only = {i for i in opts.get("only", "").split(",") if i}
    results: dict[str, JSON] = {}
    for category in categories:
        try:
            attacks = CATEGORIES[category]
        except KeyError:
            raise ValueError(
                f"--probe-attack {category!r}: expected one of {sorted(CATEGORIES)}"
            ) from None
        for attack_id, fn in attacks.items():
            if not only or attack_id in only:
                results[attack_id] = attempt(lambda fn=fn: fn(opts))  # type: ignore[misc]
    return results
