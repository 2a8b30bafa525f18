"""The MCP gateway (docs/mcp.md, "In the sandbox"): a session's MCP tool calls, each checked
again before it runs, whatever was true a call earlier.

Per call: the agent comes from the session the socket belongs to; its *current* grants are read
(its own and its skills', so a revoked grant stops the next call); the server must be registered
for it; the tool must be granted; the arguments must be a JSON object within a size cap; the
server's *live* definition of the tool must hash to the pin a human approved (a server that
changed a granted tool's description or schema is refused until a human approves the new one);
the call runs with a time-out; the result is size-capped, host secrets are masked in it (and a
result carrying one in an encoded form is withheld), and it goes back as data, never read here.
Before all that, the session's own bounds (services/mcp_budget.py): its calls a minute, and the
stops of its agent's servers counted against it (services/mcp_calls.py). Every call is audited
with its sizes, never its content; refusals at a bounded rate.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ironclawd import ratelog
from ironclawd.domain.agents import AgentSpec, effective_mcp_grants, find_agent
from ironclawd.domain.egress_secrets import SecretDetector
from ironclawd.domain.mcp import McpLimits, McpServer, split_model_tool_name
from ironclawd.domain.mcp_grants import PinnedTool, find_server, grants_for, pinned_tools
from ironclawd.domain.model import Redactor
from ironclawd.errors import (
    InvalidArgument,
    IronclawError,
    McpServerFailed,
    NotFound,
    PolicyDenied,
    ResponseRefused,
)
from ironclawd.ports import AuditSink, Clock, Credentials, SessionLookup
from ironclawd.ports.mcp import McpCallResult, McpClients
from ironclawd.services.audit import Throttled
from ironclawd.services.mcp_budget import McpBudget
from ironclawd.services.own_secrets import own_secrets

log = logging.getLogger("ironclawd.mcp")

MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class McpGatewayLimits:
    """Caps of the gateway itself (the adapter has its own time-outs and output cap)."""

    call_timeout_seconds: float = 120.0  # list + call, the whole check-and-call
    max_argument_bytes: int = 64 * 1024
    # What the model gets back; well under the model proxy's per-message cap (MAX_TEXT).
    max_result_chars: int = 64 * 1024


@dataclass(frozen=True)
class McpResult:
    """A checked result: the text the session may see."""

    text: str
    is_error: bool
    truncated: bool


class McpGateway:
    def __init__(
        self,
        *,
        sessions: SessionLookup,
        agents: Mapping[str, AgentSpec],
        clients: McpClients,
        credentials: Credentials,
        audit: AuditSink,
        clock: Clock,
        limits: McpGatewayLimits = McpGatewayLimits(),
        session_limits: McpLimits = McpLimits(),  # noqa: B008 (frozen)
    ) -> None:
        self._sessions = sessions
        self._agents = agents
        self._clients = clients
        self._credentials = credentials
        self._audit = audit
        self._refusals = Throttled(audit, clock)
        self._budget = McpBudget(session_limits, clock)
        self._clock = clock
        self._limits = limits
        # Model names each session was ever granted: a call to one no longer granted is told
        # that its grant was revoked, not that it never had one.
        self._granted: dict[str, set[str]] = {}

    def _agent(self, sid: str) -> AgentSpec:
        return find_agent(self._agents, self._sessions.get(sid).agent)

    def _remember(self, sid: str, spec: AgentSpec) -> None:
        names = self._granted.setdefault(sid, set())
        names.update(g.model_name for g in effective_mcp_grants(spec))

    def has_grants(self, sid: str) -> bool:
        """Whether this session's agent has any MCP tool granted (else it gets no mcp.sock)."""
        try:
            spec = self._agent(sid)
        except IronclawError:
            return False
        self._remember(sid, spec)
        return bool(effective_mcp_grants(spec))

    def forget(self, sid: str) -> None:
        self._granted.pop(sid, None)
        self._budget.forget(sid)
        # A new session given the id must not inherit a spent refusal window (found by a review).
        # Refusals left out since its last record are counted in one last record.
        if left := self._refusals.forget(sid):
            try:
                self._audit.record_soon("mcp.call", f"session:{sid}", outcome="unrecorded",
                                        unrecorded_before=left)  # fmt: skip
            except Exception as exc:  # the audit sink must not fail a session's removal
                log.error("mcp: recording what was left out failed: %s", exc)

    def tools(self, sid: str) -> tuple[PinnedTool, ...]:
        """The tools granted to the session's agent now, with their pinned definitions."""
        spec = self._agent(sid)
        self._remember(sid, spec)
        return pinned_tools(spec)

    async def call(self, sid: str, name: str, arguments_json: str) -> McpResult:
        """Check and run one call; a refusal or failure raises (the message says which)."""
        call = _Call(sid, name, len(arguments_json.encode("utf-8", "surrogatepass")))
        started = self._clock.monotonic()
        try:
            spec = self._agent(sid)
            call.agent = spec.name
            call.outcome = "over-rate"
            self._budget.count_call(sid)  # counted, unless refused here: a later refusal counts
            call.outcome = "over-stops"
            self._budget.check_stops(sid)
            call.outcome = "refused"
            server, tool = self._granted_tool(sid, spec, name, call)
            arguments = self._arguments(arguments_json, call)
            result = await self._run(spec, server, tool, arguments, call)
            checked = self._checked(spec, server.name, tool, result, call)
        except Exception as exc:
            if not isinstance(exc, IronclawError):  # else call.outcome names the refusal
                call.outcome = "internal-error"
            raise
        else:
            call.outcome = "tool-error" if checked.is_error else "ok"
            call.result_bytes = len(checked.text.encode("utf-8"))
            call.truncated = checked.truncated
            return checked
        finally:
            self._record(call, self._clock.monotonic() - started)

    # -- the checks, in order -------------------------------------------------------------------

    def _granted_tool(
        self, sid: str, spec: AgentSpec, name: str, call: _Call
    ) -> tuple[McpServer, str]:
        parsed = split_model_tool_name(name)
        if parsed is None:
            call.outcome = "bad-name"
            raise InvalidArgument(
                f"MCP tool {_show(name)}: not an MCP tool name (expected mcp__<server>__<tool>)"
            )
        server_name, tool = call.server, call.tool = parsed
        server = find_server(spec, server_name)
        if server is None:
            call.outcome = "unregistered-server"
            raise NotFound(
                f"MCP tool {_show(name)}: no MCP server {_show(server_name)} is registered for "
                f"agent {spec.name}"
            )
        if not grants_for(spec, server_name, tool):
            if name in self._granted.get(sid, set()):
                call.outcome = "revoked"
                raise PolicyDenied(
                    f"MCP tool {_show(name)}: its grant to agent {spec.name} was revoked"
                )
            call.outcome = "not-granted"
            raise PolicyDenied(
                f"MCP tool {_show(name)}: tool {_show(tool)} of server {server_name} is not "
                f"granted to agent {spec.name} (a human must grant it)"
            )
        self._remember(sid, spec)
        return server, tool

    def _arguments(self, text: str, call: _Call) -> dict[str, object]:
        call.outcome = "bad-arguments"
        cap = self._limits.max_argument_bytes
        if len(text.encode("utf-8", "surrogatepass")) > cap:
            raise InvalidArgument(f"arguments_json: larger than {cap} bytes")
        try:
            value = json.loads(text or "{}")
        except (ValueError, RecursionError):
            raise InvalidArgument("arguments_json: not valid JSON") from None
        if not isinstance(value, dict):
            raise InvalidArgument("arguments_json: expected a JSON object")
        return value

    async def _run(
        self, spec: AgentSpec, server: McpServer, tool: str, arguments: dict[str, object],
        call: _Call,
    ) -> McpCallResult:  # fmt: skip
        """The live definition checked against the pin, then the call, within the time-out."""
        limit = self._limits.call_timeout_seconds
        name = f"MCP tool {server.name}/{_show(tool)}"
        agent = spec.name
        calling = False  # the call itself is in flight (not the listing before it)
        try:
            async with asyncio.timeout(limit):
                call.outcome = "server-failed"
                live = await self._clients.list_tools(agent, server)
                definition = next((t for t in live if t.name == tool), None)
                if definition is None:
                    call.outcome = "tool-gone"
                    raise NotFound(f"{name}: the server no longer offers it")
                # The spec is read again: a grant revoked or re-pinned while the list ran counts.
                pins = {g.digest for g in grants_for(find_agent(self._agents, agent),
                                                     server.name, tool)}  # fmt: skip
                if not pins:
                    call.outcome = "revoked"
                    raise PolicyDenied(f"{name}: its grant to agent {agent} was revoked")
                if definition.digest not in pins:
                    call.outcome = "definition-changed"
                    raise PolicyDenied(
                        f"{name}: tool definition changed since approval; a human must approve "
                        "the new definition"
                    )
                call.outcome, calling = "server-failed", True
                return await self._clients.call_tool(agent, server, tool, arguments)
        except TimeoutError:
            raise McpServerFailed(
                f"MCP server {server.name}: no answer within {limit:g} s"
            ) from None
        except McpServerFailed as exc:
            if exc.run and calling:  # in flight when its server failed and was stopped
                call.outcome = "server-stopped"
                if not exc.bystander:  # (the stop is known to be another call's doing)
                    self._budget.stopped(call.sid, agent, server.name, exc.run)
            # The adapter's message may quote what the server printed (its stderr's last lines).
            raise McpServerFailed(self._error_text(spec, name, str(exc)), run=exc.run,
                                  bystander=exc.bystander) from None  # fmt: skip
        except InvalidArgument as exc:
            raise type(exc)(self._error_text(spec, name, str(exc))) from None

    def _error_text(self, spec: AgentSpec, name: str, text: str) -> str:
        """An error's text for the agent: host secrets masked, then clipped; withheld if one
        is still there in an encoded form, as a result is (``_checked``): a server failing
        while it logs a request header may print ``Basic <base64 of user:key>``."""
        # The agent as the call began: one removed meanwhile still has its credentials masked.
        secrets = own_secrets(self._credentials, spec)
        masked = Redactor(secrets).scrub(text)
        found = SecretDetector(secrets).find(masked.encode("utf-8", "backslashreplace"))
        if found is not None:
            return f"{name} failed; its error text withheld: it carries a host secret ({found})"
        return _clip(masked)

    def _checked(
        self, spec: AgentSpec, server: str, tool: str, result: McpCallResult, call: _Call
    ) -> McpResult:
        """The result capped, then host secrets masked; withheld if one is still there in an
        encoded form (base64, percent- or HTML-escaped, upper-cased...)."""
        # The agent's own credentials only: masking every host credential made each reflected
        # guess an oracle on other agents' (found by a review; the model proxy's rule too).
        secrets = own_secrets(self._credentials, spec)
        detector = SecretDetector(secrets)
        # Lone surrogates (JSON can carry them) cannot cross the wire: escaped.
        text = result.text.encode("utf-8", "backslashreplace").decode("utf-8")
        truncated = result.truncated
        cap = self._limits.max_result_chars
        if len(text) > cap:
            text, truncated = text[:cap], True
        if truncated:
            # A secret cut in two at the cap would pass unrecognised: the tail goes too.
            text = text[: max(0, len(text) - detector.tail)]
        text = Redactor(secrets).scrub_json(text)
        if len(text) > cap:  # re-encoded JSON can be longer; cut after masking is safe
            text, truncated = text[:cap], True
        found = detector.find(text.encode("utf-8"))
        if found is not None:
            call.outcome = "secret-withheld"
            raise ResponseRefused(
                f"MCP tool {server}/{_show(tool)}: result withheld: it carries a host secret "
                f"({found})"
            )
        return McpResult(text, result.is_error, truncated)

    # -- the record -----------------------------------------------------------------------------

    def _record(self, call: _Call, took: float) -> None:
        fields = dict(agent=call.agent, server=call.server, tool=call.tool[:128],
                      outcome=call.outcome, args_bytes=call.args_bytes,
                      result_bytes=call.result_bytes, truncated=call.truncated,
                      ms=round(took * 1e3, 1))  # fmt: skip
        actor = f"session:{call.sid}"
        ok = call.outcome in ("ok", "tool-error")
        try:
            if ok:
                self._audit.record_soon("mcp.call", actor, **fields)
            else:
                # The box decides how often it is refused: at a bounded rate per session.
                self._refusals.record(call.sid, "mcp.call", actor, **fields)
        except Exception as exc:  # the audit sink must not turn a call into a crash
            log.error("mcp: recording a call failed: %s", exc)
        ratelog.AGENT_LOG.log(
            log, logging.INFO if ok else logging.WARNING, call.sid, f"mcp {call.outcome}",
            "mcp call session %s agent %s: %s/%s: %s, %d bytes in, %d bytes out, %.0f ms",
            call.sid, call.agent or "?", call.server or "?", _show(call.tool or "?"),
            call.outcome, call.args_bytes, call.result_bytes, took * 1e3,
            extra={"IRONCLAW_SID": call.sid, "IRONCLAW_AGENT": call.agent,
                   "IRONCLAW_MCP_SERVER": call.server, "IRONCLAW_MCP_TOOL": call.tool[:128],
                   "IRONCLAW_STATUS": call.outcome, "IRONCLAW_BYTES_IN": call.args_bytes,
                   "IRONCLAW_BYTES_OUT": call.result_bytes,
                   "IRONCLAW_DURATION_MS": round(took * 1e3, 1)},
        )  # fmt: skip


@dataclass
class _Call:
    """What the record of one call says (never arguments or result)."""

    sid: str
    name: str
    args_bytes: int
    agent: str = ""
    server: str = ""
    tool: str = ""
    outcome: str = "refused"
    result_bytes: int = 0
    truncated: bool = False


def _show(value: str) -> str:
    """A name the box chose, for a message: escaped and cut."""
    text = value if len(value) <= 80 else value[:77] + "..."
    return text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text


def _clip(message: str) -> str:
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + " [...]"
