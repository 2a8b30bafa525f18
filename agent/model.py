"""The agent's turn: ask the model (through the host's proxy), run the tools it calls, answer.

The proxy holds the key and fixes the persona and the tool list; this side only converses. A
failure of the model or a tool reaches the user as a message, never as silence, and a turn runs
at most ``max_tool_rounds`` tool rounds.
"""

from __future__ import annotations

import contextlib
import threading
import time

import grpc

from agent.metered import answered_by_host, call_metered
from agent.tools import close_channels, run_tool
from ironclaw.model.v1 import model_pb2, model_pb2_grpc

MODEL_SOCKET = "/run/ironclaw/model.sock"
HISTORY_MESSAGES = 20
CALL_TIMEOUT = 300.0
# How long a turn waits for the host's proxy to come back (a daemon restart takes seconds)
# before the user is told the model is unavailable.
HOST_RESTART_GRACE = 60.0
RETRY_FIRST_PAUSE = 0.05
RETRY_MAX_PAUSE = 1.0
# How long getting ready for a claimed session's first message may take (``prepare``); past
# that, or refused, the first turn asks for the profile itself.
PREPARE_TIMEOUT = 5.0


def warm_grpc() -> None:
    """Start gRPC's core once and let it rest again: a channel made and closed at once. The first
    channel a process makes costs ~15-25 ms in gVisor under ptrace (threads, pollers), a later
    one ~3 ms; with the channel closed gRPC's threads end, so a pooled sandbox that does this
    before it waits for its claim still waits with one thread and no CPU, and its first message
    does not pay the start (docs/development.md, stop 35)."""
    grpc.insecure_channel(f"unix:{MODEL_SOCKET}").close()


def kept_history(messages: list[model_pb2.Message]) -> list[model_pb2.Message]:
    """What of a finished turn's ``messages`` the next turn starts from: the last
    HISTORY_MESSAGES at most, from a user's message on. Cut anywhere else, it could start with a
    tool's result whose call was cut off, or with the model's own message, which the providers
    refuse (HTTP 400): every later turn of the session failed on it. None if no user's message
    is among them (one turn of that many tool calls)."""
    kept = messages[-HISTORY_MESSAGES:]
    start = next((i for i, m in enumerate(kept) if m.role == model_pb2.ROLE_USER), len(kept))
    return kept[start:]


