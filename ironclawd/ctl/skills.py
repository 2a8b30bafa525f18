"""``ironctl skill ...``: install, list, show and remove an agent's skills; sign one.

``add`` reads the folder here (formats/skill_folder.py) and checks its form before sending the
whole skill as a ``skills`` change; the daemon checks it again, verifies the signature against
its trusted keys, and holds it for a human. ``sign``, ``manifest`` and ``verify`` work offline.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render
from ironclawd.ctl.changes import show_change
from ironclawd.ctl.common import SMALL_FILE_BYTES, CtlError, read_file
from ironclawd.errors import IronclawError, PolicyDenied, SignatureMismatch
from ironclawd.formats import minisign
from ironclawd.formats import skill as skill_format
from ironclawd.formats.skill_folder import open_folder, read_folder, read_opened, write_signature

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub

PREFIX = "skills."


def _local(exc: IronclawError | OSError) -> CtlError:
    """A refusal found here, before anything reached the daemon."""
    if isinstance(exc, SignatureMismatch):
        return CtlError("BAD_SIGNATURE", exitcodes.BAD_SIGNATURE, str(exc))
    if isinstance(exc, PolicyDenied):
        return CtlError("PERMISSION_DENIED", exitcodes.PERMISSION, str(exc))
    if isinstance(exc, OSError):
        return CtlError("INVALID_ARGUMENT", exitcodes.INVALID, f"{exc.filename}: {exc.strerror}")
    return CtlError("INVALID_ARGUMENT", exitcodes.INVALID, str(exc))


def _folder(path: str, fd: int | None = None) -> tuple[str, dict[str, bytes], str | None]:
    """The skill folder at ``path`` (read through ``fd`` if it is open already), checked."""
    try:
        if fd is None:
            name, files, signature = read_folder(Path(path))
        else:
            name, files, signature = read_opened(fd, Path(path))
        skill_format.check_files(name, files)
    except (IronclawError, OSError) as exc:
        raise _local(exc) from None
    return name, files, signature


def _signed(path: str) -> skill_format.Skill:
    try:
        return skill_format.load(*_folder(path))
    except IronclawError as exc:
        raise _local(exc) from None


def _submit(args: argparse.Namespace, stub: Stub, payload: dict[str, Any], what: str) -> int:
    request = admin_pb2.SubmitChangeRequest(
        kind="skills",
        agent=args.agent,
        payload_json=json.dumps(payload, ensure_ascii=False),
        reason=args.reason or "",
    )
    change = stub.SubmitChange(request, timeout=args.timeout).change
    if not args.json:
        print(f"{what}: skills change {change.id} is pending a human decision")
    show_change(args, change)
    return exitcodes.OK


def cmd_add(args: argparse.Namespace, stub: Stub) -> int:
    skill = _signed(args.path)
    payload = {
        "op": "add",
        "name": skill.name,
        "files": [{"path": f.path, "text": f.text} for f in skill.files],
        "signature": skill.signature,
    }
    return _submit(args, stub, payload, f"skill {skill.name} {skill.version}")


def cmd_remove(args: argparse.Namespace, stub: Stub) -> int:
    payload = {"op": "remove", "name": args.name}
    return _submit(args, stub, payload, f"removing skill {render.visible(args.name)}")


def installed(agent: admin_pb2.Agent) -> list[dict[str, Any]]:
    """The agent's skills from its view: each with name, agent and grants."""
    view = json.loads(agent.view_json or "{}")
    out = []
    for key, value in sorted(view.items()):
        name = key.removeprefix(PREFIX)
        if key.startswith(PREFIX) and not key.endswith(".grants"):
            grants = view.get(f"{key}.grants", {})
            out.append({"agent": agent.name, "name": name, **value, "grants": grants})
    return out


def _grants(grants: dict[str, Any]) -> list[str]:
    lines = [f"tool {t}" for t in grants.get("tools", [])]
    for rule in grants.get("egress", []):
        port = f":{rule['port']}" if rule.get("port") else ""
        lines.append(
            f"egress {','.join(rule['methods'])} {rule['scheme']}://{rule['host']}"
            f"{port} {','.join(rule['path_prefixes'])}"
        )
    lines += [
        f"mcp {g['server']}/{g['tool']} (pinned {g['digest'][:12]})"
        for g in grants.get("mcp_tools", [])
    ]
    return lines


