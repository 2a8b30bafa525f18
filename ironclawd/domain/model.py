"""Provider-neutral model calls, redaction and budgets: pure values and rules."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from ironclawd.errors import BudgetExceeded, InvalidArgument


@dataclass(frozen=True)
class ToolDef:
    name: str
    description: str
    parameters_json: str


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments_json: str


@dataclass(frozen=True)
class Message:
    role: str  # "user", "assistant", "tool"
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""


@dataclass(frozen=True)
class Completion:
    """What the proxy sends to a provider: the persona is the host's, never the agent's."""

    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolDef, ...]
    model: str
    max_tokens: int


# One streamed event: exactly one field is set.
@dataclass(frozen=True)
class Chunk:
    text: str = ""
    tool_call: ToolCall | None = None
    usage: tuple[int, int] | None = None  # (input, output) tokens
    stop_reason: str = ""


MAX_MESSAGES = 400
MAX_TEXT = 256 * 1024


def check_messages(messages: Iterable[Message]) -> tuple[Message, ...]:
    out = tuple(messages)
    if not out:
        raise InvalidArgument("messages: expected at least one message")
    if len(out) > MAX_MESSAGES:
        raise InvalidArgument(f"messages: expected at most {MAX_MESSAGES}, got {len(out)}")
    for index, message in enumerate(out):
        if message.role not in ("user", "assistant", "tool"):
            raise InvalidArgument(f"messages[{index}].role: expected user, assistant or tool")
        if len(message.text) > MAX_TEXT:
            raise InvalidArgument(f"messages[{index}].text: expected at most {MAX_TEXT} chars")
    return out


def enabled_tools(offered: Iterable[ToolDef], enabled: Iterable[ToolDef]) -> tuple[ToolDef, ...]:
    """The agent may offer only the tools enabled for it; their definitions are the host's."""
    allowed = {t.name: t for t in enabled}
    return tuple(allowed[t.name] for t in offered if t.name in allowed)


class Redactor:
    """Removes configured secrets from streamed text, including a secret split across chunks:
    the last (longest secret - 1) characters are held back until more text or the end."""

    MASK = "[REDACTED]"

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)
        self._hold = max((len(s) for s in self._secrets), default=1) - 1
        self._pending = ""

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, self.MASK)
        return text

    def feed(self, text: str) -> str:
        self._pending = self.scrub(self._pending + text)
        if self._hold <= 0:
            out, self._pending = self._pending, ""
            return out
        cut = max(0, len(self._pending) - self._hold)
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def flush(self) -> str:
        out, self._pending = self.scrub(self._pending), ""
        return out

    def scrub_json(self, text: str) -> str:
        """Tool-call arguments: JSON may spell a secret with escapes (``\\u0073k-...``, ``\\/``)
        that a plain text match misses and the agent's JSON parser undoes, so every string in
        it is scrubbed after decoding and the result re-encoded; text that is not JSON is
        scrubbed as text."""
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return self.scrub(text)
        scrubbed = self._scrub_value(value)
        if scrubbed == value:
            return text  # nothing to hide: the model's text as it was
        # ASCII: a lone surrogate the model escaped must stay escaped (protobuf strings are UTF-8).
        return json.dumps(scrubbed)

    def _scrub_value(self, value: object) -> object:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, list):
            return [self._scrub_value(v) for v in value]
        if isinstance(value, dict):
            return {self.scrub(str(k)): self._scrub_value(v) for k, v in value.items()}
        return value


@dataclass
class Budget:
    """Requests per minute and tokens per day for one key (a session or an agent)."""

    requests_per_minute: int
    tokens_per_day: int
    _requests: collections.deque[float] = field(default_factory=collections.deque)
    _tokens: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    # The sum of ``_tokens``, kept as they come and go: summing a day of records on every call
    # made each call slower the busier the day had been (issue 17).
    _used: int = 0

    def admit(self, now: float, what: str) -> None:
        """Count one request or raise BudgetExceeded (mapped to RESOURCE_EXHAUSTED)."""
        self.check(now, what)
        self.record(now)

    def record(self, now: float) -> None:
        """Count one request (after :meth:`check` of every budget it is charged to passed)."""
        self._requests.append(now)

    def check(self, now: float, what: str) -> None:
        """Raise BudgetExceeded if one more request now would exceed this budget."""
        while self._requests and self._requests[0] <= now - 60:
            self._requests.popleft()
        while self._tokens and self._tokens[0][0] <= now - 86400:
            self._used -= self._tokens.popleft()[1]
        if len(self._requests) >= self.requests_per_minute:
            raise BudgetExceeded(
                f"{what}: rate limit of {self.requests_per_minute} model requests per minute "
                "reached; try again in a minute"
            )
        used = self._used
        if used >= self.tokens_per_day:
            raise BudgetExceeded(
                f"{what}: daily budget of {self.tokens_per_day} tokens used up ({used})"
            )

    def spend(self, now: float, tokens: int) -> None:
        self._tokens.append((now, tokens))
        self._used += tokens
