"""Runs ironctl cases inside the test's systemd, several at once, and reports what each printed.

Input (stdin, JSON): a list of {"argv": [hex bytes...], "stdin": hex, "mode": pipe|closed|pty}.
Output (stdout, JSON): per case {"rc", "out", "err"} with out/err base64. Modes: ``pipe``
captures stdout and stderr; ``closed`` gives stdout a pipe whose read end is already closed (as
``| head -c0`` would, but without a race); ``pty`` puts stdout and stderr on a pseudo-terminal
(merged, as a terminal shows them) and feeds stdin from a pipe.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

IRONCTL = sys.argv[1]
LIMIT = 60.0  # seconds for one case; hitting it is reported as rc -1


def run(case: dict[str, Any]) -> dict[str, Any]:
    argv = [os.fsencode(IRONCTL), *(bytes.fromhex(a) for a in case["argv"])]
    data = bytes.fromhex(case["stdin"])
    out = err = b""
    try:
        if case["mode"] == "pipe":
            proc = subprocess.run(argv, input=data, capture_output=True, timeout=LIMIT, check=False)
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        elif case["mode"] == "closed":
            read_end, write_end = os.pipe()
            os.close(read_end)
            try:
                proc = subprocess.run(
                    argv, input=data, stdout=write_end, stderr=subprocess.PIPE, timeout=LIMIT,
                    check=False,
                )  # fmt: skip
            finally:
                os.close(write_end)
            rc, err = proc.returncode, proc.stderr
        else:
            rc, out = _on_pty(argv, data)
    except subprocess.TimeoutExpired:
        rc = -1
    print(f"rc {rc} {case['mode']} {[a[:40] for a in argv[1:]]}", file=sys.stderr, flush=True)
    return {"rc": rc, "out": base64.b64encode(out).decode(), "err": base64.b64encode(err).decode()}


def _on_pty(argv: list[bytes], data: bytes) -> tuple[int, bytes]:
    master, slave = os.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=slave, stderr=slave)
    os.close(slave)
    assert proc.stdin is not None
    proc.stdin.write(data)
    proc.stdin.close()
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=LIMIT), b"".join(chunks)


def main() -> None:
    cases = json.load(sys.stdin)
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(run, cases))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
