"""ironctl: the operator's command line. It speaks only gRPC to ironclawd's admin socket.

Start-up is most of what a command costs (issue 17: ``ironctl status`` took 131 ms, 114 of them
importing every command's code, grpc, protobuf and rich). So building the parser imports only
argparse and ironctl's parser modules (ctl/parsers/); each command names its handler as
"MODULE:FUNCTION" and only that module is imported, with grpc (ctl/rpc.py), once the command
line is parsed. ``--help``, usage errors and ``--version`` load neither grpc nor protobuf.
"""

from __future__ import annotations

import argparse
import gettext
import importlib
import io
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ironclawd import __version__
from ironclawd.ctl import argtypes, exitcodes
from ironclawd.ctl.common import CtlError, Parser, UsageError, add_command, common_options
from ironclawd.ctl.parsers import (
    agents,
    api,
    audit,
    changes,
    channels,
    chat,
    containment,
    mcp,
    packages,
    sessions,
    skills,
    wiring,
)

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub

# = str(ironclawd.paths.ADMIN_SOCKET), which a unit test checks: paths imports pathlib (~5 ms).
DEFAULT_SOCKET = "/run/ironclaw/admin.sock"
DEBUG_ENV = "IRONCTL_DEBUG"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """ironctl's argument tree: all of it (``--help``, docs, completion), or, given a top-level
    command, a tree holding that command's group but perhaps not the others (a run needs only
    its own, and argparse's ~120 parsers took ~10 ms to build: gettext looks up a catalog on
    disk for every parser). For such a command both trees parse every command line alike."""
    socket_default = os.environ.get("IRONCLAW_ADMIN_SOCKET", DEFAULT_SOCKET)
    parser = Parser(
        prog="ironctl",
        description="Operate ironclawd: health, sandboxed agent sessions, changes, audit.",
        epilog="examples:\n  ironctl doctor\n  ironctl session create --agent demo\n"
        "  ironctl status --json\n  ironctl containment verify REPORT.json --pubkey KEY.pub\n\n"
        + exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_options(top=True, socket_default=socket_default)],
    )
    parser.add_argument("--version", action="version", version=f"ironctl {__version__}",
                        help="print ironctl's version and exit")  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for names, register in _GROUPS:
        if command is None or command in names:
            register(sub)
    return parser


def _register_health(sub: Any) -> None:
    add_command(
        sub,
        "status",
        "show the daemon's version, uptime, warm pool and who you are to it",
        "ironctl status\n  ironctl status --json | jq .caller.uid",
        "health:cmd_status",
    )
    doctor = add_command(
        sub,
        "doctor",
        "check this host can run sandboxes; each failure comes with a fix",
        "ironctl doctor                 # table of checks with fix hints\n"
        "  ironctl doctor --json          # for scripts; exit 0 only if required checks pass\n"
        "  ironctl doctor --only runsc    # checks whose name starts with 'runsc'",
        "health:cmd_doctor",
    )
    doctor.add_argument("--only", default="", help="only checks whose name has this prefix")


def _register_sessions(sub: Any) -> None:
    chat.register(sub, sessions.register(sub))  # send, chat, and session verify


# The top-level commands each registration adds, in the order --help lists them.
_GROUPS: tuple[tuple[tuple[str, ...], Callable[[Any], None]], ...] = (
    (("status", "doctor"), _register_health),
    (("session", "send", "chat"), _register_sessions),
    (("change",), changes.register),
    (("agent",), agents.register),
    (("audit",), audit.register),
    (("containment",), containment.register),
    (("skill",), skills.register),
    (("mcp",), mcp.register),
    (("package",), packages.register),
    (("wiring", "permissions"), wiring.register),
    (("channel",), channels.register),
    (("api",), api.register),
)
COMMANDS = frozenset(name for names, _ in _GROUPS for name in names)
# Top-level options as they may come before the command word (common.common_options).
_FLAGS = frozenset({"--json", "--no-legend"})
_WITH_VALUE = frozenset({"--socket", "--timeout"})


