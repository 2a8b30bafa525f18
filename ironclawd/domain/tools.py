"""The tools an agent may be given (docs/architecture.md §5); which ones each agent has is
policy."""

from __future__ import annotations

import json

from ironclawd.domain.model import ToolDef


def _schema(properties: dict[str, dict[str, object]], required: list[str]) -> str:
    return json.dumps(
        {"type": "object", "properties": properties, "required": required,
         "additionalProperties": False}, sort_keys=True
    )  # fmt: skip


CATALOG: dict[str, ToolDef] = {
    t.name: t
    for t in (
        ToolDef(
            "read_file",
            "Read a text file from your workspace (a relative path) or, read-only, from an "
            "installed skill (/skills/<name>/...).",
            _schema({"path": {"type": "string"}}, ["path"]),
        ),
        ToolDef(
            "write_file",
            "Write a text file in your workspace (created or replaced).",
            _schema(
                {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]
            ),
        ),
        ToolDef(
            "list_files",
            "List the files in a directory of your workspace, or of /skills (installed skills).",
            _schema({"path": {"type": "string"}}, []),
        ),
        ToolDef(
            "request_change",
            "Ask a human to change your configuration (persona, tools, egress, ...). Nothing "
            "changes until a human approves.",
            _schema(
                {
                    "kind": {"type": "string"},
                    "payload_json": {"type": "string"},
                    "reason": {"type": "string"},
                },
                ["kind", "payload_json"],
            ),
        ),
        ToolDef(
            "http_fetch",
            "Fetch an approved URL through the egress broker.",
            _schema(
                {
                    "method": {"type": "string"},
                    "url": {"type": "string"},
                    "headers": {"type": "object"},
                    "body": {"type": "string"},
                },
                ["url"],
            ),
        ),
        ToolDef(
            "run",
            "Run a program from one of your approved packages (by name, e.g. jq) in your "
            "workspace, with an argument list (no shell: each argument is passed as it is). "
            "Returns its exit code, stdout and stderr (each capped at 64 KiB). Optional: stdin "
            "(text), timeout_seconds (1-120, default 30).",
            _schema(
                {
                    "program": {"type": "string"},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "stdin": {"type": "string"},
                    "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 120},
                },
                ["program"],
            ),
        ),
    )
}


def tool_defs(names: tuple[str, ...]) -> tuple[ToolDef, ...]:
    return tuple(CATALOG[n] for n in names if n in CATALOG)
