"""The daemon's dataclass methods compiled once, not at every start.

Python 3.11's ``@dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``,
``__hash__`` (and, frozen, ``__setattr__``/``__delattr__``) as source text and compiles each
with ``exec``: importing the daemon makes ~120 classes and ~650 compiles, ~38 ms of its ~160 ms
of imports before READY (issue 17, docs/development.md). That text is the same at every start.
So, like a ``.pyc`` for those methods, the compiled code is kept in one file and the next start
takes it from there (~17 us a method to unmarshal against ~58 to compile).

How: ``install`` puts :meth:`CodeCache.exec` where the ``dataclasses`` module finds ``exec`` (a
module global ahead of the builtin). Given source text, it looks the exact text up, compiles it
on a miss as ``exec`` would (no ``__future__`` flags inherited), and runs the code with the
globals and locals it was given; anything else goes to the builtin unchanged. The result is the
same code object ``exec`` would compile from that text: only where the compile happens moves.

The file is trusted like the ``.pyc`` files under ``/usr/lib``: it is taken only when it is a
regular file (not a symlink) owned by this process's user and writable by nobody else, starts
with this interpreter's bytecode magic number, matches its checksum, and holds a mapping of text
to code objects. Any
other file is ignored (``CodeCache.problem`` says why) and rewritten. ``ironclawd.service`` names
it (``IRONCLAW_DATACLASS_CACHE``, under ``CacheDirectory=``, root-only); ``ironclawd/__init__``
installs it only then, so ``ironctl`` and tests compile as usual. ``pending`` then ``write``
keep the entries this process used, only after a miss, atomically, mode 0600: the daemon takes
them at READY and writes them in the background.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import marshal
import os
import stat
import types
import zlib
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Any

ENV = "IRONCLAW_DATACLASS_CACHE"
HEADER = b"ironclaw-dataclass-code\n" + MAGIC_NUMBER  # then the CRC-32 of the rest, 4 bytes LE
MAX_BYTES = 16 * 1024 * 1024  # ~0.7 MB today; a file past this is not ours


class CodeCache:
    """Source text of dataclass methods -> code compiled from it, loaded from and saved to
    ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problem = ""  # why the file was not used ("" when it was, or there was none)
        self.hits = 0
        self.misses = 0
        self._codes: dict[str, types.CodeType] = {}
        self._used: set[str] = set()

    def load(self) -> None:
        """Take the file's entries if it can be trusted (see the module's docstring)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            self.problem = f"cannot open: {exc.strerror or exc}"
            return
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self.problem = "not a regular file"
            elif info.st_uid != os.geteuid():
                self.problem = f"owned by uid {info.st_uid}, not {os.geteuid()}"
            elif info.st_mode & 0o022:
                self.problem = f"writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
            elif info.st_size > MAX_BYTES:
                self.problem = f"{info.st_size} bytes, over {MAX_BYTES}"
            else:
                with os.fdopen(fd, "rb", closefd=False) as file:
                    self._codes, self.problem = _parse(file.read(MAX_BYTES + 1))
        finally:
            os.close(fd)

    def exec(self, source: Any, globals: Any = None, locals: Any = None) -> None:
        """``exec`` as the ``dataclasses`` module calls it, with the compile cached."""
        if isinstance(source, str):
            code = self._codes.get(source)
            if code is None:
                # As exec(source) compiles it: "<string>", no __future__ flags of this module.
                code = compile(source, "<string>", "exec", dont_inherit=True)
                self._codes[source] = code
                self.misses += 1
            else:
                self.hits += 1
            self._used.add(source)
            source = code
        builtins.exec(source, globals, locals)  # noqa: S102 (what dataclasses runs: its own text)

    def pending(self) -> list[str] | None:
        """What to write now: the texts used so far if any of them was compiled here, else
        None. Taken at once (the daemon at READY), so what a start compiles later, after its
        work began, never decides whether the file is rewritten."""
        if not self.misses:
            return None
        self.misses = 0
        return list(self._used)  # one C-level copy: a thread may add entries meanwhile

    def write(self, texts: list[str]) -> None:
        """Write ``texts`` with their code, mode 0600; atomic: a reader sees the old file or
        the new one."""
        body = marshal.dumps({text: self._codes[text] for text in texts})
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # an earlier run's, cut short
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as file:
                file.write(HEADER + zlib.crc32(body).to_bytes(4, "little") + body)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def save(self) -> bool:
        """``write`` what is ``pending``, if anything; True when written."""
        texts = self.pending()
        if texts is None:
            return False
        self.write(texts)
        return True


def _parse(data: bytes) -> tuple[dict[str, types.CodeType], str]:
    """The entries of a file's bytes, or none and why not. The checksum keeps a file damaged on
    disk from being run: a code object unmarshalled from bad bytes can crash the interpreter,
    and the daemon would then crash at every start until someone removed the file."""
    if not data.startswith(HEADER):
        return {}, "not a cache of this Python's bytecode"
    body = data[len(HEADER) + 4 :]
    if data[len(HEADER) : len(HEADER) + 4] != zlib.crc32(body).to_bytes(4, "little"):
        return {}, "damaged (checksum mismatch)"
    try:
        # Trusted as a .pyc is: this user's own file, writable by nobody else (CodeCache.load).
        entries = marshal.loads(body)  # noqa: S302
    except (EOFError, ValueError, TypeError):
        return {}, "damaged (not marshal data)"
    if not isinstance(entries, dict) or not all(
        isinstance(k, str) and isinstance(v, types.CodeType) for k, v in entries.items()
    ):
        return {}, "not a mapping of text to code"
    return entries, ""


ACTIVE: CodeCache | None = None  # the installed cache, if any


def install(path: Path) -> CodeCache:
    """Load ``path`` and make the ``dataclasses`` module compile through it (once a process)."""
    global ACTIVE  # noqa: PLW0603 (one cache a process, like the import system's own)
    if ACTIVE is None:
        cache = CodeCache(path)
        cache.load()
        dataclasses.exec = cache.exec  # type: ignore[attr-defined]
        ACTIVE = cache
    return ACTIVE


def install_from_environment() -> CodeCache | None:
    """``install`` at the path ``$IRONCLAW_DATACLASS_CACHE`` names, when it names one."""
    path = os.environ.get(ENV, "")
    return install(Path(path)) if path else None
