"""IronClaw host daemon: gVisor sandboxes for AI agents under systemd."""

import os

from ironclawd.protobuf_defer import defer_python_message

__version__ = "0.2.0"

# Before any generated *_pb2 module: protobuf's pure-Python message module is imported only if
# something uses it (ironclawd/protobuf_defer.py; ~6 ms of every ironctl, ~10 ms of a start).
defer_python_message()

# Before any dataclass: ironclawd.service names a file for the compiled dataclass methods
# (ironclawd/dataclass_cache.py; ~40 ms of every start). Elsewhere they compile as usual.
if os.environ.get("IRONCLAW_DATACLASS_CACHE"):
    from ironclawd.dataclass_cache import install_from_environment

    install_from_environment()
