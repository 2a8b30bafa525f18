"""ironctl exit codes (documented in ``ironctl --help`` and docs/ironctl.md). Which daemon status
ends in which code is ``errors.EXIT_CODE`` (the one table, beside the error tree)."""

from __future__ import annotations

from ironclawd.errors import EXIT_CODE

OK = 0
FAILED = 1  # a check failed, or the operation did not succeed
USAGE = 2  # bad command line (argparse)
UNAVAILABLE = 3  # daemon not reachable
PERMISSION = 4  # not allowed (not in ironclaw-admin, or policy)
NOT_FOUND = 5
CONFLICT = 6
INVALID = 7  # the daemon refused an argument
TIMEOUT = 8
INTERNAL = 9  # in the daemon, or in ironctl itself
# ironctl containment verify (no daemon involved):
BAD_SIGNATURE = 10  # signature missing, malformed, by another key, or not matching the report
# (also ironctl skill verify/add: a skill's files do not match its signature)
MALFORMED_REPORT = 11  # the report is missing, not JSON, or not ironclaw-containment-report/1
ESCAPED = 12  # a validly signed report in which an attack escaped
INCONCLUSIVE = 13  # an attack errored, or the negative control saw no escape
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
PIPE_CLOSED = 141  # the reader of standard output went away (128 + SIGPIPE, as a shell shows)

HELP = """exit codes:
  0  success (doctor: every required check passed)
  1  failure (doctor: a required check failed; also a rate limit, budget or the daemon's
     disk space exhausted: try again later)
  2  bad command line (also: an argument that is not UTF-8, a number out of range)
  3  daemon not reachable (is ironclawd running? systemctl status ironclawd)
  4  permission denied (join group ironclaw-admin, then log in again; or a policy refused
     it: an agent's permissions or approver group, --by naming someone else, skill verify
     with a key that did not sign)
  5  not found      6  conflict with current state      7  invalid argument (or input)
  8  timed out      9  internal error (in the daemon, or in ironctl)
  containment verify, skill verify: 10 bad or missing signature   11 malformed report
                      12 an attack escaped          13 inconclusive (an attack errored, or
                         the negative control saw no escape)
  130 interrupted (Ctrl-C)    141 standard output was closed early (| head)"""


def for_status(code: str) -> int:
    """The exit code for a daemon's gRPC status, by its name (``NOT_FOUND``): the one table in
    ``ironclawd/errors.py``."""
    return EXIT_CODE.get(code, INTERNAL)
