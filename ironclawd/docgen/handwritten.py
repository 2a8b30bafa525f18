"""What the parsers cannot say: the hand-written parts of ironctl(1), ironclawd(8) and
docs/ironctl.md. Inline Markdown (`code`, *emphasis*); the renderers turn it into roff."""

from __future__ import annotations

from ironclawd.ctl import exitcodes as ec

CTL_SUMMARY = "operate ironclawd: health, sandboxed agent sessions, changes, audit"

CTL_DESCRIPTION = (
    "`ironctl` is the operator's command line; it speaks only gRPC to `/run/ironclaw/admin.sock`"
    " (override with `--socket` or `IRONCLAW_ADMIN_SOCKET`). You must be root or in group"
    " `ironclaw-admin`; the daemon learns who you are from the kernel (the socket's peer"
    " credentials), never from an argument.",
    "Every command has `--help` with examples and takes `--json` for scripts. Colour appears only"
    " on a terminal, and never with `NO_COLOR` set.",
    "Capabilities of an agent (persona, tools, packages, skills, MCP servers, wiring,"
    " permissions, egress) change only through a change that a human approves:"
    " `ironctl change pending`, `ironctl change show ID`, `ironctl change approve ID`.",
)

# Every exit code of ironctl/exitcodes.py, with what it means to the caller.
EXIT_STATUS: tuple[tuple[int, str], ...] = (
    (ec.OK, "success (`doctor`: every required check passed)"),
    (
        ec.FAILED,
        "failure (`doctor`: a required check failed); also `RESOURCE_EXHAUSTED`: a rate limit"
        " (model or egress requests, change submissions), a budget, or the daemon's disk space"
        " is exhausted: try again later",
    ),
    (
        ec.USAGE,
        "bad command line: unknown command or option, a number out of range, a `--timeout` that"
        " is not a finite number of seconds above 0 and at most 86400, an argument that is not"
        " UTF-8 text",
    ),
    (ec.UNAVAILABLE, "daemon not reachable (is ironclawd running? `systemctl status ironclawd`)"),
    (ec.PERMISSION, "permission denied (not in `ironclaw-admin`: join it, then log in again)"),
    (ec.NOT_FOUND, "not found"),
    (ec.CONFLICT, "conflict with the current state"),
    (
        ec.INVALID,
        "invalid argument (the daemon refused it), or standard input (`-` for `send`,"
        " `--payload`, `chat`) that is not UTF-8",
    ),
    (ec.TIMEOUT, "timed out"),
    (
        ec.INTERNAL,
        "internal error: in the daemon, or in ironctl itself (`IRONCTL_DEBUG=1` adds the"
        " traceback)",
    ),
    (
        ec.BAD_SIGNATURE,
        "`containment verify`: signature missing, malformed, by another key, or not matching the"
        " report; `skill verify`: the skill's files do not match its signature",
    ),
    (
        ec.MALFORMED_REPORT,
        "`containment verify`: report missing, not UTF-8 JSON, or not"
        " `ironclaw-containment-report/1`",
    ),
    (ec.ESCAPED, "`containment verify`: validly signed, and an attack escaped"),
    (
        ec.INCONCLUSIVE,
        "`containment verify`: validly signed, but inconclusive: an attack errored, or the"
        " negative control saw no escape",
    ),
    (ec.INTERRUPTED, "interrupted (Ctrl-C)"),
    (
        ec.PIPE_CLOSED,
        "standard output was closed before ironctl finished writing (`ironctl audit list |"
        " head -1`): it stops quietly, with the code a shell shows for a program ended by"
        ' SIGPIPE; under `set -o pipefail` treat 141 as "the reader had enough"',
    ),
)

CTL_ERRORS = (
    "With `--json`, errors are printed on standard output as one line,"
    ' `{"error": {"code": "PERMISSION_DENIED", "message": "...", "exit": 4}}`, and nothing on'
    " standard error. `code` is the daemon's gRPC status name, or one of ironctl's own: `USAGE`"
    " (exit 2; `--json` anywhere before `--`, or an abbreviation argparse accepts, is honoured"
    " even for usage errors), `INVALID_INPUT` (exit 7, standard input not UTF-8), `NO_REPLY`"
    " (exit 1, `send`/`chat`: the daemon closed the reply stream before the reply came; the"
    " message stays queued) and `IRONCTL_INTERNAL` (exit 9). Without `--json` an error is one"
    " line on standard error.",
    "ironctl never prints a Python traceback (unless `IRONCTL_DEBUG=1`). Values it echoes (a"
    " rejected argument, the daemon's error message) are shown with control, escape, bidi and"
    " zero-width characters escaped (`\\x1b`, `\\u202e`), bytes that are not UTF-8 as `\\xff`,"
    " and cut to a screenful: an argument or a daemon reply cannot restyle the terminal.",
)

