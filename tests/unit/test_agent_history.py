"""The history the agent keeps between turns (agent/model.py) is one the providers take: it starts
at a user's message, and every tool result follows the assistant message that called the tool.

The agent kept the last HISTORY_MESSAGES messages, cut wherever that fell. Once a conversation
with tool calls was longer than that, the kept history could start with a tool result whose call
was cut off (or with an assistant message), which Anthropic and OpenAI refuse (HTTP 400); the
turn failed, the history stayed as it was, and so every later message of the session was
answered "[the model is unavailable ...]" until its sandbox stopped."""

from __future__ import annotations

from typing import Any

import grpc

from agent import metered
from agent.model import HISTORY_MESSAGES, ModelResponder, kept_history
from ironclaw.model.v1 import model_pb2
from tests.fakes.rpc import FailedCall

TOOL_ROUNDS = 3  # tool rounds in each turn below, one call each: 8 messages a turn


def _malformed(messages: list[model_pb2.Message]) -> str:
    """Why a provider would refuse ``messages`` ("" if it would not)."""
    if messages[0].role != model_pb2.ROLE_USER:
        return "messages: first message must use the user role"
    called: set[str] = set()
    for message in messages:
        if message.role == model_pb2.ROLE_TOOL:
            if message.tool_call_id not in called:
                return f"tool result {message.tool_call_id} has no tool call before it"
        else:
            called = {call.id for call in message.tool_calls}
    return ""


class _Model:
    """Each turn: TOOL_ROUNDS rounds of one tool call, then the answer; refuses what a provider
    would refuse."""

    def __init__(self) -> None:
        self.requests: list[list[model_pb2.Message]] = []
        self.calls = 0

    def __call__(self, request: model_pb2.CompleteRequest) -> tuple[str, list[Any]]:
        messages = list(request.messages)
        self.requests.append(messages)
        why = _malformed(messages)
        if why:
            # What the proxy answers when the provider refuses the request (a ProviderError).
            raise FailedCall(grpc.StatusCode.UNAVAILABLE, f"anthropic: HTTP 400: {why}",
                             ((metered.ANSWERED_KEY, "1"),))  # fmt: skip
        last_user = max(i for i, m in enumerate(messages) if m.role == model_pb2.ROLE_USER)
        rounds = sum(m.role == model_pb2.ROLE_TOOL for m in messages[last_user:])
        if rounds < TOOL_ROUNDS:
            self.calls += 1
            call = model_pb2.ToolCall(id=f"call{self.calls}", name="nothing", arguments_json="{}")
            return "", [call]
        return f"done: {messages[last_user].text}", []


def test_a_long_conversation_with_tool_calls_keeps_a_history_the_provider_takes() -> None:
    responder = ModelResponder("/nonexistent/model.sock")
    responder._profile = model_pb2.GetProfileResponse(agent="a", max_tool_rounds=8)
    model = _Model()
    responder._answer = model  # type: ignore[method-assign]
    answers = [responder(f"message {n}") for n in range(1, 9)]
    assert answers == [f"done: message {n}" for n in range(1, 9)]
    for messages in model.requests:
        assert _malformed(messages) == ""
    # What is kept is still bounded.
    assert len(responder._history) <= HISTORY_MESSAGES
    assert responder._history[0].role == model_pb2.ROLE_USER


def test_a_turn_longer_than_the_history_keeps_none_of_it() -> None:
    user = model_pb2.Message(role=model_pb2.ROLE_USER, text="q")
    call = model_pb2.ToolCall(id="c", name="nothing", arguments_json="{}")
    turn = [user]
    for _ in range(HISTORY_MESSAGES):
        turn.append(model_pb2.Message(role=model_pb2.ROLE_ASSISTANT, tool_calls=[call]))
        turn.append(model_pb2.Message(role=model_pb2.ROLE_TOOL, text="r", tool_call_id="c"))
    turn.append(model_pb2.Message(role=model_pb2.ROLE_ASSISTANT, text="a"))
    assert kept_history(turn) == []
    assert kept_history([user, turn[-1]]) == [user, turn[-1]]