def command_of(argv: list[str]) -> str | None:
    """The command word of a command line when it is certain without argparse: the first word
    that is not one of the top-level options spelled out in full (``--socket S``,
    ``--timeout=T``, ``--json``, ...), if it names a command. Anything else (``-h``, an
    abbreviated option, a typo) gives None: the whole tree parses it, and says what is wrong."""
    words = iter(argv)
    for word in words:
        if word in _FLAGS or word.startswith(tuple(f"{o}=" for o in _WITH_VALUE)):
            continue
        if word in _WITH_VALUE:
            next(words, None)
            continue
        return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one ironctl command. Every outcome is an exit code and at most a one-line error
    (JSON under --json): never a traceback, unless IRONCTL_DEBUG=1 asks for one."""
    args = sys.argv[1:] if argv is None else list(argv)
    as_json = _wants_json(args)
    _tolerant_streams()
    remember_catalog_lookups()
    try:
        try:
            code = _run(args, as_json)
            sys.stdout.flush()  # here, not at exit, so a closed pipe is seen and handled
        except KeyboardInterrupt:
            return exitcodes.INTERRUPTED
        except BrokenPipeError:
            raise
        except Exception as exc:  # last resort: any bug is one line, not a traceback
            return _report(as_json, _internal(exc))
        else:
            return code
    except BrokenPipeError:
        # The reader went away (ironctl ... | head -1): stop quietly, as a program killed by
        # SIGPIPE would, and let nothing more reach the closed pipe at interpreter exit.
        _stdout_to_devnull()
        return exitcodes.PIPE_CLOSED


def remember_catalog_lookups() -> None:
    """Look each gettext catalog up on disk once in this process, not once per string.

    argparse passes every string it shows through gettext, and ``gettext.find`` then probes the
    locale directories again for each candidate language: 49 lookups for one command's parser,
    each with the same answer, took 1.0-1.8 ms of ~3 (``build_parser("chat")``, medians of 20,
    LANG=C.UTF-8 and en_US.UTF-8). Nothing ironctl runs changes the locale or the catalogs.
    Translations still apply, and a caller's explicit ``languages`` list is not remembered."""
    original = gettext.find
    if getattr(original, "ironctl_remembers", False):
        return
    found: dict[tuple[str, str | None, bool], Any] = {}

    def find(
        domain: str, localedir: str | None = None, languages: Any = None, all: bool = False
    ) -> Any:
        if languages is not None:
            return original(domain, localedir, languages, all)
        key = (domain, localedir, all)
        if key not in found:
            found[key] = original(domain, localedir, None, all)
        return found[key]

    find.ironctl_remembers = True  # type: ignore[attr-defined]
    gettext.find = find  # type: ignore[assignment]


def _run(argv: list[str], as_json: bool) -> int:
    try:
        problem = argtypes.undecodable(argv)
        if problem is not None:
            raise UsageError(f"ironctl: {problem}")
        args = build_parser(command_of(argv)).parse_args(argv)
    except CtlError as err:
        return _report(as_json, err)
    except SystemExit as exc:  # --help was printed
        return exc.code if isinstance(exc.code, int) else exitcodes.USAGE
    from ironclawd.ctl import rpc  # noqa: PLC0415 (grpc: only once a command is to run)

    try:
        return rpc.run(args, handler_of(args.handler))
    except CtlError as err:
        return _report(args.json, err, args.command)


def handler_of(name: str) -> Callable[[argparse.Namespace, Stub], int]:
    """The function a command's "MODULE:FUNCTION" names, its module imported now."""
    module, _, function = name.partition(":")
    handler: Callable[[argparse.Namespace, Stub], int] = getattr(
        importlib.import_module(f"ironclawd.ctl.{module}"), function
    )
    return handler


def _wants_json(argv: list[str]) -> bool:
    # Before parsing (a usage error has no parsed arguments): --json or an abbreviation of it
    # that argparse would accept, anywhere before a "--".
    words = argv[: argv.index("--")] if "--" in argv else argv
    return any(len(w) >= 3 and "--json".startswith(w) for w in words)


def _report(as_json: bool, err: CtlError, command: str = "") -> int:
    message = argtypes.shown_message(str(err))
    if as_json:
        doc = {"error": {"code": err.code, "message": message, "exit": err.exit_code}}
        print(json.dumps(doc))
    else:
        prefix = f"ironctl: {command}: " if command else ""
        print(f"{prefix}{message}", file=sys.stderr)
    return err.exit_code


def _internal(exc: Exception) -> CtlError:
    if os.environ.get(DEBUG_ENV) == "1":
        import traceback  # noqa: PLC0415 (only for this)

        traceback.print_exc()
        hint = ""
    else:
        hint = f" (set {DEBUG_ENV}=1 for a traceback)"
    return CtlError(
        "IRONCTL_INTERNAL",
        exitcodes.INTERNAL,
        f"ironctl: internal error in ironctl: {type(exc).__name__}: {exc}{hint}",
    )


def _tolerant_streams() -> None:
    # Text that cannot be encoded for this terminal (a C locale, say) is printed escaped.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file (a test's capture): nothing will be flushed to a pipe


if __name__ == "__main__":
    sys.exit(main())
