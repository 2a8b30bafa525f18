"""What the daemon imports before READY (issue 17: restart to READY is mostly imports). A fresh
interpreter does what ``ironclawd`` does before it serves: ``daemon.main``'s stand-in for httpx's
command-line client, then ``ironclawd.wiring``. Libraries only some configurations or requests
use must load when first used, not at start. No timings here: benchmarks measure them."""

from __future__ import annotations

import json
import subprocess
import sys

# Each: the module, and where it is first needed instead.
LATER = {
    "mcp": "an MCP server is opened (host/mcp.py, host/mcp_remote.py)",
    "pydantic": "an MCP server is opened (the MCP SDK)",
    "anyio": "an MCP server is opened (the MCP SDK)",
    "httpx2": "a remote MCP server is opened (host/mcp_pinned.py)",
    "nio": "a [[channels]] table of type matrix (host/channel_adapters.py)",
    "aiohttp": "a [[channels]] table of type webhook (host/channel_adapters.py)",
    "pyroute2": "a netns is inspected (host/netns.py)",
    "click": "never: httpx's command-line client (daemon.without_httpx_cli)",
    "rich": "never: httpx's command-line client",
    "pygments": "never: httpx's command-line client",
    "yaml": "a skill's front matter is read (formats/skill.py)",
    "pystemd": "the first D-Bus call (host/systemd.py), after READY when nothing is adopted",
    "lxml": "the first D-Bus call (pystemd's object layer imports it)",
    "httpx": "the first model call or egress request (net/http.py)",
    "httpcore": "the first model call or egress request (through httpx)",
    "h11": "the first model call or egress request (through httpx)",
    "argparse": "ironclawd is given arguments (daemon.build_parser; systemd gives none)",
    "gettext": "ironclawd is given arguments (argparse imports it)",
}

# Modules of packages the start does load, but not these: the change model is first used after
# READY (Gateway.resume), and a start without it was ~12 ms shorter (docs/development.md).
LATER_MODULES = {
    "ironclawd.domain.changes": "a change is submitted, listed, decided or resumed (gateway)",
    "ironclawd.domain.kinds": "a change is parsed, or an MCP server probed or listed",
    "ironclawd.formats.skill": "a skill's signature is checked (services/host_checks.py)",
    "ironclawd.formats.minisign": "a skill's signature is checked (through formats/skill.py)",
    "cryptography.hazmat.primitives.asymmetric.ed25519": "a minisign signature is checked",
}

PROBE = """
import json, sys
from ironclawd.daemon import _parse_args, without_httpx_cli
_parse_args([])  # as systemd starts it: no argument
without_httpx_cli()
import ironclawd.wiring
# httpx._main is without_httpx_cli()'s stand-in, not httpx
print(json.dumps(sorted(m for m in sys.modules if m != "httpx._main")))
"""


def test_the_start_path_leaves_what_it_does_not_need() -> None:
    out = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], check=True, capture_output=True, text=True
    ).stdout
    modules = set(json.loads(out))
    loaded = {m.split(".")[0] for m in modules}
    assert "ironclawd" in loaded
    assert "grpc" in loaded  # the probe did import the start path
    early = {name: why for name, why in LATER.items() if name in loaded}
    assert not early, f"imported at the daemon's start, but needed only when: {early}"
    early_modules = {name: why for name, why in LATER_MODULES.items() if name in modules}
    assert not early_modules, f"imported at the daemon's start, but needed only: {early_modules}"