def cmd_list(args: argparse.Namespace, stub: Stub) -> int:
    if args.agent:
        agents = [
            stub.GetAgent(admin_pb2.GetAgentRequest(name=args.agent), timeout=args.timeout).agent
        ]
    else:
        agents = list(stub.ListAgents(admin_pb2.ListAgentsRequest(), timeout=args.timeout).agents)
    skills = [s for a in agents for s in installed(a)]
    if args.json:
        print(json.dumps({"skills": skills}, indent=2))
        return exitcodes.OK
    # A skill's grants a line each on a terminal, joined by "; " off one (render.table).
    rows = [[s["agent"], s["name"], render.visible(s["version"]), s["signer"],
             str(len(s["files"])), render.visible("\n".join(_grants(s["grants"])), newlines=True)]
            for s in skills]  # fmt: skip
    render.table(("AGENT", "SKILL", "VERSION", "SIGNER", "FILES", "GRANTS"), rows,
                 legend=not args.no_legend)  # fmt: skip
    return exitcodes.OK


def cmd_show(args: argparse.Namespace, stub: Stub) -> int:
    agent = stub.GetAgent(admin_pb2.GetAgentRequest(name=args.agent), timeout=args.timeout).agent
    found = next((s for s in installed(agent) if s["name"] == args.name), None)
    if found is None:
        raise CtlError(
            "NOT_FOUND",
            exitcodes.NOT_FOUND,
            f"agent {args.agent} has no skill {render.visible(args.name)}",
        )
    if args.json:
        print(json.dumps(found, indent=2))
        return exitcodes.OK
    rows: list[tuple[str, render.Cell]] = [
        (key, render.visible(str(found[key])))
        for key in ("agent", "name", "version", "signer", "manifest_sha256")
    ]
    rows.append(("description", render.visible(found["description"], newlines=True)))
    rows.append(("grants", render.visible("\n".join(_grants(found["grants"])) or "none",
                                          newlines=True)))  # fmt: skip
    render.fields(rows)
    files = [[render.visible(f["path"]), str(f["size"]), f["sha256"]] for f in found["files"]]
    render.table(("PATH", "BYTES", "SHA256"), files, legend=not args.no_legend)
    return exitcodes.OK


def cmd_manifest(args: argparse.Namespace, _stub: Stub) -> int:
    name, files, _ = _folder(args.path)
    body = skill_format.manifest(
        (f.path, f.sha256) for f in skill_format.check_files(name, files)
    ).decode()
    if args.json:
        print(json.dumps({"name": name, "manifest": body}))
    else:
        print(body, end="")
    return exitcodes.OK


def cmd_sign(args: argparse.Namespace, _stub: Stub) -> int:
    # One descriptor of the folder for reading the files and writing the signature: signing is
    # vouching for a skill someone else wrote, often as root in a folder that someone owns.
    try:
        fd = open_folder(Path(args.path))
    except (IronclawError, OSError) as exc:
        raise _local(exc) from None
    try:
        name, files, _ = _folder(args.path, fd)
        try:
            key = minisign.parse_secret_key(read_file(args.key, SMALL_FILE_BYTES).decode())
        except UnicodeDecodeError as exc:
            # Where, never which byte: the file may be a secret of another kind given by mistake.
            raise CtlError("INVALID_ARGUMENT", exitcodes.INVALID,
                           f"--key {args.key}: not UTF-8 text (at byte {exc.start}); expected "
                           "a minisign secret key file") from None  # fmt: skip
        except (IronclawError, OSError) as exc:
            raise CtlError("INVALID_ARGUMENT", exitcodes.INVALID,
                           f"--key {args.key}: {exc}") from None  # fmt: skip
        comment = args.comment or f"timestamp:{int(time.time())}\tfile:{name}\thashed"
        try:
            text = skill_format.sign(name, files, key, comment)
            write_signature(fd, text)
        except (IronclawError, OSError) as exc:
            raise _local(exc) from None
    finally:
        os.close(fd)
    target = Path(args.path) / skill_format.SIGNATURE_FILE
    if args.json:
        print(
            json.dumps({"name": name, "signature": str(target), "key_id": key.public_key().id_hex})
        )
    else:
        print(f"signed skill {name} with key {key.public_key().id_hex}: wrote {target}")
    return exitcodes.OK


def cmd_verify(args: argparse.Namespace, _stub: Stub) -> int:
    skill = _signed(args.path)
    try:
        public = read_file(args.pubkey, SMALL_FILE_BYTES).decode(errors="replace")
        trusted = {args.pubkey: public}
        signer = skill_format.verify(skill, trusted)
    except (IronclawError, OSError) as exc:
        raise _local(exc) from None
    if args.json:
        print(json.dumps({"name": skill.name, "signer": signer, "valid": True}))
    else:
        print(f"skill {skill.name} {skill.version}: signature by {signer} verified")
    return exitcodes.OK
