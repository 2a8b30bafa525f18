"""Keep protobuf's pure-Python message module out of a process until something uses it.

Generated ``*_pb2`` modules import ``google.protobuf.descriptor_pool`` and
``google.protobuf.internal.builder``, and both import ``google.protobuf.internal.python_message``
at their top, with its own imports (``text_format``, the wire decoder and encoder, the
containers). That is the pure-Python implementation of messages: with the upb backend, which
protobuf picks wherever its wheel has one (this project's pin does), no generated code calls it.
Importing it cost 6-7 ms of every ``ironctl`` command (~23 of its ~58 ms went to protobuf) and
~10 ms of every daemon start (issue 17; docs/development.md).

``defer_python_message()`` puts a stand-in under that name in ``sys.modules`` before protobuf is
imported. The first time anything reads an attribute of it that it does not have (every real
use does: ``python_message.GeneratedProtocolMessageType`` with the pure-Python backend, or
``_AttachFieldHelpers`` with a pure-Python descriptor pool), the real module is imported in its
place and the stand-in takes its contents, so every holder of either sees the same names. So
protobuf works the same with either backend; only the import's time moves, to the first use.
``ironclawd/__init__.py`` calls it: the daemon and ``ironctl`` import ``ironclawd`` before any
generated module.
"""

from __future__ import annotations

import _thread
import sys
from types import ModuleType

NAME = "google.protobuf.internal.python_message"
_LOCK = _thread.RLock()  # reentrant: the real module's own imports may reach the stand-in


class DeferredModule(ModuleType):
    """Stands for a module not imported yet; imports it at the first read of a missing name."""

    def __getattr__(self, attr: str) -> object:
        return getattr(self.load(), attr)

    def load(self) -> ModuleType:
        """The real module, imported now if it was not yet (safe from any thread)."""
        import importlib  # noqa: PLC0415 (only when the module is used)

        with _LOCK:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
            # Modules that imported the stand-in keep it: give it the real module's names.
            for key, value in vars(real).items():
                if key not in ("__getattr__", "__class__"):
                    setattr(self, key, value)
            return real


def defer_python_message() -> bool:
    """Install the stand-in for protobuf's pure-Python message module, unless something has
    imported protobuf's message machinery already; whether it was installed."""
    if NAME in sys.modules or "google.protobuf.descriptor_pool" in sys.modules:
        return False
    sys.modules[NAME] = DeferredModule(NAME, "not imported yet (ironclawd/protobuf_defer.py)")
    return True
