"""Tools the agent runs for the model. File tools are jailed to /workspace (a size-capped tmpfs,
the only writable place in the box); read_file and list_files also read the installed skills
(read-only) under a path starting with ``/skills/``. ``run`` executes a program of the agent's
approved packages (agent/programs.py). The others go to host sockets that exist only when
granted (``http_fetch`` to egress.sock, ``mcp__<server>__<tool>`` to mcp.sock)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import grpc

from agent import egress, mcp, programs, runner
from agent.metered import call_metered
from ironclaw.gateway.v1 import gateway_pb2, gateway_pb2_grpc

WORKSPACE = Path("/workspace")
SKILLS = Path("/skills")  # the agent's skill set, bound read-only (and noexec) by the host
MAX_FILE_BYTES = 1024 * 1024
# What the model gets back of a file, cut and marked as http_fetch's answer is: the model proxy
# refuses a message over 256 Ki characters (ironclawd/domain/model.py MAX_TEXT), and reading a
# larger file failed the whole turn.
MAX_RESULT_CHARS = egress.MAX_RESULT_CHARS
GATEWAY_SOCKET = Path("/run/ironclaw/gateway.sock")
EGRESS_SOCKET = Path("/run/ironclaw/egress.sock")
MCP_SOCKET = Path("/run/ironclaw/mcp.sock")


def close_channels() -> None:
    """The tools' kept channels to host sockets, closed while the agent is idle."""
    egress.close_channels()
    mcp.close_channels()


class ToolError(Exception):
    pass


def _jail(relative: str, root: Path = WORKSPACE, where: str = "the workspace") -> Path:
    """``relative`` inside ``root``, refusing absolute paths, '..', NUL and symlink escapes."""
    if not isinstance(relative, str) or "\0" in relative:
        raise ToolError("path: expected a relative path without NUL")
    candidate = os.path.normpath(relative or ".")
    if os.path.isabs(candidate) or candidate == ".." or candidate.startswith("../"):
        raise ToolError(f"path {relative!r}: must stay inside {where}")
    path = root / candidate
    real = Path(os.path.realpath(path))
    if real != root and root not in real.parents:
        raise ToolError(f"path {relative!r}: resolves outside {where}")
    return path


def _skills_path(path: str) -> str | None:
    """The part after ``/skills/`` of a path naming the skills, else None."""
    if path == str(SKILLS) or path.startswith(f"{SKILLS}/"):
        return path[len(str(SKILLS)) :].lstrip("/")
    return None


def _readable(path: str, root: Path, skills: Path) -> Path:
    """A path for reading: under /skills (same jail rules) or else in the workspace."""
    inside = _skills_path(path)
    if inside is None:
        return _jail(path, root)
    return _jail(inside, skills, str(SKILLS))


def read_file(args: dict[str, object], root: Path = WORKSPACE, skills: Path = SKILLS) -> str:
    path = _readable(str(args.get("path", "")), root, skills)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolError(f"{args.get('path')}: not a regular file")
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"{args.get('path')}: larger than {MAX_FILE_BYTES} bytes")
    text = data.decode("utf-8", "replace")
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[... {len(text) - MAX_RESULT_CHARS} more characters]"
    return text


def write_file(args: dict[str, object], root: Path = WORKSPACE) -> str:
    if _skills_path(str(args.get("path", ""))) is not None:
        raise ToolError(f"path {args.get('path')!r}: {SKILLS} is read-only")
    path = _jail(str(args.get("path", "")), root)
    content = str(args.get("content", ""))
    data = content.encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"content: larger than {MAX_FILE_BYTES} bytes")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return f"wrote {len(data)} bytes to {args.get('path')}"


def list_files(args: dict[str, object], root: Path = WORKSPACE, skills: Path = SKILLS) -> str:
    path = _readable(str(args.get("path", "") or "."), root, skills)
    return json.dumps(sorted(entry.name + ("/" if entry.is_dir() else "")
                             for entry in os.scandir(path)))  # fmt: skip


def request_change(args: dict[str, object]) -> str:
    """Ask for a configuration change. It only ever becomes *pending*: a human decides."""
    if not GATEWAY_SOCKET.exists():
        return "error: the approval gateway is not available to this session"
    request = gateway_pb2.SubmitChangeRequest(
        kind=str(args.get("kind", "")),
        payload_json=str(args.get("payload_json", "")),
        reason=str(args.get("reason", "")),
        agent=str(args.get("agent", "")),
    )
    with grpc.insecure_channel(f"unix:{GATEWAY_SOCKET}") as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        try:
            change = call_metered(lambda: stub.SubmitChange(request, timeout=30)).change
        except grpc.RpcError as err:
            return f"error: change refused ({err.code().name.lower()}): {err.details()}"
    return f"change {change.id} is {change.state}: a human must approve it before it applies"


def http_fetch(args: dict[str, object]) -> str:
    if not EGRESS_SOCKET.exists():
        return "error: this agent has no approved egress (ask for it with request_change)"
    try:
        return egress.fetch(args, str(EGRESS_SOCKET))
    except egress.FetchError as exc:
        raise ToolError(str(exc)) from None


def mcp_tool(name: str, arguments_json: str) -> str:
    """A granted MCP tool (``mcp__<server>__<tool>``), run host-side; mcp.sock exists only when
    the agent has some granted, and the host checks the grant on every call."""
    if not MCP_SOCKET.exists():
        return "error: this agent has no MCP tools granted (ask for them with request_change)"
    return mcp.call(name, arguments_json, str(MCP_SOCKET))


def run(
    args: dict[str, object],
    programs_file: Path = programs.PROGRAMS_FILE,
    root: Path = WORKSPACE,
) -> str:
    """A program from the agent's approved packages; the list is in the image, written by the
    host when it built the image from the approved packages."""
    try:
        return programs.run(args, programs_file, root)
    except runner.ProgramError as exc:
        raise ToolError(str(exc)) from None


TOOLS = {
    "read_file": read_file,
    "write_file": write_file,
    "list_files": list_files,
    "request_change": request_change,
    "http_fetch": http_fetch,
    "run": run,
}


def _utf8(text: str) -> str:
    """Text that can be encoded: a file name the model chose may hold lone surrogates (bytes
    that are not UTF-8), and a result carrying one could not be sent back to the model."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def run_tool(name: str, arguments_json: str) -> str:
    """Run one tool call; failures come back as text for the model, never as an exception."""
    if name not in TOOLS and not name.startswith(mcp.TOOL_PREFIX):
        return f"error: unknown tool {name!r}"
    try:
        tool = TOOLS.get(name)
        if tool is None:  # mcp__<server>__<tool>: the host checks the rest
            return _utf8(mcp_tool(name, arguments_json))
        args = json.loads(arguments_json or "{}")
        if not isinstance(args, dict):
            return "error: arguments must be a JSON object"
        return _utf8(tool(args))
    except (ToolError, OSError, ValueError) as exc:
        return _utf8(f"error: {exc}")
    except Exception as exc:  # e.g. RecursionError from deeply nested JSON
        # The model chose these arguments: nothing it sends may crash the agent (and so end
        # the session in silence); the failure goes back to it as the tool's result.
        return f"error: {name} failed: {type(exc).__name__}"
