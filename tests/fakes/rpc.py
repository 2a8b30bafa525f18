"""A gRPC call that failed, as a client sees it (``grpc.RpcError`` and ``grpc.Call``): for the
agent's handling of the host's refusals (agent/metered.py, agent/model.py) without a server."""

from __future__ import annotations

from typing import Any

import grpc


class FailedCall(grpc.RpcError, grpc.Call):
    """A call that ended with ``code``, ``details`` and the trailer ``trailer``."""

    def __init__(
        self, code: grpc.StatusCode, details: str = "x", trailer: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self._code, self._details, self._trailer = code, details, trailer

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailer

    def initial_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False
