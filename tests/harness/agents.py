"""Agent tables for test and benchmark configs."""

from __future__ import annotations

import json


def unlimited_agent(name: str, tools: tuple[str, ...] = ()) -> str:
    """A ``[agents.NAME]`` table (mock model, ``tools``: none by default) whose request and token
    limits are out of the way: a stress run, a benchmark or a full-disk run must not stop at a
    rate limit."""
    return f"""
[agents.{name}]
tools = {json.dumps(list(tools))}
requests_per_minute = 100000
session_requests_per_minute = 100000
tokens_per_day = 10000000000
session_tokens_per_day = 10000000000
"""
