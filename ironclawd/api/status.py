"""ironclawd's errors as gRPC status codes: the table is ``errors.GRPC_STATUS`` (docs/style.md §6);
this adapter turns its status names into ``grpc.StatusCode``."""

from __future__ import annotations

from math import ceil

import grpc

from ironclawd.errors import BudgetExceeded, IronclawError, grpc_status

# A call refused for now says in this trailer when the next would be taken: the agent waits that
# long and calls again (agent/metered.py) rather than telling its user to slow down.
RETRY_AFTER_KEY = "ironclaw-retry-after-ms"
# Every call the host answers on a sandbox socket carries this trailer. A call that fails without
# it never got an answer from the host (its connection ended: a daemon restart, or a connection
# closed while idle), and the agent makes it again on a new connection (agent/metered.py).
ANSWERED_KEY = "ironclaw-answered"
ANSWERED = ((ANSWERED_KEY, "1"),)


def code_for(exc: IronclawError) -> grpc.StatusCode:
    return grpc.StatusCode[grpc_status(exc)]


def millis(seconds: float) -> str:
    """A retry-after trailer's value: whole milliseconds, at least 1."""
    return f"{max(1, ceil(seconds * 1000))}"


def trailer_for(exc: IronclawError) -> tuple[tuple[str, str], ...]:
    """The trailer of a call ``exc`` ends: with the retry-after of a budget that will take a
    call again soon (an abort's trailer replaces the one set before, so ANSWERED goes too);
    otherwise none, which keeps the one set before."""
    if isinstance(exc, BudgetExceeded) and exc.retry_after is not None:
        return (*ANSWERED, (RETRY_AFTER_KEY, millis(exc.retry_after)))
    return ()
