"""Runs one ironctl command on a pseudo-terminal (stdin, stdout and stderr all the terminal, as
an operator's shell gives them) inside the test's systemd, answering prompts as told.

Usage: ctl_pty_driver.py JSON, where JSON is {"argv": [...], "env": {...}, "answers":
[[prompt, reply], ...]}: each reply is typed once the output so far ends a line containing its
prompt. Prints {"rc": exit status, "out": everything the terminal showed} as JSON.
"""

from __future__ import annotations

import json
import os
import pty
import select
import sys
import time

LIMIT = 120.0  # seconds; hitting it is reported as rc -1


def main() -> int:
    spec = json.loads(sys.argv[1])
    env = {**os.environ, **spec.get("env", {})}
    answers: list[list[str]] = list(spec.get("answers", []))
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(spec["argv"][0], spec["argv"], env)
    shown = b""
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal (it exited)
            break
        if not chunk:
            break
        shown += chunk
        if answers and answers[0][0].encode() in shown.rsplit(b"\n", 1)[-1]:
            os.write(fd, answers.pop(0)[1].encode())
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status) if time.monotonic() < deadline else -1
    print(json.dumps({"rc": rc, "out": shown.decode(errors="replace")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
