"""Provider-neutral model calls, redaction and budgets: pure values and rules."""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

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
    """The agent may offer only the tools enabled for it; their definitions are the host's.
    Each at most once, where the agent first offered it: every copy of a name became a whole
    host definition, so 10,000 copies of one short name (a 130 KB request) were an 18 times
    larger body held for the call and sent upstream."""
    allowed = {t.name: t for t in enabled}
    names = dict.fromkeys(t.name for t in offered if t.name in allowed)
    return tuple(allowed[name] for name in names)


def estimated_input_tokens(completion: Completion) -> int:
    """A rough count of the tokens ``completion`` sends (a quarter of its characters, rounded
    up: near what the providers' tokenizers make of English and code), known before the call.
    The budgets reserve it with the call's ``max_tokens`` while the call runs, and charge it
    when the provider never says what the call used."""
    chars = len(completion.system)
    for message in completion.messages:
        chars += len(message.text) + len(message.tool_call_id)
        for call in message.tool_calls:
            chars += len(call.id) + len(call.name) + len(call.arguments_json)
    for tool in completion.tools:
        chars += len(tool.name) + len(tool.description) + len(tool.parameters_json)
    return math.ceil(chars / 4)


# How a model call ended, for what it is charged (tokens_to_charge).
# "ok": the stream ended; "upstream-error": the provider said no (a ProviderError from upstream);
# "abandoned": the agent went away, the call ran out of time or the connection failed.
Ending = Literal["ok", "upstream-error", "abandoned"]


def tokens_to_charge(
    ending: Ending,
    reported: tuple[int, int] | None,
    *,
    input_estimate: int,
    max_tokens: int,
    streamed_chars: int,
) -> int:
    """The tokens a call is charged to its budgets, from how it ended and the provider's last
    usage (input, output), None if it reported none.

    An ended call is charged what the provider reported; when an OpenAI-compatible server sends
    no usage, the input estimate and a quarter of the characters streamed out. A call that did
    not end may have been billed for a whole answer nobody read: it is charged at least its
    input (reported, else estimated) and ``max_tokens``, or more if more was reported. Charging
    it nothing let an agent that drops each call once it has the tool call it wanted (or that
    lets each run out of time) spend upstream tokens its budget never saw."""
    if ending == "abandoned":
        total = sum(reported) if reported is not None else 0
        known_input = reported[0] if reported is not None and reported[0] else input_estimate
        return max(total, known_input + max_tokens)
    if reported is not None:
        return reported[0] + reported[1]
    if ending == "ok":
        return input_estimate + math.ceil(streamed_chars / 4)
    return 0  # refused upstream, and it said nothing of usage: nothing known to be billed


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
        if not self._secrets:
            return text
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return self.scrub(text)
        try:
            scrubbed = self._scrub_value(value)
            if scrubbed == value:
                return text  # nothing to hide: the model's text as it was
            # ASCII: a lone surrogate the model escaped must stay escaped (protobuf strings are
            # UTF-8).
            return json.dumps(scrubbed)
        except RecursionError:
            # Nested deeper than this walk can go (json.loads goes further): a RecursionError
            # here failed the call as an internal error, with a traceback logged each time
            # (found by a review). Without escapes the text match is exact; with them, none of
            # it is kept.
            return self.scrub(text) if "\\" not in text else json.dumps(self.MASK)

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
    """Requests per minute and tokens per day for one key (a session or an agent).

    Tokens are known only when a call ends, so each call in flight holds a reservation (its
    estimated input and its ``max_tokens``) from its admission to its end, and a call is
    admitted only while what was spent and what is reserved are under the day's budget: when
    only what was spent counted, 30 calls started together all passed before any was charged,
    and spent 15 times a session's budget."""

    requests_per_minute: int
    tokens_per_day: int
    _requests: collections.deque[float] = field(default_factory=collections.deque)
    _tokens: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    # The sum of ``_tokens``, kept as they come and go: summing a day of records on every call
    # made each call slower the busier the day had been (issue 17).
    _used: int = 0
    _reserved: int = 0  # held by the calls in flight (reserve/release)

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
            # The wait until enough of the minute's requests age out; the agent waits it out
            # rather than failing its user's turn (a tool-heavy turn makes several calls).
            wait = self._requests[-self.requests_per_minute] + 60 - now
            raise BudgetExceeded(
                f"{what}: rate limit of {self.requests_per_minute} model requests per minute "
                f"reached; the next is taken in {wait:.1f} s",
                retry_after=wait,
            )
        # A lone call is admitted while the day is under budget, even if its own reservation
        # would take it over: a call's max_tokens is a ceiling, not what it will use.
        used, reserved = self._used, self._reserved
        if used + reserved >= self.tokens_per_day:
            held = f"; {reserved} reserved by calls in flight" if reserved else ""
            raise BudgetExceeded(
                f"{what}: daily budget of {self.tokens_per_day} tokens used up ({used}{held})"
            )

    def reserve(self, tokens: int) -> None:
        """Hold ``tokens`` for a call just admitted, until :meth:`release` at its end."""
        self._reserved += tokens

    def release(self, tokens: int) -> None:
        self._reserved = max(0, self._reserved - tokens)

    def spend(self, now: float, tokens: int) -> None:
        self._tokens.append((now, tokens))
        self._used += tokens

    def set_limits(self, requests_per_minute: int, tokens_per_day: int) -> None:
        """The agent's limits as they are now (an approved change may have moved them), the
        requests and tokens already counted kept."""
        self.requests_per_minute = requests_per_minute
        self.tokens_per_day = tokens_per_day
