"""Outbound webhook delivery under the egress broker's rules (``ports.channels.WebhookSender``).

A reply URL comes from an approved wiring change, but where its name points is up to whoever
runs the DNS for it, and the reply's text comes from an agent we assume compromised: so the URL
is parsed by the broker's strict parser, the name is resolved once on the host, the delivery is
refused if *any* answer is an address the broker may not reach (loopback, link-local and the
metadata service always; private ranges unless ``[egress] internal_cidrs`` opens them), and the
connection goes only to the checked address (``net/http.py``: no second resolution, TLS checked
against the name). Redirects are not followed. Every decision is audited, never the body.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ironclawd import ratelog
from ironclawd.domain.egress import EgressLimits, parse_url
from ironclawd.errors import ChannelFailed, InvalidArgument, PolicyDenied, UpstreamFailed
from ironclawd.formats.webhook_sig import DELIVERY_HEADER, HEADER, sign
from ironclawd.ports import Clock, Resolver, Upstream, UpstreamRequest
from ironclawd.services.egress import resolve_checked

log = logging.getLogger("ironclawd.webhook")
USER_AGENT = "ironclawd-webhook/1"
MAX_DELIVERY_ID = 128


@dataclass(frozen=True)
class DeliveryDecision:
    """One audited outbound delivery attempt (``webhook.delivery`` records)."""

    channel: str
    delivery_id: str
    host: str
    port: int
    path: str
    verdict: str  # delivered | refused (the rules said no) | failed (the receiver or network)
    reason: str = ""
    address: str = ""
    status: int = 0
    bytes_out: int = 0
    duration_ms: float = 0.0


Recorder = Callable[[DeliveryDecision], None]


@dataclass
class _Attempt:
    """What is known of an attempt so far (for its audit record)."""

    host: str
    port: int = 0
    path: str = ""
    address: str = ""
    status: int = 0


class WebhookDelivery:
    def __init__(
        self,
        *,
        resolver: Resolver,
        upstream: Upstream,
        limits: EgressLimits,
        clock: Clock,
        record: Recorder,
    ) -> None:
        self._resolver = resolver
        self._upstream = upstream
        self._limits = limits
        self._clock = clock
        self._record = record

    async def post(
        self, *, channel: str, url: str, body: bytes, secret: bytes, delivery_id: str
    ) -> int:
        started = self._clock.monotonic()
        audit = _Attempt(host=url[:200])
        verdict, reason = "refused", ""
        try:
            status = await asyncio.wait_for(
                self._post(url, body, secret, delivery_id, audit), self._limits.timeout_seconds
            )
        except TimeoutError:
            verdict, reason = "failed", f"no answer within {self._limits.timeout_seconds:g} s"
            raise ChannelFailed(f"webhook {channel}: {audit.host}: {reason}") from None
        except (InvalidArgument, PolicyDenied) as exc:
            reason = str(exc)
            raise ChannelFailed(f"webhook {channel}: {reason}", retryable=False) from exc
        except UpstreamFailed as exc:
            verdict, reason = "failed", str(exc)
            raise ChannelFailed(f"webhook {channel}: {reason}") from exc
        except ChannelFailed as exc:
            verdict, reason = "failed", str(exc)
            raise ChannelFailed(f"webhook {channel}: {exc}", retryable=exc.retryable) from exc
        except BaseException as exc:
            verdict, reason = "failed", f"aborted: {type(exc).__name__}"
            raise
        else:
            verdict = "delivered"
            return status
        finally:
            self._audit(DeliveryDecision(
                channel=channel, delivery_id=delivery_id[:MAX_DELIVERY_ID],
                host=audit.host, port=audit.port, path=audit.path, verdict=verdict,
                reason=reason, address=audit.address, status=audit.status, bytes_out=len(body),
                duration_ms=(self._clock.monotonic() - started) * 1e3,
            ))  # fmt: skip

    async def _post(
        self, url: str, body: bytes, secret: bytes, delivery_id: str, audit: _Attempt
    ) -> int:
        if not (0 < len(delivery_id) <= MAX_DELIVERY_ID) or not all(
            "!" <= c <= "~" for c in delivery_id
        ):
            raise InvalidArgument("delivery id: expected 1-128 printable ASCII characters")
        target = parse_url(url)
        audit.host, audit.port, audit.path = target.host, target.port, target.path[:512]
        address = await resolve_checked(self._resolver, target, self._limits)
        audit.address = str(address)
        headers = (
            ("Host", target.authority),
            ("User-Agent", USER_AGENT),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Accept-Encoding", "identity"),
            ("Connection", "close"),
            (HEADER, sign(secret, int(self._clock.time()), body)),
            (DELIVERY_HEADER, delivery_id),
        )
        response = await self._upstream.send(UpstreamRequest(
            scheme=target.scheme, host=target.host, address=str(address), port=target.port,
            method="POST", target=target.request_target, headers=headers, body=body,
            connect_timeout=self._limits.connect_timeout_seconds,
        ))  # fmt: skip
        try:
            status = response.status
            audit.status = status
        finally:
            await response.close()  # the answer's body says nothing we act on
        if 200 <= status < 300:
            return status
        where = f"{target.host} answered {status} {response.reason[:80]}"
        if 300 <= status < 400:
            raise ChannelFailed(f"{where}: redirects are not followed (configure the final URL)",
                                retryable=False)  # fmt: skip
        if 400 <= status < 500 and status not in (408, 429):
            raise ChannelFailed(f"{where}: the receiver refused it", retryable=False)
        raise ChannelFailed(f"{where}: will retry")

    def _audit(self, decision: DeliveryDecision) -> None:
        level = logging.INFO if decision.verdict == "delivered" else logging.WARNING
        # Deliveries follow agents' replies, which a box decides: throttled per channel/verdict.
        ratelog.AGENT_LOG.log(
            log, level, decision.channel, f"webhook {decision.verdict}",
            "webhook %s: delivery %s to %s:%d%s -> %s: %s (%s) status %d, %d bytes, %.0f ms",
            decision.channel, decision.delivery_id, decision.host, decision.port, decision.path,
            decision.address or "-", decision.verdict, decision.reason or "ok", decision.status,
            decision.bytes_out, decision.duration_ms,
        )  # fmt: skip
        try:
            self._record(decision)
        except Exception as exc:  # the audit sink must not turn a decision into a crash
            log.error("webhook: recording a delivery decision failed: %s", exc)
