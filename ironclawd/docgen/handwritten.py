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
    (
        ec.PERMISSION,
        "permission denied: not in `ironclaw-admin` (join it, then log in again), or refused by"
        " a policy (four-eyes, an approver group, an agent's permissions), or `--by` naming"
        " someone else; `skill verify`: signed by a key other than `--pubkey`",
    ),
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

# A first session, after the examples of ironctl --help.
CTL_TOUR = (
    "ironctl doctor                                  # can this host run sandboxes?",
    "ironctl session create --agent demo --json      # a sandboxed session; note its sid",
    "ironctl chat SID                                # talk to the agent",
    "ironctl change pending                          # what the agent (or a colleague) asked for",
    "ironctl change show ID                          # the diff a decision is about",
    "ironctl change approve ID                       # or: ironctl change reject ID --note WHY",
    "ironctl audit verify                            # the tamper-evident record of all of it",
    "ironctl session stop SID && ironctl session rm SID",
)

CTL_ERRORS = (
    "With `--json`, errors are printed on standard output as one line,"
    ' `{"error": {"code": "PERMISSION_DENIED", "message": "...", "exit": 4}}`, and nothing on'
    " standard error. `code` is the daemon's gRPC status name (the offline commands use the"
    " same names for the same failures), or one of ironctl's own: `USAGE` (exit 2; `--json`"
    " anywhere before `--`, or an abbreviation argparse accepts, is honoured even for usage"
    " errors), `NO_EDITOR` (exit 2, no `VISUAL` or `EDITOR` to open), `AMBIGUOUS_METHOD` and"
    " `UNSUPPORTED_METHOD` (exit 2, `api call`), `INVALID_INPUT` (exit 7: standard input,"
    " `--persona-file` or the edited text not UTF-8, `--persona-file` unreadable, or `api"
    " call`'s request JSON not of the method's type), `NO_REPLY` (exit 1, `send`/`chat`: the"
    " daemon closed the reply stream before the reply came; the message stays queued),"
    " `NOT_CONFIRMED` (exit 1, `change approve`/`reject` not confirmed), `EDIT_ABORTED` and"
    " `EDITOR_FAILED` (exit 1, the editor's text empty or unchanged, or the editor failed),"
    " `CALLER_MISMATCH` (exit 4, `--by` names someone else), `UNKNOWN_METHOD` and"
    " `UNKNOWN_SYMBOL` (exit 5, `api`), `BAD_SIGNATURE` (exit 10) and `MALFORMED_REPORT`"
    " (exit 11), and `IRONCTL_INTERNAL` (exit 9). Without `--json` an error is one line on"
    " standard error.",
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
    (
        "VISUAL, EDITOR",
        "the editor `change submit --kind persona` without `--persona` opens on a terminal"
        " (VISUAL first; either may carry arguments)",
    ),
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
        "reload the configuration (`systemctl reload ironclawd`): `daemon.log_level`, the agent"
        " log limits, `[pool]` and the bounds of a session's replies (`[queues]` `max_rows`,"
        " `max_ingested_bytes`, `max_replies_per_message`) apply at once; every other change"
        " takes effect on restart (a warning names each table or `[daemon]` key that waits)",
    ),
    ("SIGTERM", "stop serving and exit 0; sandboxes keep running and are adopted on start"),
)

# {field}: the journal field message_ids.message_id() sets (named once, there).
DAEMON_JOURNAL = (
    "ironclawd logs to the journal (`journalctl -u ironclawd`). The events an operator acts on"
    " carry a fixed `{field}`, listed below: `journalctl {field}=ID` finds every"
    " occurrence whatever the wording, and `journalctl -x` shows each one's explanation and what"
    " to do, from `/usr/lib/systemd/catalog/ironclaw.catalog`. Entries name the session, change,"
    " agent or channel in fields of their own (`IRONCLAW_SID`, `IRONCLAW_CHANGE`, ...)."
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
    ("/usr/lib/systemd/catalog/ironclaw.catalog", "the journal's explanations of its events"),
)

DAEMON_SEE_ALSO = ("ironctl(1)", "ironclawd.toml(5)", "systemctl(1)", "journalctl(1)", "runsc(8)")

