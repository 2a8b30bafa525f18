"""Editing text in the operator's ``$EDITOR``, like ``kubectl edit``: a private temporary file
holding the current text; unchanged or emptied content aborts, nothing is sent. Once the
editor closed, the file is the edit: kept until what was written is submitted."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import CtlError
from ironclawd.ctl.text import visible


def on_terminal() -> bool:
    """An editor can run here: standard input and output are both terminals."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def editor_command(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """The editor to run, as argv: VISUAL, then EDITOR (either may carry arguments)."""
    for name in ("VISUAL", "EDITOR"):
        value = environ.get(name, "").strip()
        if value:
            return shlex.split(value)
    raise CtlError(
        "NO_EDITOR",
        exitcodes.USAGE,
        "no editor: set VISUAL or EDITOR (for example EDITOR=nano), or give the text on the "
        "command line",
    )


def edited_text(original: str, written: str, edited: str, what: str) -> str:
    """What to send after an edit: ``edited`` minus the final newline added to ``original``
    when it was written out; an aborting CtlError if it is empty or unchanged."""
    text = edited
    if written != original and text.endswith("\n"):
        text = text[:-1]
    if not text.strip():
        raise CtlError("EDIT_ABORTED", exitcodes.FAILED, f"{what} is empty: nothing submitted")
    if text == original:
        raise CtlError("EDIT_ABORTED", exitcodes.FAILED, f"{what} unchanged: nothing submitted")
    return text


@dataclass(frozen=True)
class Edit:
    """What the operator wrote, and the private file (0600) it is in: kept until the caller
    removes it (``discard``) once the text is submitted, so that nothing after the editor
    closed (a refusal, a daemon gone, Ctrl-C) loses the edit."""

    text: str
    path: str


def edit(original: str, what: str, suffix: str = ".txt") -> Edit:
    """Open ``original`` in the operator's editor; the edited text (see edited_text) and its
    file. The file is removed when there is nothing to keep: the editor failed or was
    interrupted, the text is empty, unchanged or not UTF-8."""
    command = editor_command(os.environ)
    written = original if original.endswith("\n") or not original else original + "\n"
    # mkstemp creates the file 0600, owned by the operator: the text may be private.
    fd, path = tempfile.mkstemp(prefix="ironctl-", suffix=suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(written)
        _run(command, path)
    except BaseException:
        discard(path)
        raise
    try:  # the editor closed: from here on the file is the edit, kept unless there is none
        edited = _read_private(path)
        return Edit(edited_text(original, written, edited.decode("utf-8"), what), path)
    except UnicodeDecodeError as exc:
        discard(path)
        raise CtlError("INVALID_INPUT", exitcodes.INVALID,
                       f"the edited {what} is not UTF-8 text (byte {exc.start}): nothing "
                       "submitted") from None  # fmt: skip
    except CtlError:
        discard(path)
        raise
    except KeyboardInterrupt:
        interrupted(f"nothing submitted: {kept(path)}")
        raise


def _run(command: list[str], path: str) -> None:
    try:
        status = subprocess.run([*command, path], check=False).returncode
    except OSError as exc:
        raise CtlError("EDITOR_FAILED", exitcodes.FAILED,
                       f"running editor {command[0]}: {exc.strerror}") from None  # fmt: skip
    if status != 0:
        raise CtlError(
            "EDITOR_FAILED",
            exitcodes.FAILED,
            f"editor {command[0]} exited with status {status}: nothing submitted",
        )


def _read_private(path: str) -> bytes:
    """The edited file's bytes; the file made 0600 again, should the editor have written a
    new one with other permissions: it may be kept for days, and the text may be private."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        os.fchmod(fd, 0o600)
        return handle.read()


def kept(path: str) -> str:
    """What the operator is told of an edit kept in ``path``."""
    return f"your text is kept in {path} (--persona-file {path})"


def interrupted(what: str) -> None:
    """Ctrl-C came after the editor closed: say where the edit is (main() ends quietly)."""
    print(f"\nironctl: interrupted: {visible(what)}", file=sys.stderr, flush=True)


def discard(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# The names mkstemp gives ``edit``'s files: its prefix, 8 of [a-z0-9_], the suffix.
_KEPT_NAME = re.compile(r"ironctl-[a-z0-9_]{8}\.md")


def forget_kept(path: str, submitted: bytes) -> bool:
    """Remove ``path`` if it is a file an edit was kept in and still holds ``submitted``, the
    text just submitted from it (--persona-file): the pending change holds it now, and a
    private text would otherwise stay in the temporary directory. Only what ``edit`` makes
    there is taken for one: its name, this user's, 0600, one link. Anything else is the
    operator's own file, left alone, as is a kept file changed since it was read."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        if not _KEPT_NAME.fullmatch(name) or not os.path.samefile(directory, tempfile.gettempdir()):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            held = os.fstat(fd)
            if not (stat.S_ISREG(held.st_mode) and held.st_uid == os.geteuid()
                    and stat.S_IMODE(held.st_mode) == 0o600 and held.st_nlink == 1
                    and handle.read(len(submitted) + 1) == submitted):  # fmt: skip
                return False
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            return False
        os.unlink(path)
    except OSError:
        return False
    return True