class ModelResponder:
    def __init__(self, socket_path: str = MODEL_SOCKET) -> None:
        self._target = f"unix:{socket_path}"
        self._channel: grpc.Channel | None = None
        self._profile: model_pb2.GetProfileResponse | None = None
        self._history: list[model_pb2.Message] = []
        self._preparing: threading.Thread | None = None

    @property
    def _stub(self) -> model_pb2_grpc.ModelServiceStub:
        return model_pb2_grpc.ModelServiceStub(self._open())

    def _open(self) -> grpc.Channel:
        # One channel while the agent is busy (set-up costs ~20 ms across gVisor), opened at the
        # first call after ``rest``.
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                self._target,
                # Reconnect promptly after a daemon restart (grpc's default backoff reaches 120 s).
                options=[
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
        return self._channel

    def prepare(self) -> None:
        """A session has just claimed this sandbox, and its first message is on its way: open
        the channel to the proxy, connect it and fetch the profile now, on a thread of its own,
        while the host and the client still exchange the create and the send. In gVisor that
        set-up took ~18 ms of the first message's round trip (docs/development.md, stop 42).
        The next turn, and ``rest``, wait for it to end first; if it failed (the host refused
        or went away), the turn asks again as it would have."""
        if self._preparing is None:
            self._preparing = threading.Thread(target=self._prepare, name="prepare", daemon=True)
            self._preparing.start()

    def _prepare(self) -> None:
        request = model_pb2.GetProfileRequest()
        with contextlib.suppress(grpc.RpcError):
            self._profile = self._stub.GetProfile(request, timeout=PREPARE_TIMEOUT)

    def _prepared(self) -> None:
        """Wait for ``prepare``'s thread, if one runs: it and the caller share the channel."""
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None

    def rest(self) -> None:
        """The agent is idle: close every channel it keeps (this one and the tools'). With the
        last channel gone, gRPC's own threads end: while one is open, its timer, lifeguard and
        thread-pool threads wake ~8 times a second, and under gVisor's ptrace platform that was
        ~90% of an idle sandbox's CPU (issue 17). The next call opens a channel again."""
        self._prepared()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        close_channels()

    def _get_profile(self) -> model_pb2.GetProfileResponse:
        if self._profile is None:
            request = model_pb2.GetProfileRequest()
            self._profile = call_metered(lambda: self._stub.GetProfile(request, timeout=30))
        return self._profile

    def __call__(self, text: str) -> str:
        self._prepared()
        deadline = time.monotonic() + HOST_RESTART_GRACE
        pause = 0.0
        while True:
            try:
                return self._turn(text)
            except grpc.RpcError as err:
                if self._host_went_away(err, deadline, pause):
                    pause = min(max(pause * 2, RETRY_FIRST_PAUSE), RETRY_MAX_PAUSE)
                    continue
                code = err.code()
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    return f"[I cannot answer now: {err.details()}]"
                return f"[the model is unavailable ({code.name.lower()}): {err.details()}]"
            except Exception as exc:  # a bug here must reach the user, not end the session
                self._history = []
                return f"[the agent failed on this message: {type(exc).__name__}]"

    def _host_went_away(self, err: grpc.RpcError, deadline: float, pause: float) -> bool:
        """Whether the call failed because its connection to the proxy ended (the daemon
        restarting, or a connection the host closed while it was idle) rather than the model
        failing behind the proxy; if so, open a new channel and wait until it is ready. A provider
        failure also arrives as UNAVAILABLE, but with the host's trailer (answered_by_host).
        The legacy gRPC client (agent/__main__.py) notices a closed idle connection only when a
        call fails on it, so the first retry is at once; later ones back off by ``pause``."""
        if err.code() != grpc.StatusCode.UNAVAILABLE or answered_by_host(err):
            return False
        if time.monotonic() + pause >= deadline:
            return False
        time.sleep(pause)
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        with contextlib.suppress(grpc.FutureTimeoutError):
            grpc.channel_ready_future(self._open()).result(
                timeout=max(0.1, deadline - time.monotonic())
            )
        return True

    def _turn(self, text: str) -> str:
        profile = self._get_profile()
        messages = [*self._history, model_pb2.Message(role=model_pb2.ROLE_USER, text=text)]
        for _round in range(profile.max_tool_rounds + 1):
            answer, calls = self._complete(messages, profile)
            messages.append(
                model_pb2.Message(role=model_pb2.ROLE_ASSISTANT, text=answer, tool_calls=calls)
            )
            if not calls:
                self._history = kept_history(messages)
                return answer or "[the model gave no answer]"
            for call in calls:
                result = run_tool(call.name, call.arguments_json)
                messages.append(
                    model_pb2.Message(role=model_pb2.ROLE_TOOL, text=result, tool_call_id=call.id)
                )
        self._history = []
        return f"[stopped after {profile.max_tool_rounds} tool rounds without an answer]"

    def _complete(
        self, messages: list[model_pb2.Message], profile: model_pb2.GetProfileResponse
    ) -> tuple[str, list[model_pb2.ToolCall]]:
        # The whole answer in one message (Answer, a unary call: it waits on the calling
        # thread, with no thread of grpc's): the agent joins the text anyway, and a stream's
        # event and its end were two writes and two reads through the sandbox's kernel.
        request = model_pb2.CompleteRequest(messages=messages, tools=profile.tools)
        # A refusal for the call rate comes before any answer: the retry starts afresh.
        return call_metered(lambda: self._answer(request))

    def _answer(self, request: model_pb2.CompleteRequest) -> tuple[str, list[model_pb2.ToolCall]]:
        answer = self._stub.Answer(request, timeout=CALL_TIMEOUT)
        return answer.text, list(answer.tool_calls)
