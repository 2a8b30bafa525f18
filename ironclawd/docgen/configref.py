"""Defaults of the config keys as TOML values, for ironclawd.toml(5): the reference table
(docs/config.md) shows Python's spelling, a reader of the man page writes TOML."""

from __future__ import annotations

import json
from pathlib import PurePath

from ironclawd.config import AGENT_KEYS, SCHEMA, Config
from ironclawd.config_channels import COMMON_KEYS, MATRIX_KEYS, WEBHOOK_KEYS
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import ChannelConfig

LONGEST = 48  # a longer default string is shown cut, ending in "..."


def toml_defaults() -> dict[str, str]:
    """Each key of the reference (``gateway.expiry_hours``, ``agents.NAME.persona``,
    ``channels[].listen``) and its default written as TOML; required keys are left out."""
    found: dict[str, str] = {}
    config = Config()
    for table, (_cls, keys) in SCHEMA.items():
        for key in keys:
            found[f"{table}.{key}"] = toml_value(getattr(getattr(config, table), key))
    agent = AgentSpec("example")
    for key in AGENT_KEYS:
        found[f"agents.NAME.{key}"] = toml_value(getattr(agent, key))
    channel = ChannelConfig("example", "webhook")
    for keys in (COMMON_KEYS, MATRIX_KEYS, WEBHOOK_KEYS):
        for key in keys:
            if key not in ("name", "type"):
                found[f"channels[].{key}"] = toml_value(getattr(channel, key))
    return found


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | PurePath):
        text = str(value)
        if len(text) > LONGEST:
            return json.dumps(text[:LONGEST])[:-1] + '..."'
        return json.dumps(text)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)
