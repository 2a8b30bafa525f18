"""What the egress broker checks a host's answers for, and where those checks run
(docs/architecture.md §6).

The checks (domain/egress_secrets.py) are CPU-bound and keep the GIL for each decoder call, so
they run in a pool of threads of their own: not on the event loop (a 1 MiB request body held it
0.7 s), and not in the default pool, which name lookups, messaging and session start share and
which one session's checks once filled (found by a review). egress_secrets.MAX_ESCAPES bounds
each check to about half a second.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ironclawd.domain.egress import EgressRule
from ironclawd.domain.egress_secrets import SecretDetector, secret_variants
from ironclawd.errors import NotFound
from ironclawd.ports import Credentials

CHECK_THREADS = 2
CHECK_THREAD_NAME = "ironclawd-egress-check"
_T = TypeVar("_T")


class CheckThreads:
    """The broker's own threads for leak checks; its owner closes them at shutdown."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix=CHECK_THREAD_NAME)

    def close(self) -> None:
        """Checks not started are dropped; running ones end on their own (a thread cannot be
        stopped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, check: Callable[[], _T]) -> _T:
        """``check``'s result, computed in one of these threads. If the caller is cancelled
        meanwhile it still waits for the check before it ends, so the request keeps its
        connection slot: a session that cancelled each request as its check began had as many
        checks running as its rate allowed, not its connection cap (found by a review)."""
        job = self._pool.submit(check)
        done = asyncio.wrap_future(job)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            job.cancel()  # one not yet started never runs
            while not done.done():
                # Cancelled again (the call's backstop, shutdown): it is still only the rest
                # of one bounded check.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([done])
            raise


def host_secrets(
    credentials: Credentials, guarded: Sequence[EgressRule], rule: EgressRule
) -> dict[EgressRule, str]:
    """The credential of each rule of ``guarded`` (the credential rules on the request's host);
    NotFound only for ``rule``'s own, which cannot then be injected: another that is missing
    was never injected, so there is nothing of it to leak."""
    secrets = {}
    for other in guarded:
        try:
            secrets[other] = credentials.get(other.credential)
        except NotFound:
            if other == rule:
                raise
    return secrets


def host_detector(secrets: dict[EgressRule, str]) -> SecretDetector:
    """A detector for every form of each of ``secrets`` (empty: finds nothing, costs nothing)."""
    variants = [secret_variants(secret, rule.credential_format) for rule, secret in secrets.items()]
    return SecretDetector(v for forms in variants for v in forms)
