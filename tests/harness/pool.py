"""The warm pool (ironclawd/services/pool.py) in the integration and red-team tiers: the daemon
restarted with a ``[pool]`` table, and how many sandboxes it holds ready."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from tests.harness.polling import wait_for

CONFIG = "/etc/ironclaw/ironclawd.toml"
AGENT = "demo"


def pool_config(size: int = 1, agents: tuple[str, ...] = (AGENT,)) -> str:
    names = ", ".join(f'"{a}"' for a in agents)
    return f"\n[pool]\nsize = {size}\nagents = [{names}]\nmin_available_bytes = 0\n"


def _out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def pool_rows(sysd: Any) -> dict[str, int]:
    """agent -> ready sandboxes, from ``ironctl status --json``."""
    proc = sysd.run(["ironctl", "status", "--json"])
    assert proc.returncode == 0, _out(proc)
    rows = json.loads(proc.stdout).get("pool", [])
    return {str(row["agent"]): int(row.get("ready", 0)) for row in rows}


def pool_ready(sysd: Any, agent: str = AGENT) -> int:
    return pool_rows(sysd).get(agent, 0)


def wait_pool_ready(sysd: Any, agent: str = AGENT, count: int = 1, timeout: float = 180) -> int:
    """Wait until the pool holds at least ``count`` ready sandboxes of ``agent``."""
    return wait_for(
        f"{count} pooled sandbox(es) of {agent} ready",
        lambda: pool_ready(sysd, agent),
        lambda n: n >= count,
        timeout,
    )


@contextlib.contextmanager
def pooled_daemon(sysd: Any, config: str | None = None) -> Iterator[Any]:
    """The daemon restarted with ``config`` (default: a pool of one sandbox for the demo
    agent) added to its configuration; the configuration it had is put back (and the daemon
    restarted) afterwards."""
    previous = _out(sysd.run(["bash", "-c", f"cat {CONFIG} 2>/dev/null || true"]))
    added = config if config is not None else pool_config()
    script = f"cat >> {CONFIG} <<'EOF'\n{added}\nEOF\nsystemctl restart ironclawd"
    proc = sysd.run(["bash", "-c", script])
    assert proc.returncode == 0, _out(proc)
    try:
        yield sysd
    finally:
        restore = f"cat > {CONFIG} <<'EOF'\n{previous}EOF\n" if previous else f"rm -f {CONFIG}\n"
        sysd.run(["bash", "-c", restore + "systemctl restart ironclawd"])
