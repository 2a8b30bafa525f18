"""protobuf's pure-Python message module stays out of ironctl and the daemon until something uses
it (ironclawd/protobuf_defer.py), and protobuf works the same with the stand-in, on either of
its backends. Each case runs in a fresh interpreter: the stand-in must be in place before
protobuf is first imported, which in this test process happened long ago."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAME = "google.protobuf.internal.python_message"

# Messages of the admin API built, written and read back: what ironctl and the daemon do.
ROUND_TRIP = """
from ironclaw.admin.v1 import admin_pb2
status = admin_pb2.GetStatusResponse(version="v", pool=[admin_pb2.PoolRow(agent="a", ready=2)])
back = admin_pb2.GetStatusResponse.FromString(status.SerializeToString())
assert back == status and back.pool[0].ready == 2, back
"""


def run(code: str, **env: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter (isolated, as test_daemon_imports.py's: the venv's
    path entry finds the checkout); what it printed last, as JSON."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
        env={**os.environ, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


def state() -> str:
    """Code printing whether the stand-in still stands, and which protobuf backend runs."""
    return f"""
import json, sys
from google.protobuf.internal import api_implementation
module = sys.modules[{NAME!r}]
print(json.dumps({{"deferred": type(module).__name__ == "DeferredModule",
                  "text_format": "google.protobuf.text_format" in sys.modules,
                  "backend": api_implementation.Type()}}))
"""


@pytest.mark.parametrize(
    "imports",
    [
        "import ironclawd.ctl.rpc",  # every ironctl command that talks to the daemon
        "import ironclawd.daemon, ironclawd.wiring",  # the daemon's start, up to READY
    ],
)
def test_ironctl_and_the_daemon_start_without_the_pure_python_messages(imports: str) -> None:
    result = run(f"import ironclawd\n{imports}\n{ROUND_TRIP}\n{state()}")
    assert result == {"deferred": True, "text_format": False, "backend": "upb"}


def test_the_first_use_loads_the_real_module_for_every_holder_of_the_stand_in() -> None:
    result = run(f"""
import json, sys
import ironclawd
{ROUND_TRIP}
from google.protobuf import descriptor_pool
held = descriptor_pool.python_message  # imported by protobuf while the stand-in stood
assert type(held).__name__ == "DeferredModule"
from google.protobuf.internal import python_message  # now: the stand-in, used
kind = python_message.GeneratedProtocolMessageType
real = sys.modules[{NAME!r}]
print(json.dumps({{
    "real_in_sys_modules": type(real).__name__ == "module",
    "same_class": kind is real.GeneratedProtocolMessageType,
    "holder_sees_it": held._AttachFieldHelpers is real._AttachFieldHelpers,
    # it took the real module's names: no more forwarding through __getattr__
    "holder_has_them": vars(held)["_AttachFieldHelpers"] is real._AttachFieldHelpers,
    "file": held.__file__ == real.__file__,
}}))
""")
    assert result == {
        "real_in_sys_modules": True, "same_class": True, "holder_sees_it": True,
        "holder_has_them": True, "file": True,
    }  # fmt: skip


def test_the_pure_python_backend_works_with_the_stand_in() -> None:
    # protobuf's own switch: the pure-Python implementation uses the module from the start.
    result = run(
        f"import ironclawd\n{ROUND_TRIP}\n{state()}",
        PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python",
    )
    assert result == {"deferred": False, "text_format": True, "backend": "python"}


def test_a_module_already_imported_is_never_replaced() -> None:
    result = run(f"""
import json, sys
from google.protobuf import descriptor_pool  # protobuf first: the real module is loaded
from ironclawd import protobuf_defer
print(json.dumps({{"installed": protobuf_defer.defer_python_message(),
                  "kind": type(sys.modules[{NAME!r}]).__name__}}))
""")
    assert result == {"installed": False, "kind": "module"}