CTL_ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("IRONCLAW_ADMIN_SOCKET", "the admin socket, when `--socket` is not given"),
    (
        "IRONCLAW_CONTAINMENT_PUBKEY",
        "`containment verify`: the trusted key, when `--pubkey` is not given",
    ),
    ("IRONCTL_DEBUG", "`1`: an internal error in ironctl prints its traceback"),
    ("NO_COLOR", "set (to anything): no colour, even on a terminal"),
)

CTL_FILES: tuple[tuple[str, str], ...] = (
    ("/run/ironclaw/admin.sock", "the daemon's admin socket (group `ironclaw-admin`, mode 0660)"),
    ("/etc/ironclaw/skills.d/trusted/*.pub", "minisign keys whose signatures a skill may carry"),
)

CTL_SEE_ALSO = ("ironclawd(8)", "ironclawd.toml(5)", "systemctl(1)", "journalctl(1)", "minisign(1)")

DAEMON_SUMMARY = "IronClaw host daemon: gVisor sandboxes for AI agents under systemd"

DAEMON_DESCRIPTION = (
    "`ironclawd` runs autonomous AI agents in gVisor (`runsc`) sandboxes, each session in a"
    " systemd unit of its own under `ironclaw.slice`, behind an egress broker and a gateway"
    " where every change to an agent's capabilities waits for a human decision. It is started"
    " by systemd (`ironclawd.service`, `Type=notify`) and operated with ironctl(1) over its"
    " admin socket.",
    "It reads `/etc/ironclaw/ironclawd.toml` (ironclawd.toml(5)) once at start: an unknown key or"
    " a bad value stops it before it binds anything, and the journal names the key."
    " `ironclawd --check-config` validates a file without starting anything.",
    "Sandboxes keep running when the daemon stops or restarts; it adopts them on start.",
)

DAEMON_SIGNALS: tuple[tuple[str, str], ...] = (
    (
        "SIGHUP",
        "reload the configuration (`systemctl reload ironclawd`): `daemon.log_level` and the agent"
        " log limits apply at once; other tables take effect on restart (a warning names them)",
    ),
    ("SIGTERM", "stop serving and exit 0; sandboxes keep running and are adopted on start"),
)

DAEMON_EXIT_STATUS: tuple[tuple[int, str], ...] = (
    (0, "a clean stop (SIGTERM), or `--check-config` found the file valid"),
    (1, "a runtime error (the journal says which)"),
    (78, "invalid configuration (`EX_CONFIG`; the unit does not restart on it)"),
)

DAEMON_ENVIRONMENT: tuple[tuple[str, str], ...] = (
    (
        "CREDENTIALS_DIRECTORY",
        "systemd's credentials (`LoadCredential=`): `master.key` and provider keys are read here"
        " first, then from `/etc/ironclaw/credentials`",
    ),
    ("NOTIFY_SOCKET", "set by systemd: readiness, status, reload and stop are reported there"),
)

DAEMON_FILES: tuple[tuple[str, str], ...] = (
    ("/etc/ironclaw/ironclawd.toml", "the configuration (ironclawd.toml(5))"),
    (
        "/etc/ironclaw/credentials/",
        "0600 root files, one per credential; `master.key` is made on first start",
    ),
    ("/etc/ironclaw/skills.d/trusted/*.pub", "minisign keys whose signatures a skill may carry"),
    ("/var/lib/ironclaw/", "state database, wrapped keys, queues, bundles, audit log"),
    ("/run/ironclaw/admin.sock", "the admin socket (group `ironclaw-admin`)"),
    ("/usr/lib/ironclaw/agent/", "the frozen in-box agent"),
    ("/usr/share/ironclaw/agent-rootfs/", "files of the agent's root filesystem"),
)

DAEMON_SEE_ALSO = ("ironctl(1)", "ironclawd.toml(5)", "systemctl(1)", "journalctl(1)", "runsc(8)")

TOML_DESCRIPTION = (
    "`/etc/ironclaw/ironclawd.toml` configures ironclawd(8). It is TOML; every key is optional."
    " An unknown key or a bad value stops the daemon before it binds anything, and the journal"
    " names the key. `ironclawd --check-config [--config PATH]` validates a file without"
    " starting anything.",
    "Tables: `[gateway]`, `[daemon]`, `[admin]`, `[sandbox]`, `[sockets]`, `[egress]`, `[mcp]`,"
    " `[queues]`, one `[agents.NAME]` per agent, and `[[channels]]`, an array of tables."
    " Changes take effect on restart; `daemon.log_level` and the agent log limits also on"
    " reload.",
)

TOML_EXAMPLE = """\
[daemon]
log_level = "debug"

[agents.demo]
provider = "anthropic"
model = "claude-sonnet-4-5"
credential = "anthropic"

[[channels]]
name = "hooks"
type = "webhook"
listen = "127.0.0.1:8787"
endpoints = [{ name = "ci", secret_credential = "ci-hook" }]"""

TOML_SEE_ALSO = ("ironclawd(8)", "ironctl(1)")
