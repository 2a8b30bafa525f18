"""What a reload of the configuration applies and what waits for a restart (``systemctl
reload ironclawd``; daemon.py applies it, services/doctor.py tells the operator which it
takes)."""

from __future__ import annotations

import dataclasses

from ironclawd.config import Config
from ironclawd.domain.reply_bounds import with_bounds

# The keys of [daemon] a reload applies, and the bounds of [queues] (reply_bounds.LIVE_KEYS);
# every other key, and every table but [pool], waits for a restart.
LIVE_DAEMON_KEYS = ("log_level", "agent_log_lines", "agent_log_window_seconds")


def restart_only(running: Config, new: Config) -> list[str]:
    """What differs between ``running`` and ``new`` that a reload does not apply: ``[table]``
    or ``daemon.key``, in the config's order. Every table of ``Config`` is compared, so a table
    added later is named too (a review found [queues], [mcp] and most of [daemon] changed by a
    reload without a word)."""
    new = dataclasses.replace(new, queues=with_bounds(new.queues, running.queues))
    waiting = [
        f"[{f.name}]"
        for f in dataclasses.fields(Config)
        if f.name not in ("daemon", "pool", "source")
        and getattr(new, f.name) != getattr(running, f.name)
    ]
    waiting[:0] = [
        f"daemon.{f.name}"
        for f in dataclasses.fields(running.daemon)
        if f.name not in LIVE_DAEMON_KEYS
        and getattr(new.daemon, f.name) != getattr(running.daemon, f.name)
    ]
    return waiting
