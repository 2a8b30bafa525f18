"""What an ironctl command imports (issue 17: ``ironctl status`` took 131 ms, 114 of them importing
every command's code, grpc, protobuf and rich). Each command below runs in-process against the
stub daemon with ironctl's modules imported afresh; every import statement ironctl's own code
executes is recorded. A command may load only its own handler module, and none of the heavy
libraries the plain path does without; building the parser loads neither grpc nor protobuf.
No timings here: benchmarks measure them (docs/development.md)."""

from __future__ import annotations

import builtins
import importlib
import io
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ironclawd import paths
from ironclawd.formats import skill
from tests.unit import ctl_world as world

SID = world.SESSION.sid
# What every command that talks to the daemon loads of ironctl (ctl/main.py's docstring).
CORE = {
    "ironclawd.ctl.cli", "ironclawd.ctl.main", "ironclawd.ctl.common", "ironclawd.ctl.argtypes",
    "ironclawd.ctl.exitcodes", "ironclawd.ctl.text", "ironclawd.ctl.parsers",
    "ironclawd.ctl.rpc", "ironclawd.ctl.wire", "ironclawd.ctl.shapes", "ironclawd.ctl.render",
}  # fmt: skip
# Each command, and the handler module it may load besides.
COMMANDS = {
    "status": (["status"], "health"),
    "status --json": (["status", "--json"], "health"),
    "send": (["send", SID, "hello"], "chat"),
    "session stop": (["session", "stop", SID], "sessions"),
    "session rm": (["session", "rm", SID], "sessions"),
    "session list": (["session", "list"], "sessions"),
}
# Never on these paths, whatever imported them before: rich beyond its cell widths (tables and
# colour only on a terminal), the other commands' libraries, pathlib (ironclawd.paths), grpcio.
FORBIDDEN = (
    "rich.console", "rich.table", "rich.text", "rich.markup", "yaml", "cryptography",
    "grpc_reflection", "google.protobuf.json_format", "pathlib", "ironclawd.paths",
    "ironclawd.formats", "tempfile", "subprocess", "shlex", "difflib", "dataclasses",
    "uuid",  # (it imports platform)
    "shutil",  # (argparse, for the terminal width: common.terminal_columns)
    "grpc",  # (grpcio's client took ~35 ms of every command; ctl/wire.py speaks gRPC with h2)
)  # fmt: skip


class Recorder:
    """Modules ironctl's own code imports: every import statement ironclawd.ctl.* (or argparse,
    on ironctl's behalf) runs, of a module found now or loaded long before (``from M import N``
    also records ``M.N``)."""

    def __init__(self) -> None:
        self.imported: set[str] = set()

    def imports(self, name: str, globals_: Any, fromlist: Any, level: int) -> None:
        importer = (globals_ or {}).get("__name__", "")
        if not importer.startswith(("ironclawd.ctl", "argparse")):
            return
        assert level == 0, f"{importer}: a relative import ({name})"
        self.imported.add(name)
        self.imported.update(f"{name}.{item}" for item in fromlist or () if item != "*")

    def heavy(self) -> list[str]:
        return sorted(n for n in self.imported if n.startswith(FORBIDDEN))


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """ironctl's modules unloaded and every import recorded. Afterwards the modules loaded
    before are back (with the package's attributes) and those loaded here gone, so that other
    tests keep working on the module objects they imported."""
    monkeypatch.setattr("sys.stdout", io.StringIO())  # not a terminal: the plain path
    package = importlib.import_module("ironclawd.ctl")
    before = {n for n in sys.modules if n.startswith("ironclawd.ctl.")}
    for name in before:
        monkeypatch.delitem(sys.modules, name)
        if name.count(".") == 2:
            monkeypatch.delattr(package, name.rsplit(".", 1)[1], raising=False)
    recorder = Recorder()
    real = builtins.__import__

    def recording(
        name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        recorder.imports(name, globals_, fromlist, level)
        module = real(name, globals_, locals_, fromlist, level)
        rpc = sys.modules.get("ironclawd.ctl.rpc")  # this fresh copy answers from the stub daemon
        if rpc is not None and getattr(rpc, "stub_for", None) is not world.Stub:
            rpc.stub_for = world.Stub  # type: ignore[attr-defined]
        return module

    monkeypatch.setattr(builtins, "__import__", recording)
    yield recorder
    for name in [n for n in sys.modules if n.startswith("ironclawd.ctl.")]:
        if name not in before:  # (monkeypatch restores the others after this)
            del sys.modules[name]
            if name.count(".") == 2 and hasattr(package, name.rsplit(".", 1)[1]):
                delattr(package, name.rsplit(".", 1)[1])


def _run(argv: list[str]) -> int:
    cli = importlib.import_module("ironclawd.ctl.cli")
    code: int = cli.main(argv)
    return code


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_loads_only_its_own_handler(fresh: Recorder, command: str) -> None:
    argv, handler = COMMANDS[command]
    assert _run(argv) == 0
    loaded = {n for n in sys.modules if n.startswith("ironclawd.ctl.")}
    parsers = {n for n in loaded if n.startswith("ironclawd.ctl.parsers.")}
    assert loaded - parsers == {*CORE, f"ironclawd.ctl.{handler}"}, (
        "a command imports its handler module only (ironctl status must not grow back: "
        "issue 17); a new module on this path belongs in CORE only if every command needs it"
    )
    assert fresh.heavy() == []
    assert "h2.connection" in fresh.imported  # (the recorder works)


@pytest.mark.parametrize("argv", [["status", "--help"], ["--help"], ["session", "frobnicate"]])
def test_parsing_alone_loads_no_grpc_protobuf_or_rich(fresh: Recorder, argv: list[str]) -> None:
    assert _run(argv) in (0, 2)
    loaded = {n for n in sys.modules if n.startswith("ironclawd.ctl.")}
    assert not loaded & {"ironclawd.ctl.rpc", "ironclawd.ctl.render", "ironclawd.ctl.shapes"}
    assert not {n for n in fresh.imported if n.startswith(("grpc", "google", "ironclaw.", "rich"))}
    assert fresh.heavy() == []


def test_the_constants_ironctl_keeps_to_stay_light_are_the_real_ones() -> None:
    main = importlib.import_module("ironclawd.ctl.main")
    skills = importlib.import_module("ironclawd.ctl.parsers.skills")
    assert str(paths.ADMIN_SOCKET) == main.DEFAULT_SOCKET
    assert skill.SIGNATURE_FILE == skills.SIGNATURE_FILE


@pytest.mark.parametrize("columns", [None, "123", "0", "-5", "wide"])
def test_the_help_width_is_shutils(monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    common = importlib.import_module("ironclawd.ctl.common")
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert common.terminal_columns() == shutil.get_terminal_size().columns