TOML_DESCRIPTION = (
    "`/etc/ironclaw/ironclawd.toml` configures ironclawd(8). It is TOML; every key is optional."
    " An unknown key or a bad value stops the daemon before it binds anything, and the journal"
    " names the key. `ironclawd --check-config [--config PATH]` validates a file without"
    " starting anything.",
    "Tables: `[gateway]`, `[daemon]`, `[admin]`, `[sandbox]`, `[sockets]`, `[egress]`, `[mcp]`,"
    " `[queues]`, `[pool]`, one `[agents.NAME]` per agent, and `[[channels]]`, an array of"
    " tables. Changes take effect on restart; `daemon.log_level`, the agent log limits, `[pool]`"
    " and `[queues]` `max_rows`, `max_ingested_bytes` and `max_replies_per_message` also on"
    " reload (the journal names whatever else waits for a restart).",
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

# More than a command's --help says, shown below its description (keys: its words after
# "ironctl"; a unit test fails for a key that is no command).
CTL_NOTES: dict[str, str] = {
    "doctor": "Exit 0 only if every required check passes; each failure comes with a fix hint.",
    "mcp add": (
        "A stdio server is probed in its own hardened unit, without network and without its"
        " credentials; a remote one (`--url`) through the egress broker's checks, with its"
        " credentials (only root may send ones not yet approved for that URL). The `mcp`"
        " register change then submitted shows in its diff the command or URL, the environment"
        " (credential names only), the network and every tool with its description and"
        " schema. Arguments that start with `-` go in one quoted word with the"
        " command (`--command '/opt/mcp/bin/mcp-server-time --local-timezone UTC'`, split as a"
        " shell would). See [docs/mcp.md](mcp.md)."
    ),
    "mcp grant": (
        "Replaces the agent's grants of server NAME; no TOOL revokes them all. Each grant is"
        " pinned to the tool's definition as registered."
    ),
    "mcp list": "The agent's registered servers and granted tools, as the approver saw them.",
    "channel list": (
        "The configured channels (`[[channels]]`: Matrix, signed webhooks): connected or not,"
        " where, last error. See [docs/channels.md](channels.md)."
    ),
    "channel show": (
        "Also the adapter's counters, deliveries by state and the newest failed or retrying ones"
        " (delivery id, attempts, error)."
    ),
    "channel test": "Logs in, binds and reads the channel's credentials; sends nothing.",
    "channel held": (
        'Messages from senders an agent\'s permissions hold (`unknown = "hold"`), and messages'
        " the daemon failed to take 5 times: id, channel, room or endpoint, sender identity,"
        " text (escapes made visible)."
    ),
    "channel admit": "Audited as `channel.admitted`.",
    "channel drop": "Audited as `channel.dropped`.",
    "containment verify": (
        "Offline: checks the report's minisign signature by the trusted key, then its format,"
        " prints its table and a verdict line. See [docs/containment-report.md]"
        "(containment-report.md)."
    ),
    "package list": (
        "Dependencies included: version, architecture, `.deb` SHA-256 and size, requested or"
        " dependency."
    ),
    "package add": (
        "Submits a `packages` change with the agent's requested names plus these; the daemon"
        " resolves them with apt and holds the change (its diff lists every `.deb` with its"
        " hash). See [docs/packages.md](packages.md)."
    ),
    "package remove": "Submits a `packages` change with the agent's requested names less these.",
    "wiring list": (
        "Routes: channel, room or webhook endpoint, when the agent engages (`always`, `mention`,"
        " `pattern REGEX`), how sessions form, where webhook replies go. They change only by an"
        " approved `wiring` change: `ironctl change submit --kind wiring --agent A --payload"
        ' \'{"routes": [{"channel": "chat", "where": "!room:example.org",'
        ' "engage": "mention"}]}\'`. See [docs/channels.md](channels.md).'
    ),
    "permissions show": (
        "Who may talk to the agent (channel identities such as `chat:@alice:example.org`, host"
        " `user:`/`group:` entries for `ironctl send`), what happens to an unknown sender"
        " (`drop` or `hold`), and which host group decides which change kind for it. They change"
        ' only by an approved `permissions` change (`--kind permissions --payload \'{"allow":'
        ' [...], "unknown": "hold", "approvers": {"wiring": "netops"}}\'`).'
    ),
    "skill add": (
        "Reads the folder, checks its form here, and submits a `skills` change carrying every"
        " file and `SKILL.minisig`; the daemon verifies the signature against"
        " `/etc/ironclaw/skills.d/trusted/*.pub` and holds the change for a human (its diff"
        " lists the signer, every file's hash and every grant). See [docs/skills.md](skills.md)."
    ),
    "skill remove": "Removes the skill and exactly the grants it brought.",
    "skill show": (
        "Description, signer, manifest digest, grants, each file's path, size and SHA-256."
    ),
    "skill sign": (
        "Offline: writes `PATH/SKILL.minisig` with an unencrypted minisign key (`minisign -G -W`);"
        " `minisign -V` accepts it over the manifest."
    ),
    "skill manifest": "Offline: to sign with `minisign -S` yourself.",
    "skill verify": "Offline.",
}
