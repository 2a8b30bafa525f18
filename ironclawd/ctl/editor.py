"""Editing text in the operator's ``$EDITOR``, like ``kubectl edit``: a private temporary file
holding the current text; unchanged or emptied content aborts, nothing is sent."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import tempfile

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import CtlError


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


def edit(original: str, what: str, suffix: str = ".txt") -> str:
    """Open ``original`` in the operator's editor; return the edited text (see edited_text)."""
    command = editor_command(os.environ)
    written = original if original.endswith("\n") or not original else original + "\n"
    # mkstemp creates the file 0600, owned by the operator: the text may be private.
    fd, path = tempfile.mkstemp(prefix="ironctl-", suffix=suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(written)
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
        with open(path, encoding="utf-8", errors="strict") as handle:
            try:
                edited = handle.read()
            except UnicodeDecodeError as exc:
                raise CtlError("INVALID_INPUT", exitcodes.INVALID,
                               f"the edited {what} is not UTF-8 text (byte {exc.start}): "
                               "nothing submitted") from None  # fmt: skip
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return edited_text(original, written, edited, what)


def keep(text: str, suffix: str = ".txt") -> str:
    """Write ``text`` to a new private file (0600, as mkstemp makes it) and return its path:
    an edit that could not be submitted is not lost."""
    fd, path = tempfile.mkstemp(prefix="ironctl-", suffix=suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
